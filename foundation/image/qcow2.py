"""The map of a qcow2 layer and of a frozen chain, read from the images' own headers and tables.

A night's archive needs three answers about the frozen chain: which
clusters overlay(k) alone holds (the day's writes), where every guest
byte lies on the host through the whole chain, and the disk's size. They
are in each layer's header and L1/L2 tables (a few hundred KiB for a
2 GiB disk), which this module reads directly instead of starting
`qemu-img` three times (a process start each: 25-58 ms of a night, cold).
It reads only the plain case: qcow2 version 2 or 3 without encryption,
external data file, extended L2 entries or any other incompatible
feature, backing files named by a path with a known format, raw files at
the bottom. Anything else raises Unsupported, and the caller asks
`qemu-img` as before (qemuimg.layer_map, qemuimg.chain_map): an image
this reader does not fully understand is never guessed at.

A layer mapped *with the lock* is checked as `qemu-img map` without `-U`
checks it: QEMU's image locking (byte-range OFD locks at 100 + permission,
200 + permission not shared) is applied the same way, and a process
holding the write permission (QEMU still writing the layer) makes the map
fail with Busy (qemuimg.layer_map reports it as LayerBusy), so a layer
that is not really frozen is never archived. This module imports nothing
of qemuimg: qemuimg asks it first and turns its answers into the errors
the user reads.
"""

import fcntl
import os
import struct

MAGIC = b"QFI\xfb"
OFFSET = 0x00fffffffffffe00     # host offset bits of L1 and L2 entries (bits 9-55)
COMPRESSED = 1 << 62
ZERO = 1                        # L2 entry bit 0, version 3: the cluster reads as zeros
RESERVED = 0x3f000000000001fe   # bits 1-8 and 56-61 of a standard L2 entry: must be zero
EXT_BACKING_FORMAT = 0xE2792ACA
EXT_END = 0
# QEMU's file locking (block/file-posix.c): a byte per permission held, a byte per permission not shared
LOCK_PERM, LOCK_SHARED = 100, 200
PERM_CONSISTENT_READ, PERM_WRITE = 0, 1      # bit numbers of BLK_PERM_CONSISTENT_READ, BLK_PERM_WRITE
MAX_L1 = 1 << 22                # entries (32 MiB of L1): more is not a disk this reader is for


class Unsupported(Exception):
    """Not the plain case this reader handles: ask qemu-img instead."""


class Busy(Exception):
    """A process holds the layer's write permission (QEMU still writes it): arg 0 is its path."""


def _be(data, fmt, off):
    return struct.unpack_from(fmt, data, off)


