"""A disk as the guest saw it at the snapshot, read without stopping the guest.

After the snapshot the chain is base <- overlay(k) <- overlay(k+1): the
guest writes only into overlay(k+1), so overlay(k) and everything below it
are frozen and hold exactly the disk at the snapshot. The day's changes
are the clusters allocated in overlay(k) alone; they are read straight from
the overlay file at the host offsets `qemu-img map` reports (a cluster the
guest wrote is never compressed). A read that falls outside them is served
from a raw base directly (raw is flat), and from anything else (a qcow2
base, its own backing chain, an odd cluster without an offset) by
`qemu-nbd --read-only` over the frozen chain, which resolves qcow2 for us.
"""

import bisect
import os

from foundation.image import qemuimg


class SnapshotSource:
    """`read(offset, length)` of the frozen image `top` (overlay(k), or the base on a first run).

    `changed` lists the (offset, length) runs allocated in `top` alone when
    `top` is an overlay (the day's writes); it is None when `top` is the base.
    With `full`, `holes()` maps the whole chain (a first, whole-disk read
    then skips what reads as zeros); otherwise it costs nothing.
    """

    def __init__(self, top, top_format, base, base_format, size, full=False):
        self.top, self.top_format, self.size = top, top_format, size
        self.full = full
        self.base = base
        self.base_raw = base_format == "raw"
        self._ext = []          # (start, end, host offset | None, zero), sorted
        self.changed = None
        if top != base:
            self._ext = [(s, s + n, off, z) for s, n, off, z in qemuimg.layer_map(top)]
            self.changed = _merge([(s, e) for s, e, _, _ in self._ext])
        self._starts = [e[0] for e in self._ext]
        self._fds = {}
        self._nbd = None

    # -- byte sources ---------------------------------------------------

    def _pread(self, path, offset, length):
        fd = self._fds.get(path)
        if fd is None:
            fd = self._fds[path] = os.open(path, os.O_RDONLY)
        data = os.pread(fd, length, offset)
        if len(data) < length:      # a raw file shorter than the disk reads as zeros beyond its end
            data += bytes(length - len(data))
        return data

    def _chain(self, offset, length):
        """Read through QEMU's view of the whole frozen chain (started on first use)."""
        if self._nbd is None:
            from foundation.image.nbd import QemuNbd

            self._nbd = QemuNbd(self.top, self.top_format)
        return bytes(self._nbd.read(offset, length))

    def _below(self, offset, length):
        """A range `top` itself does not hold."""
        if self.base_raw and (self.top != self.base or self.top_format == "raw"):
            return self._pread(self.base, offset, length)
        return self._chain(offset, length)

    # -- the interface write_image reads through -------------------------

    def holes(self):
        """Runs known to read as zeros (never read by write_image)."""
        if self.full:
            return qemuimg.zero_runs(self.top, self.top_format)
        return [(s, e - s) for s, e, _, zero in self._ext if zero]

    def read(self, offset, length):
        end = min(offset + length, self.size)
        if offset >= end:
            return b""
        if not self._ext:
            return self._below(offset, end - offset)
        parts = []
        pos = offset
        i = max(bisect.bisect_right(self._starts, pos) - 1, 0)
        while pos < end:
            if i < len(self._ext) and self._ext[i][1] <= pos:
                i += 1
                continue
            if i >= len(self._ext) or self._ext[i][0] >= end:
                parts.append(self._below(pos, end - pos))
                break
            s, e, off, zero = self._ext[i]
            if s > pos:
                parts.append(self._below(pos, s - pos))
                pos = s
            n = min(e, end) - pos
            if zero:
                parts.append(bytes(n))
            elif off is not None:
                parts.append(self._pread(self.top, off + (pos - s), n))
            else:
                parts.append(self._chain(pos, n))
            pos += n
            i += 1
        return b"".join(parts)

    def close(self):
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        if self._nbd is not None:
            self._nbd.close()
            self._nbd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _merge(runs):
    """Adjacent (start, end) runs joined, as (offset, length) pairs."""
    out = []
    for s, e in runs:
        if out and out[-1][1] == s:
            out[-1][1] = e
        else:
            out.append([s, e])
    return [(s, e - s) for s, e in out]
