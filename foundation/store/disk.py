"""All store I/O goes through one Disk, which counts what a USB disk would pay.

The store runs on one external disk, where a seek (13.6 ms on the paper's
USB drive) costs as much as 440 KB of transfer. Every read and write is
counted per structure, with a seek whenever an I/O does not start where the
previous one on the disk ended, so any run can be priced on the paper's
model (`model_seconds`) as well as timed on this machine.
"""

import errno
import fcntl
import json
import os
from collections import defaultdict

from foundation.errors import StoreDiskFailed, StoreFull, StoreReadOnly
from foundation.store import format as F

# What a file on a disk that was pulled, lazily unmounted or failed answers with.
DISK_GONE = (errno.EIO, errno.ENODEV, errno.ENXIO, errno.ENOENT, errno.ESTALE)

# The paper's disk (§5.1): Maxtor OneTouch III through the file system.
SEEK_S = 0.0136
READ_BPS = 32.2e6
WRITE_BPS = 26.5e6


class Counter:
    __slots__ = ("reads", "writes", "bytes_read", "bytes_written", "seeks")

    def __init__(self):
        self.reads = self.writes = self.bytes_read = self.bytes_written = self.seeks = 0

    def as_dict(self):
        return {k: getattr(self, k) for k in self.__slots__}


class Disk:
    def __init__(self, root):
        self.root = root
        self.io = defaultdict(Counter)
        self._pos = None  # (file id, start, end) of the last I/O

    def _count(self, what, fid, off, n, write):
        c = self.io[what]
        p = self._pos
        # Starting anywhere inside the previous transfer costs no seek: the
        # drive's track buffer (or the span we just read) holds it.
        if p is None or p[0] != fid or not p[1] <= off <= p[2]:
            c.seeks += 1
        self._pos = (fid, off, off + n)
        if write:
            c.writes += 1
            c.bytes_written += n
        else:
            c.reads += 1
            c.bytes_read += n

    def pread(self, fd, what, off, n):
        try:
            b = os.pread(fd, n, off)
        except OSError as e:
            raise self._error(e, what) from None
        self._count(what, fd, off, len(b), False)
        return b

    def pread_into(self, fd, what, off, buf):
        """Read into the writable buffer buf from off (a large read into a buffer the caller
        reuses: no fresh pages a read); -> the bytes read, fewer at the end of the file."""
        try:
            n = os.preadv(fd, [buf], off)
        except OSError as e:
            raise self._error(e, what) from None
        self._count(what, fd, off, n, False)
        return n

    def pwrite(self, fd, what, off, data):
        try:
            n = os.pwrite(fd, data, off)
            while n < len(data):
                n += os.pwrite(fd, memoryview(data)[n:], off + n)
        except OSError as e:
            raise self._error(e, what) from None
        self._count(what, fd, off, len(data), True)

    def count_read(self, what, fid, off, n):
        """Account a read done by someone else (mmap, a library)."""
        self._count(what, fid, off, n, False)

    def count_write(self, what, fid, off, n):
        self._count(what, fid, off, n, True)

    def _error(self, e, what):
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            return StoreFull(what)
        if e.errno in DISK_GONE:
            return StoreDiskFailed(self.root, f"{what}: {e.strerror}")
        return e

    def fsync(self, fd, what="sync"):
        try:
            os.fsync(fd)
        except OSError as e:
            raise self._error(e, what) from None

    def fdatasync(self, fd, what="sync"):
        """fsync for a file written in place: its bytes and whatever finds them (block
        allocation, size), without a journal commit for the mtime alone."""
        try:
            os.fdatasync(fd)
        except OSError as e:
            raise self._error(e, what) from None

    def reset(self):
        self.io.clear()
        self._pos = None

    def totals(self):
        t = Counter()
        for c in self.io.values():
            for k in Counter.__slots__:
                setattr(t, k, getattr(t, k) + getattr(c, k))
        return t

    def model_seconds(self):
        """Time this I/O would take on the paper's USB disk."""
        t = self.totals()
        return t.seeks * SEEK_S + t.bytes_read / READ_BPS + t.bytes_written / WRITE_BPS

    def report(self):
        d = {k: v.as_dict() for k, v in sorted(self.io.items())}
        d["total"] = self.totals().as_dict()
        d["model_seconds"] = self.model_seconds()
        return d


def failure(e, root):
    """The Error an OSError met anywhere under the store at `root` means for the user (the disk
    full, read-only, pulled or failing), or None if it is not about the store's disk."""
    name = os.path.abspath(e.filename) if isinstance(e.filename, str) else None
    if name is not None and not name.startswith(os.path.abspath(root) + os.sep):
        return None
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return StoreFull(os.path.basename(name or root))
    if e.errno == errno.EROFS:
        return StoreReadOnly(root, f"{name or root}: {e.strerror}")
    if e.errno == errno.ENOENT and os.path.exists(os.path.join(root, F.CONFIG)):
        return None  # the store is still there: a file it lacks is not a failed disk
    if e.errno in DISK_GONE:
        return StoreDiskFailed(root, f"{name or root}: {e.strerror}")
    return None


def fsync_dir(path):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_record(path):
    """A host record (a JSON object in a state file) -> dict; {} when it is absent or damaged:
    such files are only records, started again, never data."""
    try:
        with open(path, "rb") as f:
            d = json.loads(f.read())
        return d if isinstance(d, dict) else {}
    except (OSError, ValueError):
        return {}


def atomic_write(path, data, sync=True, mode=0o644, tmp=None, full=StoreFull):
    """Replace `path` with `data` so that a crash leaves the old or the new file, and a failure
    (a short write, no space) leaves the old file and no temporary one. No space raises `full`
    (the store's StoreFull; None: the OSError itself)."""
    tmp = tmp or path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if full and isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise full(os.path.basename(path)) from None
        raise
    if sync:
        fsync_dir(os.path.dirname(path) or ".")


def flock(path, how, busy, write_pid=False, mode=0o644, optional=False):
    """An flock (fcntl.LOCK_EX or LOCK_SH) on the file at path, without waiting -> its fd; close it to
    let go. The kernel drops it when its holder dies, so a crashed process never leaves a stale lock.
    `busy(text)` makes the error when another process holds it, text being the pid it wrote
    (`write_pid`) or "?". `optional`: None where the file cannot be made (a read-only disk)."""
    try:
        fd = os.open(path, (os.O_RDWR if write_pid else os.O_RDONLY) | os.O_CREAT, mode)
    except OSError:
        if optional:
            return None
        raise
    try:
        fcntl.flock(fd, how | fcntl.LOCK_NB)
    except BlockingIOError:
        who = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise busy(who) from None
    if write_pid:
        # Written over, then cut to length: a truncation to zero of a file holding data makes
        # ext4 flush it at close (auto_da_alloc), ~10 ms of every writer's start.
        pid = f"{os.getpid()}\n".encode()
        os.pwrite(fd, pid, 0)
        os.ftruncate(fd, len(pid))
    return fd