class Image:
    """One qcow2 file's header: its size, cluster size, L1 table and backing file."""

    def __init__(self, path, fd):
        self.path, self.fd = path, fd
        h = os.pread(fd, 4096, 0)
        if len(h) < 72 or h[:4] != MAGIC:
            raise Unsupported(f"{path}: not a qcow2 image")
        (version, back_off, back_len, self.cluster_bits, self.size, crypt, l1_size, l1_off) = \
            _be(h, ">IQIIQIIQ", 4)
        if version not in (2, 3) or crypt or not 9 <= self.cluster_bits <= 21:
            raise Unsupported(f"{path}: qcow2 version {version}, encryption {crypt}, cluster bits "
                              f"{self.cluster_bits}")
        ext_at = 72
        self.v3 = version == 3
        if self.v3:
            if len(h) < 104:
                raise Unsupported(f"{path}: short header")
            incompatible, = _be(h, ">Q", 72)
            header_len, = _be(h, ">I", 100)
            if incompatible:   # dirty, corrupt, external data file, compression type, extended L2...
                raise Unsupported(f"{path}: incompatible features {incompatible:#x}")
            ext_at = header_len
        self.cluster = 1 << self.cluster_bits
        if l1_size > MAX_L1 or l1_off % self.cluster:
            raise Unsupported(f"{path}: L1 table of {l1_size} entries at {l1_off}")
        self.l1 = struct.unpack(f">{l1_size}Q", os.pread(fd, 8 * l1_size, l1_off)) if l1_size else ()
        if len(self.l1) != l1_size:
            raise Unsupported(f"{path}: short L1 table")
        self.backing, self.backing_format = None, None
        if back_off:
            name = os.pread(fd, back_len, back_off)
            if len(name) != back_len or not name:
                raise Unsupported(f"{path}: unreadable backing file name")
            self.backing = name.decode("utf-8", "surrogateescape")
            if self.backing.startswith("json:") or ":" in self.backing.split("/", 1)[0]:
                raise Unsupported(f"{path}: backing {self.backing!r} is not a plain path")
            if not self.backing.startswith("/"):     # as QEMU does: relative to the image's directory
                self.backing = os.path.join(os.path.dirname(os.path.abspath(path)), self.backing)
            self.backing_format = self._extension(ext_at, EXT_BACKING_FORMAT)
            if self.backing_format is None:
                raise Unsupported(f"{path}: backing format not recorded (QEMU would probe it)")

    def _extension(self, at, want):
        """The text of header extension `want`, or None."""
        data = os.pread(self.fd, self.cluster - at if at < self.cluster else 0, at)
        pos = 0
        while pos + 8 <= len(data):
            kind, n = _be(data, ">II", pos)
            if kind == EXT_END:
                return None
            if kind == want:
                return data[pos + 8:pos + 8 + n].decode()
            pos += 8 + (n + 7) // 8 * 8
        return None

    def extents(self):
        """[(start, end, host offset | None, zero)] of the clusters this file holds (compressed: offset
        None, not zero), in guest order, adjacent ones joined; the rest falls through to the backing."""
        cb, cs, size, v3 = self.cluster_bits, self.cluster, self.size, self.v3
        per = cs // 8                      # L2 entries per table
        out = []
        # the run being grown: guest start and end, host offset (None: zeros or compressed), zeros;
        # `expect` is the L2 entry that would extend it (a data run's next cluster, flags alike)
        rs = re = roff = rzero = None
        expect = -1
        for i, e in enumerate(self.l1):
            l2 = e & OFFSET
            if not l2:
                continue
            if l2 % cs:
                raise Unsupported(f"{self.path}: L2 table at unaligned offset {l2}")
            raw = os.pread(self.fd, cs, l2)
            if len(raw) != cs:
                raise Unsupported(f"{self.path}: short L2 table at {l2}")
            base = i * per << cb
            for j, x in enumerate(struct.unpack(f">{per}Q", raw)):
                if x == expect and re == base + (j << cb):    # the next cluster of a data run: most of a disk
                    re += cs
                    expect += cs
                    continue
                if not x:
                    continue
                s = base + (j << cb)
                if s >= size:
                    break
                if x & COMPRESSED:
                    off, zero = None, False
                else:
                    host = x & OFFSET
                    zero = bool(x & ZERO)
                    if x & RESERVED or (zero and not v3):
                        raise Unsupported(f"{self.path}: reserved bits in L2 entry {x:#x}")
                    if not host and not zero:
                        continue               # unallocated: the backing file's
                    if host % cs:
                        raise Unsupported(f"{self.path}: unaligned cluster at {host}")
                    off = None if zero else host
                if re == s and rzero == zero and off is None and roff is None:
                    re += cs                   # zeros after zeros (or compressed after compressed)
                    continue
                if rs is not None:
                    out.append((rs, min(re, size), roff, rzero))
                rs, re, roff, rzero = s, s + cs, off, zero
                expect = x + cs if off is not None else -1
        if rs is not None:
            out.append((rs, min(re, size), roff, rzero))
        return out


EXTENDED_L2 = 1 << 4  # incompatible feature bit (version 3): subclusters


