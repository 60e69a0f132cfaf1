"""Image files to archive: raw files are read directly, everything else through QEMU.

A raw file (or block device) is read with large pread calls, and its holes
(SEEK_HOLE) are known zeros that are never read at all. Aligned reads go
around the page cache (O_DIRECT): the disk writes straight into the
caller's buffer, instead of into the cache and then a copy of it (a tenth
of a day 0's CPU time), and the kernel's read-ahead does not zero-fill the
holes between the extents read; the archiver reads ahead itself. Any other format
(qcow2 with its backing chain and compressed clusters, vmdk, ...) is
served by `qemu-nbd --read-only` on a private unix socket and read over NBD
(foundation.image.nbd); its known-zero ranges come from `qemu-img map`.
We chose NBD over converting to a temporary raw file because a day with
`--changed` reads only the changed ranges (3 % of the image, not all of it)
and needs no scratch space the size of the disk; and over the FUSE export
of qemu-storage-daemon because it needs neither /dev/fuse nor a mount.

The format is probed with `qemu-img info` unless given. Probing trusts the
first bytes of the file: a raw image whose guest wrote a qcow2 header at
sector 0 would be read as qcow2, so the archiver, which knows its formats,
always passes one.
"""

import errno
import json
import os
import stat

from foundation.errors import BadInput
from foundation.image import qemuimg
from foundation.image import ranges as R


class ImageUnreadable(BadInput):
    """Cannot read the image {}: {}"""

    code = 33


def _qemu_img(args, path):
    """qemu-img's JSON answer about the image at path; its failure said as ImageUnreadable."""
    try:
        return qemuimg.run_json(args, path)
    except qemuimg.QemuImgFailed as e:
        raise ImageUnreadable(path, e.args[1]) from None


def probe(path, fmt=None):
    """-> (format, virtual size) of an image file, as QEMU sees it."""
    args = ["info", "--output=json", "-U"]
    if fmt:
        args += ["-f", fmt]
    info = _qemu_img(args + [path], path)
    return info.get("format", fmt), int(info["virtual-size"])


# `qemu-img check` exit statuses: 0 clean, 1 the check itself failed, 2 corrupt,
# 3 only leaked clusters (harmless to a reader), 63 the format has no checks.
_CHECK_OK = (0, 3, 63)


def check(path, fmt):
    """Refuse an image any layer of whose chain QEMU finds damaged, before a block is stored.

    QEMU reads a cluster that lies past the end of a truncated qcow2 as
    zeros; imported, those zeros would become a day's data with exit 0.
    `qemu-img check` reads only the metadata (tables and refcounts), so the
    cost is small next to reading the image.
    """
    chain = _qemu_img(["info", "--output=json", "--backing-chain", "-U", "-f", fmt, path], path)
    for layer in chain if isinstance(chain, list) else [chain]:
        name, kind = layer.get("filename", path), layer.get("format", fmt)
        if kind != "raw":
            _check_layer(name, kind, path)


def _check_layer(layer, fmt, path):
    try:
        qemuimg.run(["check", "--output=json", "-U", "-f", fmt, layer], f"check {layer}", ok=_CHECK_OK)
        return
    except qemuimg.QemuImgFailed as e:
        if e.status is None:
            raise ImageUnreadable(path, e.args[1]) from None
        failure = e
    try:
        report = json.loads(failure.stdout)
    except json.JSONDecodeError:
        report = {}
    bad = report.get("corruptions", 0)
    failed = report.get("check-errors", 0)
    where = "" if layer == path else f" (in its backing file {layer})"
    if bad:
        why = f"qemu-img check finds {bad} corrupt cluster reference(s) (truncated or damaged {fmt} file)"
    elif failed:
        why = f"qemu-img check could not read {failed} metadata cluster(s) (truncated or damaged {fmt} file)"
    else:
        why = f"qemu-img check failed: {failure.args[1]}"
    raise ImageUnreadable(path, why + where + "; nothing was archived. Repair a copy with `qemu-img check -r all` "
                                      "or archive an intact image")


