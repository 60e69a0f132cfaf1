"""XFS (v5) log replay in memory: a crash-consistent day shown as the guest saw it.

No library replays the XFS log, and libfsxfs reads the file system as the
disk holds it, so this module does what the kernel's xfs_log_recover.c
does, into a dict instead of onto the disk: find the log head (where the
cycle stamped on every 512-byte block drops) and the tail (the last
record header says where it is), walk the records from tail to head
(checking each record's CRC and putting back the first word of every
block, which the writer replaced by its cycle), gather the operations of
each transaction, and replay only the transactions whose commit record
was written. Replayed: buffer items (the logged 128-byte chunks, unless
a later cancel record covers the buffer, or the block's own v5 LSN says
it was written after), inode items (the logged core converted from the
writer's byte order to the on-disk dinode, the data and attribute forks,
the CRC recomputed) and inode-chunk creation (ICREATE). Items that do
not change what a reader sees are skipped: the free/rmap/refcount
intents and done items, quota, the unlinked-list pointers of inode
buffers. What this module cannot replay faithfully (a v4 log, a log
written by a big-endian host, a bad CRC before the last records, an
unfinished block-mapping or exchange intent, an inode owner change)
raises LogError: the caller shows the disk as it lies and says so.

A record whose CRC fails among the last eight before the head, or a block
there the crash left unwritten (log writes in flight finish out of
order), is a write torn by the crash, as the kernel treats it: the log
ends before it. Left as the log leaves them, as no reader sees them: the
superblock's free counters and the inodes on the unlinked lists, which
the kernel recounts and frees at mount.
"""

import struct
from collections import Counter

try:
    import google_crc32c
except ImportError:          # an install from before the XFS log was replayed: one log line per dirty XFS
    google_crc32c = None

BB = 512
RECORD_MAGIC = 0xFEEDBABE
CYCLE_DATA = 32 << 10        # bytes of record data whose first words one header block saves
TORN = 8                     # records in flight at a crash (XLOG_MAX_ICLOGS): a bad CRC there is a torn write
MAX_RECORD = 256 << 10       # the largest log record (XLOG_MAX_RECORD_BSIZE)
START, COMMIT, CONTINUE, WAS_CONT, END, UNMOUNT = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
TRANS_MAGIC = 0x5452414E     # "TRAN"
MAX_REGIONS = 257            # XLOG_MAX_REGIONS_IN_ITEM
LI_INODE, LI_BUF, LI_ICREATE = 0x123B, 0x123C, 0x123F
LI_BUI, LI_BUD, LI_XMI, LI_XMD = 0x1244, 0x1245, 0x1248, 0x1249
BLF_INODE_BUF, BLF_CANCEL, BLF_DQUOT = 0x1, 0x2, 0x4 | 0x8 | 0x10
ILOG_DBROOT, ILOG_DEV, ILOG_ABROOT, ILOG_OWNER = 0x8, 0x10, 0x100, 0x200 | 0x400
ILOG_DFORK, ILOG_AFORK = 0x2 | 0x4 | 0x8, 0x40 | 0x80 | 0x100     # data, extents or btree root
DIFLAG2_BIGTIME, DIFLAG2_NREXT64 = 1 << 3, 1 << 4
INCOMPAT_META_UUID = 1 << 2
NULL_LSN = 0xFFFFFFFFFFFFFFFF

# v5 metadata blocks: magic -> (offset of the LSN, of the CRC, of the UUID), as xlog_recover_get_buf_lsn
# reads them and the write verifiers stamp them. The CRC covers the buffer with the CRC field zeroed.
_SHORT_BTREE = (24, 52, 32)        # free space by block and size, rmap, refcount, inode, free inode
_META32 = {
    **dict.fromkeys((0x41423342, 0x41423343, 0x524D4233, 0x52334643, 0x46494233, 0x49414233), _SHORT_BTREE),
    0x424D4133: (32, 64, 40),                     # bmap btree (long pointers)
    0x58414746: (208, 216, 64),                   # AGF
    0x58414749: (320, 312, 296),                  # AGI
    0x5841464C: (24, 32, 8),                      # AGFL
    0x58534C4D: (48, 12, 16),                     # symlink
    **dict.fromkeys((0x58444233, 0x58444433, 0x58444633), (16, 4, 24)),   # dir3 block, data, free
    0x58465342: (240, 224, 248),                  # superblock (sb_uuid or sb_meta_uuid, see _meta)
}
_META16 = dict.fromkeys((0x3DF1, 0x3DFF, 0x3BEE, 0x3EBE), (24, 12, 32))   # dir3 leaf1/leafn, attr3 leaf, da3 node