def layer_options(path):
    """The `qemu-img create -o` options of a layer over qcow2 `path` that libvirt would give the
    overlay of a snapshot: the same cluster size, and extended L2 entries if it has them; ""
    where the header cannot be read (qemu-img's defaults)."""
    try:
        with open(path, "rb") as f:
            h = f.read(80)
    except OSError:
        return ""
    if len(h) < 72 or h[:4] != MAGIC:
        return ""
    version, bits = _be(h, ">I", 4)[0], _be(h, ">I", 20)[0]
    if not 9 <= bits <= 21:
        return ""
    opts = f"cluster_size={1 << bits}"
    if version == 3 and len(h) >= 80 and _be(h, ">Q", 72)[0] & EXTENDED_L2:
        opts += ",extended_l2=on"
    return opts


def _open(path, lock):
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if lock:
            _lock(path, fd)
        return fd
    except BaseException:
        os.close(fd)
        raise


def _lock(path, fd):
    """QEMU's locks of a reader that does not share the write permission (qemu-img map without -U):
    held on `fd` until it is closed; Busy if a process holds the write permission."""
    for byte in (LOCK_PERM + PERM_CONSISTENT_READ, LOCK_SHARED + PERM_WRITE):
        try:
            fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack("hhqqi", fcntl.F_RDLCK, os.SEEK_SET, byte, 1, 0))
        except OSError:          # someone holds it exclusively: QEMU never does; be safe
            raise Busy(path) from None
    # no one may hold the write permission, nor refuse to share the consistent read this reader holds
    for byte in (LOCK_PERM + PERM_WRITE, LOCK_SHARED + PERM_CONSISTENT_READ):
        got = fcntl.fcntl(fd, fcntl.F_OFD_GETLK, struct.pack("hhqqi", fcntl.F_WRLCK, os.SEEK_SET, byte, 1, 0))
        if struct.unpack("hhqqi", got)[0] != fcntl.F_UNLCK:
            raise Busy(path)


def layer_map(path, lock=True):
    """What `qemu-img map` of the layer alone (`"backing": null`) lists as present: [(start, length,
    offset | None, zero)]. With `lock`, fails with Busy if a process still writes it."""
    fd = _open(path, lock)
    try:
        stamp = _stamp(fd) if lock else None
        ext = Image(path, fd).extents()
        if lock:        # chain_map of the same frozen layer, right after, takes them (see _extents)
            _AHEAD[path] = (stamp, ext)
        return [(s, e - s, off, zero) for s, e, off, zero in ext]
    finally:
        os.close(fd)


def chain_map(path, layers_out=None):
    """The frozen chain's map as qemuimg.chain_map gives it: [(start, length, file | None, offset |
    None, zero)] covering the whole disk; `layers_out` receives {"filename", "format",
    "virtual-size"} of each layer, top first."""
    fds, layers = [], []
    try:
        p, fmt = path, "qcow2"
        while p is not None:
            if len(layers) >= 16:
                raise Unsupported(f"{path}: a chain of more than 16 layers")
            if fmt == "raw":
                fd = os.open(p, os.O_RDONLY | os.O_CLOEXEC)
                fds.append(fd)
                layers.append((p, "raw", os.fstat(fd).st_size, fd, None))
                break
            if fmt != "qcow2":
                raise Unsupported(f"{p}: format {fmt}")
            fd = os.open(p, os.O_RDONLY | os.O_CLOEXEC)
            fds.append(fd)
            img = Image(p, fd)
            layers.append((p, "qcow2", img.size, fd, img))
            p, fmt = img.backing, img.backing_format
        size = layers[0][2]
        # top down: each layer fills what the layers above left open, within its own size
        gaps = [(0, size)]
        out = []
        for name, fmt, lsize, fd, img in layers:
            if not gaps:
                break
            # beyond a layer's own size the guest reads zeros: layers below it are not asked
            out.extend((max(s, lsize), e, None, None, True) for s, e in gaps if e > lsize)
            gaps = [(s, min(e, lsize)) for s, e in gaps if s < lsize]
            if img is not None:
                have = [(s, e, name if off is not None else None, off, zero) for s, e, off, zero in _extents(img)]
            else:
                have = _raw_extents(name, fd, lsize)
            left = []
            k = 0
            for gs, ge in gaps:
                pos = gs
                while k < len(have) and have[k][1] <= gs:
                    k += 1
                j = k
                while j < len(have) and have[j][0] < ge:
                    s, e, f, off, zero = have[j]
                    s2, e2 = max(s, gs), min(e, ge)
                    if s2 > pos:
                        left.append((pos, s2))
                    out.append((s2, e2, f, None if off is None else off + (s2 - s), zero))
                    pos = e2
                    j += 1
                if pos < ge:
                    left.append((pos, ge))
            gaps = left
        out.extend((s, e, None, None, True) for s, e in gaps)   # below every layer: zeros
        out.sort()
        if layers_out is not None:
            layers_out.extend({"filename": n, "format": f, "virtual-size": s} for n, f, s, _, _ in layers)
        return _joined(out)
    finally:
        for fd in fds:
            os.close(fd)


