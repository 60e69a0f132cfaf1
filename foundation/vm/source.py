"""A disk as the guest saw it at the snapshot, read without stopping the guest.

After the snapshot the chain is base <- overlay(k) <- overlay(k+1): the
guest writes only into overlay(k+1), so overlay(k) and everything below it
are frozen and hold exactly the disk at the snapshot. The day's changes
are the clusters allocated in overlay(k) alone. Reads go by a map of the
whole frozen chain: every extent QEMU places on the host (an uncompressed cluster of a qcow2 layer, a raw
layer) is read straight from its file at that offset, into the caller's
buffer and around the page cache when aligned, and extents that read as
zeros are never read. Only what QEMU alone can decode (compressed
clusters, other formats) is read through `qemu-nbd --read-only` over the
frozen chain, started only then. Reading a 2 GiB qcow2 base through NBD
cost a first run a fifth of its CPU time; a night started qemu-nbd just to
read the partition table.

A night's overlay(k) is read through the page cache (`shared`): QEMU's
merge reads the same clusters at the same time, through the cache unless
the disk bypasses it (cache='none' or 'directsync'), and one read from the
disk then serves both; around the cache each was read twice, and the
night's reads and writes queued behind the merge's (benchmarks/README.md,
wave 16). The base, which the merge writes but never reads, stays around
the cache.
"""

import bisect
import concurrent.futures

from foundation.image import qemuimg
from foundation.image.source import RawSource


class SnapshotSource:
    """`read`/`readinto` of the frozen image `top` (overlay(k), or the base on a first run).

    `changed` lists the (offset, length) runs allocated in `top` alone when
    `top` is an overlay (the day's writes); it is None when `top` is the base.
    `holes()` names what reads as zeros through the whole chain (a
    whole-disk read skips it).
    """

    def __init__(self, top, top_format, base, base_format, size=None, shared=False):
        """`size` None: the disk's virtual size is the one the chain's `info` gives for the top (one
        `qemu-img info` less a night), or for a raw top `qemu-img info`'s. `shared`: `top` is read
        through the page cache (QEMU reads it too, through the cache)."""
        self.top, self.top_format, self.size = top, top_format, size
        self.shared = shared
        self.base = base
        self.base_raw = base_format == "raw"
        self._ext = []          # (start, end, file | None, host offset | None, zero), sorted
        self.changed = None
        layers = []             # the chain's `info`, top first: the disk's size comes with it
        if top != base:
            # First, and alone: opened without -U, it is refused if anything still writes `top` (the
            # error to report), and the chain's map below takes `top`'s extents from it (read once).
            self.changed = _merge([(s, s + n) for s, n, _, _ in qemuimg.layer_map(top)])
        # (a chain qcow2.py does not read: qemu-img's map and info side by side, each mostly process start)
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            chain = qemuimg.chain_map(top, top_format, pool, layers) if top_format != "raw" else []
        self._ext = [(s, s + n, f, off, z) for s, n, f, off, z in chain]
        if self.size is None:
            self.size = (layers[0] if layers else qemuimg.info(top, top_format))["virtual-size"]
        self._starts = [e[0] for e in self._ext]
        self._files = {}
        self._nbd = None

    _parallel = None

    @property
    def parallel_reads(self):
        """Whether readinto may run in two threads at once: when every byte comes straight from a
        file (pread has no file position), never through qemu-nbd's one connection. The files
        are opened here, before two readers could each open one."""
        if self._parallel is None:
            ok = self.direct
            if ok:
                for _, _, path, _, _ in self._ext:
                    if path is not None:
                        self._file(path)
                if self.base_raw:
                    self._file(self.base)
            self._parallel = ok
        return self._parallel

    # -- byte sources ---------------------------------------------------

    def _file(self, path):
        f = self._files.get(path)
        if f is None:
            f = self._files[path] = RawSource(path, direct=not (self.shared and path == self.top))
        return f

    def _pread(self, path, offset, view):
        got = self._file(path).readinto(offset, view)
        if got < len(view):      # a raw file shorter than the disk reads as zeros beyond its end
            view[got:] = bytes(len(view) - got)

    def _chain(self, offset, view):
        """Read through QEMU's view of the whole frozen chain (started on first use)."""
        if self._nbd is None:
            from foundation.image.nbd import QemuNbd

            self._nbd = QemuNbd(self.top, self.top_format)
        self._nbd.client.read_into(offset, view)

    def _below(self, offset, view):
        """A range no mapped extent covers."""
        if self.base_raw and (self.top != self.base or self.top_format == "raw"):
            self._pread(self.base, offset, view)
        else:
            self._chain(offset, view)

    @property
    def direct(self):
        """True if every byte is read straight from a file at a mapped offset or known as zeros:
        `qemu-nbd` (which opens the chain in QEMU's way, with its locks) is never started."""
        gaps_ok = self.base_raw and (self.top != self.base or self.top_format == "raw")   # as _below
        pos = 0
        for s, e, path, _, zero in self._ext:
            if (s > pos and not gaps_ok) or (path is None and not zero):
                return False
            pos = max(pos, e)
        return pos >= self.size or gaps_ok

    # -- the interface write_image reads through -------------------------

    def holes(self):
        """Runs known to read as zeros (never read by write_image)."""
        return [(s, e - s) for s, e, _, _, zero in self._ext if zero]

    def read(self, offset, length):
        end = min(offset + length, self.size)
        out = bytearray(max(0, end - offset))
        self.readinto(offset, memoryview(out))
        return bytes(out)

    def readinto(self, offset, view):
        """Fill `view` from `offset` -> bytes filled (fewer only at the end of the disk)."""
        end = min(offset + len(view), self.size)
        if offset >= end:
            return 0
        view = view[:end - offset]
        pos = offset
        i = max(bisect.bisect_right(self._starts, pos) - 1, 0)
        while pos < end:
            if i < len(self._ext) and self._ext[i][1] <= pos:
                i += 1
                continue
            if i >= len(self._ext) or self._ext[i][0] >= end:
                self._below(pos, view[pos - offset:])
                break
            s, e, path, off, zero = self._ext[i]
            if s > pos:
                self._below(pos, view[pos - offset:s - offset])
                pos = s
            n = min(e, end) - pos
            part = view[pos - offset:pos - offset + n]
            if zero:
                part[:] = bytes(n)
            elif path is not None:
                self._pread(path, off + (pos - s), part)
            else:
                self._chain(pos, part)
            pos += n
            i += 1
        return end - offset

    def close(self):
        for f in self._files.values():
            f.close()
        self._files.clear()
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