class LogError(Exception):
    """The log cannot be replayed faithfully; the file system is shown as the disk holds it."""


def _crc(data):
    return google_crc32c.value(bytes(data))


def _stamp_crc(buf, off, length):
    """Recompute the little-endian CRC32C at buf[off] over buf[:length] with that field zeroed."""
    buf[off:off + 4] = b"\0\0\0\0"
    struct.pack_into("<I", buf, off, _crc(buf[:length]))


class Geometry:
    """What replay needs of the superblock."""

    def __init__(self, sb):
        if sb[:4] != b"XFSB":
            raise LogError("no XFS superblock")
        self.blocksize, = struct.unpack_from(">I", sb, 4)
        self.logstart, = struct.unpack_from(">Q", sb, 48)
        self.agblocks, = struct.unpack_from(">I", sb, 84)
        self.logblocks, = struct.unpack_from(">I", sb, 96)
        self.version = struct.unpack_from(">H", sb, 100)[0] & 0xF
        self.sectsize, self.inodesize = struct.unpack_from(">HH", sb, 102)
        self.inopblog, self.agblklog = sb[123], sb[124]
        incompat, = struct.unpack_from(">I", sb, 216)
        if (self.blocksize not in [1 << n for n in range(9, 17)] or self.inodesize not in (256, 512, 1024, 2048)
                or self.sectsize not in [1 << n for n in range(9, 16)] or not 0 < self.agblklog < 32):
            raise LogError("the superblock's geometry is implausible")
        self.uuid = sb[248:264] if self.version == 5 and incompat & INCOMPAT_META_UUID else sb[32:48]

    def agblock_daddr(self, agno, agbno):
        return (agno * self.agblocks + agbno) * (self.blocksize // BB)

    def log_offset(self):
        lo = self.logstart
        return self.agblock_daddr(lo >> self.agblklog, lo & ((1 << self.agblklog) - 1)) * BB


class Image:
    """The file system with the replayed blocks laid over it: {fs block: bytearray}."""

    def __init__(self, read, bs):
        self.read, self.bs, self.blocks = read, bs, {}

    def _block(self, b):
        if b not in self.blocks:
            data = self.read(b * self.bs, self.bs)
            if len(data) != self.bs:
                raise LogError(f"a logged buffer lies beyond the end of the file system (block {b})")
            self.blocks[b] = bytearray(data)
        return self.blocks[b]

    def get(self, daddr, nbb):
        off, end = daddr * BB, (daddr + nbb) * BB
        out = bytearray()
        for b in range(off // self.bs, (end - 1) // self.bs + 1):
            blk = self.blocks.get(b)
            out += blk if blk is not None else self.read(b * self.bs, self.bs)
        s = off - off // self.bs * self.bs
        return out[s:s + end - off]

    def put(self, daddr, data):
        off = daddr * BB
        for b in range(off // self.bs, (off + len(data) - 1) // self.bs + 1):
            blk = self._block(b)
            s, e = max(b * self.bs, off), min((b + 1) * self.bs, off + len(data))
            blk[s - b * self.bs:e - b * self.bs] = data[s - off:e - off]


class Record:
    """One log record: where it starts, its header fields, and its data with the cycle words put back."""

    def __init__(self, blk, hdr, hblks, raw):
        self.blk, self.hblks = blk, hblks
        _, self.cycle, self.version, self.length, self.lsn, self.tail_lsn = struct.unpack_from(">IIiiQQ", hdr, 0)
        self.nops, = struct.unpack_from(">i", hdr, 40)
        self.fmt, = struct.unpack_from(">i", hdr, 300)
        self.nbb = -(-self.length // BB)
        self.hdr, self.raw = hdr, raw

    def end(self):
        return self.blk + self.hblks + self.nbb

    def crc_ok(self):
        want, = struct.unpack_from("<I", self.hdr, 32)
        head = bytearray(self.hdr[:BB])
        head[32:36] = b"\0\0\0\0"
        ext = b"".join(self.hdr[j * BB:j * BB + 260] for j in range(1, -(-self.length // CYCLE_DATA)))
        body = ext + self.raw[:self.length]
        # x86-64 checksums 328 header bytes, i386 324: the kernel accepts either
        return any(google_crc32c.extend(_crc(head[:n]), body) == want for n in (328, 324))

    def data(self):
        buf = bytearray(self.raw[:self.nbb * BB])
        for i in range(self.nbb):
            j, k = divmod(i, CYCLE_DATA // BB)
            at = (44 if j == 0 else j * BB + 4) + 4 * k
            buf[i * BB:i * BB + 4] = self.hdr[at:at + 4]
        return bytes(buf[:self.length])


class Log:
    """The internal log of one XFS: 512-byte blocks, addressed modulo its length."""

    def __init__(self, read, geo):
        self.read, self.base = read, geo.log_offset()
        self.crc = geo.version == 5
        self.nbb = geo.logblocks * geo.blocksize // BB

    def blocks(self, i, n):
        i %= self.nbb
        out = b""
        while n > 0:
            k = min(n, self.nbb - i)
            data = self.read(self.base + i * BB, k * BB)
            if len(data) != k * BB:
                raise LogError("the log lies beyond the end of the file system")
            out += data
            n -= k
            i = 0
        return out

    def cycle(self, i):
        # A record header keeps its cycle in its second word; every other block in its first.
        word, hcycle = struct.unpack_from(">II", self.blocks(i, 1), 0)
        return hcycle if word == RECORD_MAGIC else word

    def head(self):
        """The block after the last one written, as xlog_find_head finds it: a binary search for
        where the cycle drops, then back to the first block of the last few records' span that
        the crash left unwritten (log writes in flight complete out of order)."""
        first, last = self.cycle(0), self.cycle(self.nbb - 1)
        if first == last:
            head, cycle = self.nbb, last  # written all round with one cycle: the head is at the wrap
        else:
            lo, hi = 0, self.nbb - 1      # cycle(lo) == first, cycle(hi) == last: find the first block of `last`
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if self.cycle(mid) == first:
                    lo = mid
                else:
                    hi = mid
            head, cycle = hi, first
        span = min(self.nbb, TORN * MAX_RECORD // BB)
        window = self.blocks(head - span, span)
        for i in range(span):
            b = head - span + i           # below 0: the end of the log, written in the previous pass
            word, hcycle = struct.unpack_from(">II", window, i * BB)
            if (hcycle if word == RECORD_MAGIC else word) != (cycle if b >= 0 else cycle - 1):
                return b % self.nbb
        return head % self.nbb

    def record(self, blk):
        hdr = self.blocks(blk, 1)
        magic, = struct.unpack_from(">I", hdr, 0)
        version, length = struct.unpack_from(">ii", hdr, 8)
        size, = struct.unpack_from(">i", hdr, 320)
        if magic != RECORD_MAGIC or version not in (1, 2) or not 0 < length <= 1 << 20:
            return None
        hblks = -(-size // CYCLE_DATA) if version == 2 and size > CYCLE_DATA else 1
        if -(-length // CYCLE_DATA) > hblks:
            return None              # more data than its header blocks have cycle words for
        if hblks > 1:
            hdr = self.blocks(blk, hblks)
        return Record(blk % self.nbb, hdr, hblks, self.blocks(blk + hblks, -(-length // BB)))

    def last_record(self, head):
        """The last record header before head, or None (a record is at most MAX_RECORD long)."""
        for back in range(1, min(self.nbb, 2 * MAX_RECORD // BB) + 1):
            blk = (head - back) % self.nbb
            if struct.unpack_from(">I", self.blocks(blk, 1), 0)[0] == RECORD_MAGIC:
                return self.record(blk)
        return None

    def records(self):
        """The records from tail to head, the head moved back before a torn write; [] if the log is clean."""
        head = self.head()
        for _ in range(4 * TORN):
            last = self.last_record(head)
            if last is None:
                raise LogError("no log record header in the log")
            if last.end() % self.nbb != head:
                head = last.blk          # the last record was not written whole
                continue
            if last.nops == 1 and last.length >= 12 and last.data()[9] & UNMOUNT:
                return []                # unmounted cleanly
            tail, cycle = (last.tail_lsn & 0xFFFFFFFF) % self.nbb, last.tail_lsn >> 32
            recs, blk = [], tail
            while blk != head:
                r = self.record(blk)
                if r is None or r.cycle != cycle:
                    raise LogError(f"no log record of cycle {cycle} at block {blk} between the tail and the head")
                recs.append(r)
                if len(recs) > self.nbb:
                    raise LogError("the log's records do not lead from its tail to its head")
                if r.end() >= self.nbb:
                    cycle += 1           # the log wrapped
                blk = r.end() % self.nbb
            bad = next((i for i, r in enumerate(recs) if self.crc and not r.crc_ok()), None)
            if bad is None:
                return recs
            if len(recs) - bad > TORN:
                raise LogError(f"the log record at block {recs[bad].blk} fails its CRC")
            head = recs[bad].blk         # torn by the crash: the log ends before it
        raise LogError("cannot find a consistent log head")


class Transaction:
    """The items of one transaction: each a list of regions, the first its format structure."""

    def __init__(self, lsn):
        self.lsn, self.header, self.items, self.totals = lsn, None, [], []

    def add(self, region):
        if self.header is None:
            if len(region) >= 4 and struct.unpack_from("<I", region, 0)[0] != TRANS_MAGIC:
                raise LogError("a transaction does not start with a transaction header")
            self.header = bytearray(region)
            return
        if not self.items or len(self.items[-1]) == self.totals[-1]:
            if len(region) < 4:
                raise LogError("a log item is shorter than its format header")
            total, = struct.unpack_from("<H", region, 2)
            if not 0 < total <= MAX_REGIONS:
                raise LogError(f"a log item claims {total} regions")
            self.items.append([])
            self.totals.append(total)
        self.items[-1].append(bytearray(region))

    def extend(self, region):
        if not self.items:
            self.header += region
        else:
            self.items[-1][-1] += region


def transactions(recs):
    """The committed transactions of the records, in commit order (xlog_recover_process_data)."""
    if recs and any(r.fmt != 1 for r in recs):
        raise LogError("the log was written by a big-endian host; only little-endian logs are replayed")
    live, done = {}, []
    for r in recs:
        data, off = r.data(), 0
        for _ in range(r.nops):
            if off + 12 > len(data):
                raise LogError(f"the log record at block {r.blk} ends inside an operation header")
            tid, length, client, flags = struct.unpack_from(">IiBB", data, off)
            off += 12
            if client not in (0x69, 0xAA) or length < 0 or off + length > len(data):
                raise LogError(f"a bad operation header in the log record at block {r.blk}")
            region = data[off:off + length]
            off += length
            t = live.get(tid)
            if t is None:
                if flags & START:
                    live[tid] = Transaction(r.lsn)
                continue                 # else the rest of a transaction that began before the tail
            flags &= ~END
            if flags & WAS_CONT:
                flags &= ~CONTINUE
            if flags in (0, CONTINUE):
                t.add(region)
            elif flags == WAS_CONT:
                t.extend(region)
            elif flags == COMMIT:
                done.append(t)
                del live[tid]
            elif flags == UNMOUNT:
                del live[tid]
            else:
                raise LogError(f"bad operation flags {flags:#x} in the log record at block {r.blk}")
    return done


def _u16(b, off=0):
    return struct.unpack_from("<H", b, off)[0]


def _order(items):
    """xlog_recover_reorder_trans: buffers and chunk creation first, then inodes and the rest,
    then inode-buffer (unlinked list) items, then cancel records."""
    head, mid, ibufs, cancels = [], [], [], []
    for regions in items:
        kind = _u16(regions[0])
        if kind == LI_BUF:
            flags = _u16(regions[0], 4)
            (cancels if flags & BLF_CANCEL else ibufs if flags & BLF_INODE_BUF else head).append(regions)
        elif kind == LI_ICREATE:
            head.append(regions)
        else:
            mid.append(regions)
    return head + mid + ibufs + cancels


def _buf_key(fmt):
    flags, length = struct.unpack_from("<HH", fmt, 4)
    blkno, = struct.unpack_from("<q", fmt, 8)
    return flags, blkno, length


class Replayer:
    """Pass 2 of recovery over an Image, with pass 1's count of cancelled buffers."""

    def __init__(self, geo, image, cancelled):
        self.geo, self.image, self.cancelled = geo, image, cancelled

    def buffer(self, regions, lsn):
        flags, blkno, length = _buf_key(regions[0])
        key = (blkno, length)
        if flags & BLF_CANCEL:
            self.cancelled[key] -= 1     # later logs of this buffer are replayed again
            return
        if self.cancelled[key] > 0 or flags & (BLF_INODE_BUF | BLF_DQUOT):
            return                       # freed later; unlinked-list pointers and quota: no reader sees them
        buf = self.image.get(blkno, length)
        meta = self._meta(buf)
        if meta:
            disk_lsn, = struct.unpack_from(">Q", buf, meta[0])
            if disk_lsn and disk_lsn != NULL_LSN and disk_lsn >= lsn:
                return                   # the block on disk is newer than this change
        fmt = regions[0]
        map_size, = struct.unpack_from("<I", fmt, 16)
        bits = int.from_bytes(fmt[20:20 + 4 * map_size], "little")
        bit, i = 0, 1
        while bits >> bit:
            if not bits >> bit & 1:
                bit += 1
                continue
            run = 0
            while bits >> (bit + run) & 1:
                run += 1
            if i >= len(regions):
                raise LogError(f"a buffer item for block {blkno} has fewer regions than its bitmap")
            run = min(run, len(regions[i]) // 128)   # a run split across regions (a page boundary)
            if run == 0 or (bit + run) * 128 > len(buf):
                raise LogError(f"a buffer item for block {blkno} does not fit its buffer")
            buf[bit * 128:(bit + run) * 128] = regions[i][:run * 128]
            i += 1
            bit += run
        meta = self._meta(buf)
        if meta:
            struct.pack_into(">Q", buf, meta[0], lsn)
            _stamp_crc(buf, meta[1], self.geo.sectsize if buf[:4] in (b"XFSB", b"XAGF", b"XAGI", b"XAFL")
                       else len(buf))
        self.image.put(blkno, buf)

    def _meta(self, buf):
        """(LSN offset, CRC offset) of a v5 metadata block of this file system, else None."""
        if len(buf) < 264:
            return None
        m = _META32.get(struct.unpack_from(">I", buf, 0)[0]) or _META16.get(struct.unpack_from(">H", buf, 8)[0])
        if m is None:
            return None
        uuids = (buf[32:48], buf[248:264]) if buf[:4] == b"XFSB" else (buf[m[2]:m[2] + 16],)
        if self.geo.uuid not in uuids:
            return None                  # not of this file system: replayed as it is (kernel: recover immediately)
        return m[:2]

    def inode(self, regions, lsn):
        fmt = regions[0]
        if len(fmt) == 56:
            fields, asize, dsize = struct.unpack_from("<IHH", fmt, 4)
            rdev, = struct.unpack_from("<I", fmt, 24)
            blkno, length, boff = struct.unpack_from("<qii", fmt, 40)
        elif len(fmt) == 52:             # logged by a 32-bit kernel: no padding
            fields, asize, dsize = struct.unpack_from("<IHH", fmt, 4)
            rdev, = struct.unpack_from("<I", fmt, 20)
            blkno, length, boff = struct.unpack_from("<qii", fmt, 36)
        else:
            raise LogError(f"an inode item of {len(fmt)} bytes")
        if self.cancelled[(blkno, length)] > 0 or len(regions) < 2:
            return
        if fields & ILOG_OWNER:
            raise LogError("an inode item changes the owner of a fork's blocks (swapext), which is not replayed")
        buf = self.image.get(blkno, length)
        isz = self.geo.inodesize
        if not 0 <= boff <= len(buf) - isz:
            raise LogError(f"an inode item points outside its inode buffer (block {blkno})")
        dip = buf[boff:boff + isz]
        log = regions[1]
        if dip[:2] != b"IN" or len(log) < 96 or _u16(log) != 0x494E:
            raise LogError(f"an inode item for inode buffer {blkno} whose inode has no magic number")
        if log[4] >= 3:
            if len(log) < 176:
                raise LogError("a v3 inode item without the v3 core")
            disk_lsn, = struct.unpack_from(">Q", dip, 112)
            if disk_lsn and disk_lsn != NULL_LSN and disk_lsn > lsn:
                return                   # the inode on disk is newer than this change
        _core(log, dip, lsn)
        lit = 176 if dip[4] >= 3 else 100
        forkoff = dip[82] * 8
        dfork = forkoff or isz - lit
        r = 2
        if fields & ILOG_DEV:
            struct.pack_into(">I", dip, lit, rdev)
        if fields & ILOG_DFORK and len(regions) > r:
            _fork(regions[r], fields & ILOG_DBROOT, dip, lit, dfork)
            r += 1
        if fields & ILOG_AFORK and len(regions) > r:
            _fork(regions[r], fields & ILOG_ABROOT, dip, lit + forkoff, isz - lit - forkoff)
        if dip[4] >= 3:
            _stamp_crc(dip, 100, isz)
        buf[boff:boff + isz] = dip
        self.image.put(blkno, buf)

    def icreate(self, regions):
        """Initialise a new inode chunk, as xfs_ialloc_inode_init does (all of it, unless a buffer
        of it was cancelled later)."""
        agno, agbno, count, isize, length, gen = struct.unpack_from(">IIIIII", regions[0], 4)
        g = self.geo
        if isize != g.inodesize or length <= 0 or count != length * g.blocksize // isize:
            raise LogError("an inode-chunk creation item that does not match the file system")
        per = max(1, 8192 * (isize // 256) // g.blocksize) if g.version == 5 else 1
        bbs = per * g.blocksize // BB
        clusters = [g.agblock_daddr(agno, agbno + i) for i in range(0, length, per)]
        if any(self.cancelled[(d, bbs)] > 0 for d in clusters):
            return
        ipb = g.blocksize // isize
        for b in range(length):
            blk = bytearray(g.blocksize)
            for j in range(ipb):
                dip = memoryview(blk)[j * isize:(j + 1) * isize]
                struct.pack_into(">HHBB", dip, 0, 0x494E, 0, 3 if g.version == 5 else 2, 0)
                struct.pack_into(">II", dip, 92, gen, 0xFFFFFFFF)
                if g.version == 5:
                    ino = (agno << (g.agblklog + g.inopblog)) | ((agbno + b) << g.inopblog) | j
                    struct.pack_into(">Q", dip, 152, ino)
                    dip[160:176] = g.uuid
                    d = bytearray(dip)
                    _stamp_crc(d, 100, isize)
                    dip[:] = d
            self.image.put(g.agblock_daddr(agno, agbno + b), blk)


# The log dinode is the on-disk dinode in the writer's (little-endian) byte order: (offset, size) of the
# fields every version keeps; timestamps, extent counters and the v3 fields are handled apart.
_CORE = ((0, 2), (2, 2), (6, 2), (8, 4), (12, 4), (16, 4), (20, 2), (22, 2), (56, 8), (64, 8), (72, 4),
         (84, 4), (88, 2), (90, 2), (92, 4))
_V3 = ((104, 8), (120, 8), (128, 4), (152, 8))
_SIZES = {1: "B", 2: "H", 4: "I", 8: "Q"}


def _core(log, dip, lsn):
    """xfs_log_dinode_to_disk: the logged core into dip (big-endian), next-unlinked kept."""
    for off, n in _CORE:
        struct.pack_into(">" + _SIZES[n], dip, off, struct.unpack_from("<" + _SIZES[n], log, off)[0])
    dip[4:6] = log[4:6]                  # version, format
    dip[82:84] = log[82:84]              # forkoff, aformat
    v3 = log[4] >= 3
    flags2 = struct.unpack_from("<Q", log, 120)[0] if v3 else 0
    times = (32, 40, 48, 144) if v3 else (32, 40, 48)
    for off in times:
        if flags2 & DIFLAG2_BIGTIME:
            struct.pack_into(">Q", dip, off, struct.unpack_from("<Q", log, off)[0])
        else:
            struct.pack_into(">ii", dip, off, *struct.unpack_from("<ii", log, off))
    if flags2 & DIFLAG2_NREXT64:
        struct.pack_into(">QIH", dip, 24, struct.unpack_from("<Q", log, 24)[0], 0, 0)
        struct.pack_into(">IH", dip, 76, struct.unpack_from("<I", log, 76)[0], 0)
    else:
        struct.pack_into(">IH", dip, 76, *struct.unpack_from("<IH", log, 76))
    if v3:
        for off, n in _V3:
            struct.pack_into(">" + _SIZES[n], dip, off, struct.unpack_from("<" + _SIZES[n], log, off)[0])
        if not flags2 & DIFLAG2_NREXT64:
            dip[24:32] = bytes(8)
        struct.pack_into(">Q", dip, 112, lsn)
        dip[132:144] = bytes(12)
        dip[160:176] = log[160:176]
    else:
        dip[24:30] = bytes(6)
        struct.pack_into(">H", dip, 30, _u16(log, 30))


def _fork(region, broot, dip, at, room):
    """A logged fork into the dinode at `at` (room bytes): inline data and extents as they are; a
    btree root converted from its in-memory block form to the on-disk bmdr form (xfs_bmbt_to_bmdr)."""
    if not broot:
        if len(region) > room:
            raise LogError("a logged inode fork is larger than the inode's room for it")
        dip[at:at + len(region)] = region
        return
    hdr = 72 if region[:4] == b"BMA3" else 24
    numrecs, = struct.unpack_from(">H", region, 6)
    src_max = (len(region) - hdr) // 16
    dst_max = (room - 4) // 16
    if numrecs > min(src_max, dst_max):
        raise LogError("a logged btree root holds more records than the inode has room for")
    out = bytearray(room)
    out[0:4] = region[4:8]               # level, numrecs
    out[4:4 + 8 * numrecs] = region[hdr:hdr + 8 * numrecs]
    p = hdr + 8 * src_max
    out[4 + 8 * dst_max:4 + 8 * dst_max + 8 * numrecs] = region[p:p + 8 * numrecs]
    dip[at:at + room] = out


def _unfinished_intents(trans):
    """Block-mapping (BUI) and exchange (XMI) intents logged without their done item: the kernel
    would finish them at mount and change files, which this module does not do."""
    open_ids = {}
    for t in trans:
        for regions in t.items:
            kind, fmt = _u16(regions[0]), regions[0]
            if kind in (LI_BUI, LI_XMI) and len(fmt) >= 16:
                open_ids[struct.unpack_from("<Q", fmt, 8)[0]] = kind
            elif kind in (LI_BUD, LI_XMD) and len(fmt) >= 16:
                open_ids.pop(struct.unpack_from("<Q", fmt, 8)[0], None)
    return sorted({"BUI" if k == LI_BUI else "XMI" for k in open_ids.values()})


def replay(read, sb):
    """{fs block: bytes} the log's committed transactions write ({} for a clean log).

    read(offset, n) reads the file system; sb is its first sector. Raises
    LogError with the reason when the log cannot be replayed faithfully.
    """
    if google_crc32c is None:
        raise LogError("replaying the XFS log needs google-crc32c: pip install 'foundation[fuse]'")
    geo = Geometry(sb)
    if geo.logstart == 0:
        raise LogError("the log is on an external device, which is not archived with this disk")
    recs = Log(read, geo).records()
    if not recs:
        return {}
    if geo.version != 5:
        raise LogError("the log of a v4 XFS is not replayed")
    trans = transactions(recs)
    pending = _unfinished_intents(trans)
    if pending:
        raise LogError(f"the log holds unfinished {' and '.join(pending)} intents, which are not replayed")
    cancelled = Counter()
    for t in trans:
        for regions in t.items:
            if _u16(regions[0]) == LI_BUF:
                flags, blkno, length = _buf_key(regions[0])
                if flags & BLF_CANCEL:
                    cancelled[(blkno, length)] += 1
    image = Image(read, geo.blocksize)
    rp = Replayer(geo, image, cancelled)
    for t in trans:
        for regions in _order(t.items):
            kind = _u16(regions[0])
            if kind == LI_BUF:
                rp.buffer(regions, t.lsn)
            elif kind == LI_INODE:
                rp.inode(regions, t.lsn)
            elif kind == LI_ICREATE:
                rp.icreate(regions)
    return {b: bytes(d) for b, d in image.blocks.items()}
