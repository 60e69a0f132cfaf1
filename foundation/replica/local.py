"""A replica in a local directory (`file:///path`): a NAS mount, a second disk, or the tests.

The directory must exist: an unmounted share must fail, not fill the
mount point on the local disk. A put writes `name.tmp-TOKEN`, fsyncs it,
renames it over `name` and fsyncs the directory, so a crash leaves the old
object or the new one; an interrupted put continues from the temporary's
size once its last bytes are seen to match.
"""

import contextlib
import errno
import os

from foundation.replica import registry
from foundation.replica.backend import (
    Backend, Permanent, RemoteFull, RemoteMissing, Transient,
    check_name, download, is_temp, read_chunks, span, temp_name)
from foundation.store.disk import fsync_dir

TAIL = 64 << 10     # bytes of an unfinished temporary compared with the source before resuming

_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
_TRANSIENT = (errno.EIO, errno.ESTALE, errno.ETIMEDOUT, errno.EHOSTDOWN, errno.EHOSTUNREACH,
              errno.ECONNRESET, errno.EINTR, errno.EAGAIN)


class LocalBackend(Backend):
    def __init__(self, spec):
        super().__init__()
        self.url = spec.url
        self.root = spec.path

    @contextlib.contextmanager
    def _errors(self, what):
        if not os.path.isdir(self.root):
            raise Permanent(self.url, f"directory {self.root} does not exist: mount the share or create "
                                      "the directory")
        try:
            yield
        except OSError as e:
            msg = f"{what}: {e.strerror or e}"
            if e.errno in _FULL:
                raise RemoteFull(self.url, msg) from e
            if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
                raise Permanent(self.url, f"{msg}: check that the directory is mounted read-write and "
                                          "writable by this user") from e
            if e.errno in _TRANSIENT:
                raise Transient(self.url, msg) from e
            raise Permanent(self.url, msg) from e

    def _path(self, name):
        return os.path.join(self.root, *check_name(name).split("/"))

    def put(self, name, path, offset=0, length=None, token="", progress=None):
        length = span(path, offset, length)
        final = self._path(name)
        tmp = os.path.join(self.root, *temp_name(name, token).split("/"))
        with self._errors(f"uploading {name}"):
            os.makedirs(os.path.dirname(final), exist_ok=True)
            skip = self._resumable(tmp, path, offset, length) if token else 0
            with open(tmp, "r+b" if skip else "wb") as f:
                f.seek(skip)
                f.truncate()
                for data in read_chunks(self, path, offset, length, skip, progress):
                    f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, final)
            fsync_dir(os.path.dirname(final))

    @staticmethod
    def _resumable(tmp, path, offset, length):
        """How much of the unfinished temporary `tmp` can be kept (0 if none)."""
        try:
            have = os.path.getsize(tmp)
        except FileNotFoundError:
            return 0
        if have > length:
            return 0
        n = min(have, TAIL)
        with open(tmp, "rb") as t, open(path, "rb") as s:
            t.seek(have - n)
            s.seek(offset + have - n)
            return have if t.read(n) == s.read(n) else 0

    def _open(self, name):
        try:
            return open(self._path(name), "rb")
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise RemoteMissing(self.url, name) from None

    def get(self, name, offset=0, length=None):
        with self._errors(f"reading {name}"):
            with self._open(name) as f:
                size = os.fstat(f.fileno()).st_size
                end = size if length is None else min(size, offset + length)
                f.seek(offset)
                out = bytearray()
                while offset + len(out) < end:
                    n = min(self._chunk_size(), end - offset - len(out))
                    self._pace(n)
                    out += f.read(n)
                self.received += len(out)
                return bytes(out)

    def get_file(self, name, path, progress=None):
        def fetch(write):
            with self._errors(f"downloading {name}"):
                with self._open(name) as src:
                    while data := src.read(self._chunk_size()):
                        self._pace(len(data))
                        self.received += len(data)
                        write(data)
        download(path, fetch, progress)

    def size(self, name):
        with self._errors(f"looking up {name}"):
            try:
                st = os.stat(self._path(name))
            except (FileNotFoundError, NotADirectoryError):
                return None
            return st.st_size if os.path.isfile(self._path(name)) else None

    def _walk(self, prefix):
        """(name, full path) of every file (temporaries too) whose name starts with prefix."""
        top = prefix.rpartition("/")[0]
        start = os.path.join(self.root, *top.split("/")) if top else self.root
        for d, dirs, files in os.walk(start):
            dirs.sort()
            rel = os.path.relpath(d, self.root).replace(os.sep, "/")
            for f in sorted(files):
                name = f if rel == "." else f"{rel}/{f}"
                if name.startswith(prefix):
                    yield name, os.path.join(d, f)

    def list(self, prefix=""):
        with self._errors("listing"):
            return {name: os.path.getsize(p) for name, p in self._walk(prefix) if not is_temp(name)}

    def delete(self, name):
        with self._errors(f"deleting {name}"):
            try:
                os.unlink(self._path(name))
            except FileNotFoundError:
                pass

    def cleanup(self, prefix=""):
        with self._errors("removing unfinished uploads"):
            temps = [p for name, p in self._walk(prefix) if is_temp(name)]
            for p in temps:
                os.unlink(p)
            return len(temps)


registry.register(LocalBackend, "file")