class RawSource:
    """A raw image file or block device, read with pread; `direct` False: never around the page
    cache (a file another process reads at the same time through it: one read serves both)."""

    format = "raw"
    parallel_reads = True  # readinto may run in several threads at once (pread has no file position)

    def __init__(self, path, direct=True):
        self.path = path
        try:
            self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            raise ImageUnreadable(path, e.strerror) from None
        st = os.fstat(self.fd)
        if stat.S_ISDIR(st.st_mode):
            os.close(self.fd)
            raise ImageUnreadable(path, "it is a directory")
        self.regular = stat.S_ISREG(st.st_mode)
        self.size = st.st_size if self.regular else os.lseek(self.fd, 0, os.SEEK_END)
        try:
            os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        except OSError:
            pass
        self.dfd = None
        if direct:
            try:  # not every file system takes it (tmpfs): then reads stay buffered
                self.dfd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_DIRECT)
            except (OSError, AttributeError):
                pass

    def read(self, offset, length):
        try:
            data = os.pread(self.fd, length, offset)
            if len(data) == length or not data:
                return data
            parts = [data]
            got = len(data)
            while got < length:
                more = os.pread(self.fd, length - got, offset + got)
                if not more:
                    break
                parts.append(more)
                got += len(more)
            return b"".join(parts)
        except OSError as e:
            raise ImageUnreadable(self.path, f"read at byte {offset} failed: {e.strerror}") from None

    direct = True  # False once the device refused an aligned O_DIRECT read

    def readinto(self, offset, view):
        got, n = 0, len(view)
        fd = self.fd
        if self.dfd is not None and self.direct and n and not (offset | n) % DIRECT_ALIGN and \
                _address(view) % DIRECT_ALIGN == 0:
            fd = self.dfd
        try:
            while got < n:
                try:
                    m = os.preadv(fd, [view[got:]], offset + got)
                except OSError as e:
                    if fd == self.fd or e.errno != errno.EINVAL:
                        raise
                    # The device wants another alignment: buffered from now on. Its descriptor
                    # stays open until close(): another thread's read may be using it.
                    self.direct = False
                    fd = self.fd
                    continue
                if m == 0:
                    break
                got += m
        except OSError as e:
            raise ImageUnreadable(self.path, f"read at byte {offset + got} failed: {e.strerror}") from None
        return got

    holes_within = True  # holes() takes the byte ranges it is asked about

    def holes(self, within=None):
        """Ranges that read as zero without being stored (SEEK_HOLE), or None; only those inside the
        (start, end) byte runs `within` when given (a later day asks about its changes alone, not
        about the whole disk: two seeks per extent of a large file)."""
        if not self.regular:
            return None
        spans = [(0, self.size)] if within is None else [(s, min(e, self.size)) for s, e in within]
        out = []
        try:
            for off, hi in spans:
                while off < hi:
                    try:
                        data = os.lseek(self.fd, off, os.SEEK_DATA)
                    except OSError as e:
                        if e.errno == errno.ENXIO:
                            out.append((off, hi - off))
                            break
                        raise
                    if data > off:
                        out.append((off, min(data, hi) - off))
                    if data >= hi:
                        break
                    off = os.lseek(self.fd, data, os.SEEK_HOLE)
        except OSError:
            return None
        return out

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        if self.dfd is not None:
            os.close(self.dfd)
            self.dfd = None


DIRECT_ALIGN = 4096  # offset, length and buffer address of a read that bypasses the page cache


def _address(view):
    """The address of a writable buffer's first byte."""
    import ctypes  # here: a day with no change reads nothing

    return ctypes.addressof(ctypes.c_char.from_buffer(view))


class QemuSource:
    """Any image format QEMU reads, served read-only over NBD by qemu-nbd."""

    def __init__(self, path, fmt, size):
        from foundation.image.nbd import NbdError, QemuNbd

        self.path, self.format, self.size = path, fmt, size
        self._NbdError = NbdError
        try:
            self.server = QemuNbd(os.path.abspath(path), fmt)
        except (OSError, NbdError) as e:
            raise ImageUnreadable(path, f"qemu-nbd cannot serve it: {e}") from None
        if self.server.client.size != size:
            self.close()
            raise ImageUnreadable(path, f"qemu-nbd serves {self.server.client.size} bytes, "
                                        f"qemu-img reported {size}")

    def read(self, offset, length):
        length = max(0, min(length, self.size - offset))
        try:
            return self.server.read(offset, length)
        except (OSError, self._NbdError) as e:
            raise ImageUnreadable(self.path, f"read at byte {offset} failed: {e}") from None

    def readinto(self, offset, view):
        n = max(0, min(len(view), self.size - offset))
        try:
            self.server.client.read_into(offset, view[:n])
        except (OSError, self._NbdError) as e:
            raise ImageUnreadable(self.path, f"read at byte {offset} failed: {e}") from None
        return n

    def holes(self):
        """Ranges the whole backing chain reads as zero, from `qemu-img map`."""
        entries = _qemu_img(["map", "--output=json", "-U", "-f", self.format, os.path.abspath(self.path)],
                            self.path)
        runs = R.merge((e["start"], e["start"] + e["length"]) for e in entries if e.get("zero"))
        return [(s, e - s) for s, e in runs]

    def close(self):
        s = getattr(self, "server", None)
        if s is not None:
            s.close()
            self.server = None


def open_image(path, fmt=None):
    """Open an image file for archiving -> a source with .size, .format, .read, .holes, .close."""
    return Opening(path, fmt).result()


class Opening:
    """open_image in two steps: the file is checked and its format probe started at once, and
    result() waits for the probe and opens the source, so that a caller opens its store while
    qemu-img starts. close() ends a probe never waited for."""

    def __init__(self, path, fmt=None):
        path = os.fspath(path)
        try:
            st = os.stat(path)
        except OSError as e:
            raise ImageUnreadable(path, e.strerror) from None
        if stat.S_ISDIR(st.st_mode):
            raise ImageUnreadable(path, "it is a directory")
        if not os.access(path, os.R_OK):
            raise ImageUnreadable(path, "permission denied")
        self.path, self.fmt = path, fmt
        self.probe = None
        if fmt != "raw":
            args = ["info", "--output=json", "-U"] + (["-f", fmt] if fmt else [])
            self.probe = qemuimg.Started(args + [path], path)

    def result(self):
        path, fmt = self.path, self.fmt
        if self.probe is not None:
            try:
                out = self.probe.result()
            except qemuimg.QemuImgFailed as e:
                raise ImageUnreadable(path, e.args[1]) from None
            finally:
                self.probe = None
            try:
                info = json.loads(out)
            except json.JSONDecodeError:
                raise ImageUnreadable(path, "qemu-img printed something that is not JSON") from None
            fmt, size = info.get("format", fmt), int(info["virtual-size"])
        if fmt == "raw":
            return RawSource(path)
        check(path, fmt)
        return QemuSource(path, fmt, size)

    def close(self):
        if self.probe is not None:
            self.probe.close()
            self.probe = None