# A frozen layer's extents read before chain_map reads the chain: path -> (stamp, extents), taken
# once by chain_map if the file's stamp is still the same. Put there by prefetch (the layers below
# the top, while libvirt takes the snapshot) and by layer_map with the lock (a night maps
# overlay(k) so, then the chain above which it is the top: its tables are read once).
_AHEAD = {}


def _stamp(fd):
    """What changes when a file is written: its identity, size, modification and change times."""
    st = os.fstat(fd)
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def _extents(img):
    """img.extents(), or what prefetch or layer_map read of it before if the file is unchanged since."""
    hit = _AHEAD.pop(img.path, None)
    if hit is not None and hit[0] == _stamp(img.fd):
        return hit[1]
    return img.extents()


def _raw_extents(name, fd, size):
    """A raw layer: data where the file has data (SEEK_DATA/SEEK_HOLE), zeros in its holes."""
    out, pos = [], 0
    while pos < size:
        try:
            d = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError:          # ENXIO: nothing but a hole to the end
            d = size
        d = min(d, size)
        if d > pos:
            out.append((pos, d, None, None, True))
        if d >= size:
            break
        h = min(os.lseek(fd, d, os.SEEK_HOLE), size)
        out.append((d, h, name, d, False))
        pos = h
    return out


def _joined(ext):
    """Adjacent extents of one kind joined (file and offset contiguous, or both zeros)."""
    out = []
    for s, e, f, off, zero in ext:
        if out:
            ps, pe, pf, poff, pz = out[-1]
            if pe == s and pz == zero and pf == f and (
                    (off is None and poff is None) or (off is not None and poff is not None and poff + pe - ps == off)):
                out[-1] = (ps, e, pf, poff, pz)
                continue
        out.append((s, e, f, off, zero))
    return [(s, e - s, f, off, zero) for s, e, f, off, zero in out]


def prefetch(path, fmt="qcow2"):
    """Ask the kernel for the headers and tables chain_map(path) will read, through the chain (a
    hint for a cold cache, given while something else waits; every error ignored). `path` may
    still be written (the top before a snapshot), the layers below it are not (a backing file is
    read-only to QEMU until a commit into it): their extents are read now and kept for chain_map,
    which uses them only if the file's stamp is still the one taken before they were read."""
    try:
        for i in range(16):
            if fmt != "qcow2":
                return
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                stamp = _stamp(fd) if i else None
                img = Image(path, fd)
                for e in img.l1:
                    if e & OFFSET:
                        os.posix_fadvise(fd, e & OFFSET, img.cluster, os.POSIX_FADV_WILLNEED)
                if i:
                    _AHEAD[path] = (stamp, img.extents())
            finally:
                os.close(fd)
            if img.backing is None:
                return
            path, fmt = img.backing, img.backing_format
    except (OSError, Unsupported, struct.error):
        pass
