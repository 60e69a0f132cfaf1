"""The arena log: the only primary data of the store.

Blocks are appended as self-describing records to the one open arena; when
it is full it is sealed with a trailer (a MAC over its records' tags, and a
chain MAC over every arena before it) and never changes again. Every sync
ends with a COMMIT record in the log and then writes one of the head's two
slots, alternately, so no single copy holds the commit point: the newest
valid slot is where a scan starts, and the log itself carries it forward
(sealed arenas that chain on, then the last commit record that verifies).
Records below the commit must verify, records past it are kept only while
they verify in order, so a torn tail is cut and no record is half-trusted.

While an image is archived (`write_behind`), packed records are written by
one writer thread, in the order they were packed, while the next batch is
packed: the log's bytes and their order are the same, and every seal,
sync, read and close first waits for the writes queued (a failed write
fails every later one, so nothing past it is ever committed). Those
writes go around the page cache (O_DIRECT) in whole pages: the partial
page at the end stays in memory, packed in front of the next batch, and
is written through the cache only when something must see the file (a
seal, sync, read or close). The kernel's copy into the cache and its
writeback cost more CPU than the compression's whole second core. A
sealed arena is made durable by a thread of its own as soon as its last
bytes are written (`SYNC_SEALED`), so the sync that commits a first
archive (~64 arenas) fsyncs the open arena only, not every arena of the
day one after another while nothing else runs.
"""

import bisect
import concurrent.futures
import contextlib
import errno
import logging
import mmap
import os
import struct
from collections import OrderedDict, deque, namedtuple

from foundation import native
from foundation.errors import DataCorrupt
from foundation.fields import Fields
from foundation.store import format as F
from foundation.store import layout as L
from foundation.store.disk import atomic_write, fsync_dir

log = logging.getLogger(__name__)

RH = L.HEADER_SIZE
_tag_at = struct.Struct(f"{L.TAG_SIZE}s").unpack_from   # a record header's tag, read in place
# Bytes of blocks packed per C call, and packed batches queued to the writer: each batch is a
# buffer of its own until written, so these two bound the write path's memory (~PACK_BYTES x
# (WRITE_QUEUE + 2)); 4 MiB keeps both cores busy in pack and the per-call cost small. One
# batch queued behind the one being packed is enough to keep the disk busy (an O_DIRECT write
# of 4 MiB takes ~5 ms here, its pack longer); a second one only held 4 MiB more (day 0 and a
# first archive cost the same CPU with 1 or 2).
PACK_BYTES = 4 << 20
WRITE_QUEUE = 1
SYNC_SEALED = True  # inside write_behind(), a sealed arena fsynced in the background (False: by sync())
PAGE = 4096  # O_DIRECT writes: offsets, lengths and buffers aligned to this


def _sync_file_range():
    """libc's sync_file_range(2), or None where there is none."""
    import ctypes  # here: only a write behind needs it, and every command's start would pay the import

    try:
        f = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    f.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    return f


_SYNC_FILE_RANGE = False  # looked up at the first write behind
SYNC_FILE_RANGE_WRITE = 2


def _writeback(fd, off, n):
    """Start writing a range of a file to the disk, without waiting (durability is still fsync's)."""
    global _SYNC_FILE_RANGE
    if _SYNC_FILE_RANGE is False:
        _SYNC_FILE_RANGE = _sync_file_range()
    if _SYNC_FILE_RANGE is not None:
        _SYNC_FILE_RANGE(fd, off, n, SYNC_FILE_RANGE_WRITE)
MAX_FDS = 64
AHEAD_BYTES = 64 << 20  # read_many asks the kernel for its spans at once up to this many bytes
WINDOW = 1 << 20  # read-ahead for sequential single-record reads
SPAN_GAP = 64 << 10  # batched reads merge records closer than this


class Commit(namedtuple("Commit", "generation arena end")):
    """The newest commit of a store: its number, and where it ends in the log. The generation goes
    up by one at every commit (sync, gc switch) and never down: a store that shows an older one
    than was seen before has been rolled back."""

    __slots__ = ()  # a value, as a frozen dataclass is (foundation/fields.py says why not one)

    @property
    def position(self):
        return F.addr(self.arena, self.end)


class Slot(Fields):
    """One copy of the head: its file name, the Head it holds (None if none), what is wrong with it."""

    def __init__(self, name, head, problem=None):
        self.name, self.head = name, head  # head: F.Head or None
        self.problem = problem  # "missing", or why it does not unpack


def read_slots(root, mac_key):
    """[Slot] of the head's copies (docs/format.md §6)."""
    out = []
    for name in F.HEADS:
        try:
            with open(os.path.join(root, name), "rb") as f:
                b = f.read(F.HEAD_SIZE + 1)
        except FileNotFoundError:
            out.append(Slot(name, None, "missing"))
            continue
        try:
            out.append(Slot(name, F.Head.unpack(b, mac_key)))
        except ValueError as e:
            out.append(Slot(name, None, f"damaged ({e})"))
    return out


def newest(slots):
    """The newest valid head among the slots (highest generation, then furthest), or None."""
    heads = [s.head for s in slots if s.head is not None]
    return max(heads, key=lambda h: (h.generation, h.position)) if heads else None


def read_head(root, mac_key):
    """(bytes, Head) of the newest valid copy of the head of the store at root, or None if no copy is
    valid (the log then gives the commit point: Log.load)."""
    h = newest(read_slots(root, mac_key))
    return None if h is None else (h.pack(mac_key), h)


def write_slot(root, name, b, disk=None):
    """Write one head copy in place and make it durable. In place, not by rename: the other copy
    holds the commit before, so a torn write costs this copy only, and a sync pays one fsync (an
    fdatasync: the bytes and the size, without a journal commit for the mtime alone)."""
    path = os.path.join(root, name)
    created = not os.path.exists(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.pwrite(fd, b, 0)
        os.ftruncate(fd, len(b))
        os.fdatasync(fd)
    finally:
        os.close(fd)
    if created:
        fsync_dir(root)
    if disk is not None:
        disk.count_write("head", name, 0, len(b))


def write_heads(root, b, disk=None):
    """Both copies at once: a new store, a gc switch, a recovery (no earlier commit to fall back to)."""
    for name in F.HEADS:
        write_slot(root, name, b, disk)


class OpenArena:
    """The arena being written, with its summary kept in memory."""

    def __init__(self, n, fd, header, hbytes):
        self.n, self.fd, self.header, self.hbytes = n, fd, header, hbytes
        self.end = F.ARENA_HEADER_SIZE
        self.tags = bytearray()
        self.keys = bytearray()
        self.addrs = []
        self.types = bytearray()

    @property
    def count(self):
        return len(self.addrs)

    def add(self, entries):
        """Add scanned records: [(off, btype, key, stored, raw, tag)]."""
        if not entries:
            return
        offs, btypes, keys, _, _, tags = zip(*entries)
        self.tags += b"".join(tags)
        self.keys += b"".join(keys)
        base = F.addr(self.n, 0)
        self.addrs += [base + o for o in offs]
        self.types += bytes(btypes)

    def add_columns(self, got):
        """Add scanned records in columns (native.Scanned, keys keylen bytes each)."""
        self.tags += got.tags
        self.keys += got.keys
        base = self.n << 32
        self.addrs += [base | o for o in got.offs]
        self.types += got.btypes

    def add_packed(self, tags, offs, btype, keys, keylen):
        """Add k freshly packed records: their tags, offsets and 32-byte key fields."""
        k = len(offs)
        self.tags += tags
        self.keys += keys[:k * 32] if keylen == 32 else b"".join(keys[j * 32:j * 32 + keylen] for j in range(k))
        base = self.n << 32
        self.addrs += [base | o for o in offs]
        self.types += bytes([btype]) * k


class _Direct:
    """The open arena's O_DIRECT writes: dfd writes whole pages from pos; carry holds the bytes
    from pos to the arena's end (under a page), not yet written there unless `written`."""

    __slots__ = ("n", "fd", "dfd", "pos", "carry", "written")

    def __init__(self, n, fd, dfd, pos, carry):
        self.n, self.fd, self.dfd, self.pos, self.carry, self.written = n, fd, dfd, pos, carry, True


class Log:
    def __init__(self, root, disk, codec, keys, conf, writable):
        self.root = root
        self.dir = os.path.join(root, F.ARENAS)
        self.sumdir = os.path.join(root, F.SUMMARIES)
        self.disk, self.codec, self.keys = disk, codec, keys
        self.uuid = bytes.fromhex(conf["uuid"].replace("-", ""))
        self.arena_size = conf["arena_size"]
        self.block_size = conf["block_size"]
        self.keylen = 32 if conf["mode"] == "hash" else 8
        self.run = F.store_run(conf)  # the longest run of data blocks a pack makes (§3 `run`)
        self.writable = writable
        self.fds = OrderedDict()
        self.ivs = {}
        self.window = None  # (arena, start, bytes)
        self.head = None
        self.open = None
        self.slots = []  # the head copies as found at load
        self.committed = None  # (arena, end) of the last commit written or found
        self.repaired = []
        self.damaged = []
        self.lost = []      # [(arena, from, to)]: byte ranges of committed records that are gone
        self.missing = []   # sealed arenas whose files are gone
        self.dirty = set()  # arenas written since the last sync
        self.avg_record = RH + self.block_size  # bytes per record in the last pack
        self.torn = None  # the open arena, if it held bytes past its end: sealed before the next write
        self.threads = 1
        self.moved = {}  # arena -> the file a reader reads instead (a pending gc switch's new arena)
        self.writer = None  # the writer thread of write_behind()
        self.queued = deque()  # its writes not yet waited for
        self.syncer = None  # the thread that fsyncs sealed arenas inside write_behind()
        self.syncing = {}  # arena -> its background fsync, not yet waited for
        self.synced = set()  # arenas fsynced since their last write (sync() leaves them out)
        self.spare = deque()  # pack buffers whose records are written, to pack into again
        self.failed = None  # the error of a write behind: every later write and sync fails with it
        self.direct = None  # _Direct: the open arena's page-aligned writes inside write_behind()
        self.direct_ok = True  # False once the file system refused O_DIRECT

    # ---- opening and recovery ------------------------------------------------

    def load(self, head=None):
        """Find the newest commit (the newest valid head copy, carried forward by the log) or take
        `head` (a pending gc switch's, for a reader), cut a torn tail, finish a crashed seal; a
        writer then rewrites head copies that are missing, damaged or behind the log."""
        self.slots = read_slots(self.root, self.keys.mac)
        if head is None:
            best = newest(self.slots)
            head = best if best is not None else self._head_from_arenas()
        self.head = F.Head(**vars(head))  # ours to move; the slots keep what they hold
        try:  # one listing, not a stat per arena at every open
            names = set(os.listdir(self.dir))
        except FileNotFoundError:
            names = set()
        for n in range(self.head.arena):
            if F.arena_name(n) not in names and not os.path.exists(self.path(n)):
                # Its records are lost; every other arena is still served (salvage, never refuse the whole).
                log.error("arena %d is missing (%s); its blocks cannot be read", n, self.path(n))
                self.missing.append(n)
                self.lost.append((n, 0, self.arena_size))
        walked = None  # the last sealed arena taken in past the head
        while True:
            n = self.head.arena
            if not os.path.exists(self.path(n)) and self.head.end > F.ARENA_HEADER_SIZE:
                self.open = self._lost_open(n, "is missing")
                if self.open is not None:
                    return
                continue
            if not os.path.exists(self.path(n)):
                # A crash between moving the head and creating the arena.
                if not self.writable:
                    self.open = OpenArena(n, None, None, b"")
                    self.open.end = F.ARENA_HEADER_SIZE
                    self.committed = (n, self.head.end)
                    return
                self.open = self._create_arena(n)
                self.repaired.append(f"created missing open arena {n}")
            if os.path.exists(self.path(n + 1)) and self._chains_on(n):
                walked = n
                continue
            oa = self._scan_open(n)
            if oa is not None:
                self.open = oa
                break
        if walked is not None and self.head.end == F.ARENA_HEADER_SIZE:
            # No commit record in the open arena yet: the last one is in the arena before.
            self.head.generation = self._last_commit(walked)
        self.committed = (self.head.arena, self.head.end)
        if self.writable:
            self._set_aside_orphans()
            self._heal_heads(best)

    def _chains_on(self, n):
        """Is arena n sealed by a trailer that chains on from the head? Then it is taken in as it
        stands, and the head moves past it: committed arenas newer than the head (a head put back,
        a crash between a seal and the next sync) are recognised from themselves."""
        tr = self.trailer(n)
        if tr is None or tr.chain != F.chain_mac(self.keys.mac, self.head.chain, n, tr.sealed):
            return False
        log.info("arena %d is sealed and chains on from the head; taken in", n)
        self.repaired.append(f"arena {n}: sealed after the head was written, and chains on; taken in")
        self.head = F.Head(n + 1, F.ARENA_HEADER_SIZE, 0, tr.chain, self.head.generation)
        return True

    def _last_commit(self, n):
        """The generation of the last commit record in sealed arena n (at least the head's)."""
        tr = self.trailer(n)
        buf = self.disk.pread(self.fd(n), "arena", 0, tr.end if tr else self.file_size(n))
        try:
            iv = self.header(n, buf)[0].iv
        except DataCorrupt:
            return self.head.generation
        entries, _, _ = self.scan(n, iv, memoryview(buf)[F.ARENA_HEADER_SIZE:], F.ARENA_HEADER_SIZE)
        return self._newest_commit(n, iv, buf, [e[0] for e in entries if e[1] == F.COMMIT])

    def _newest_commit(self, n, iv, buf, offs):
        """The highest generation among the commit records at offs of arena n, and the head's."""
        g = self.head.generation
        for off in offs:
            got = self._commit_at(n, iv, buf, off)
            if got:
                g = max(g, got[0])
        return g

    def _commit_at(self, n, iv, buf, off):
        """(generation, arena, chain) of the commit record at off, or None if it is not one."""
        try:
            _, _, payload = native.unpack(self.codec, n, iv, off, bytes(buf[off:off + RH + L.stored(buf, off)]))
            return F.unpack_commit(payload)
        except (native.RecordError, ValueError):
            return None

    def _roll_forward(self, n, oa, buf, committed):
        """Move the head to the last commit record past `committed` in the open arena n (every
        record before it verified in the scan) -> the committed end."""
        for i in range(oa.count - 1, -1, -1):
            off = oa.addrs[i] & 0xFFFFFFFF
            if off < committed:
                break
            if oa.types[i] != F.COMMIT:
                continue
            end = off + RH + L.stored(buf, off)
            got = self._commit_at(n, oa.header.iv, buf, off)
            if got and got[0] > self.head.generation and got[1] == n and got[2] == self.head.chain:
                self.head = F.Head(n, end, i + 1, self.head.chain, got[0])
                return end
        return committed

    def _heal_heads(self, best):
        """Rewrite every head copy that is missing or damaged, or all of them if the log carried the
        commit past the newest copy."""
        cur = self.head
        moved = best is None or (cur.generation, cur.position) != (best.generation, best.position)
        if best is None:
            note = (f"every head copy was missing or damaged; rebuilt from the log (commit {cur.generation}, "
                    f"arena {cur.arena} offset {cur.end})")
            self.repaired.append(note)
            log.warning("%s", note)
        elif moved:
            self.repaired.append(f"the head named commit {best.generation} (arena {best.arena} offset {best.end}); "
                                 f"the log carries it to commit {cur.generation} (arena {cur.arena} offset {cur.end})")
        b = cur.pack(self.keys.mac)
        for slot in self.slots:
            if slot.head is None and best is not None:
                legacy = slot.problem == "missing" and best.generation == 0
                note = (f"wrote the second head copy {slot.name} (a store from before head copies)" if legacy
                        else f"head copy {slot.name} was {slot.problem}; rewritten from the newest commit")
                self.repaired.append(note)
                log.warning("%s", note)
            if slot.head is None or moved:
                write_slot(self.root, slot.name, b, self.disk)
                slot.head, slot.problem = F.Head(**vars(cur)), None

    def _lost_open(self, n, why):
        """The newest arena is gone with committed records in it. Readers serve the arenas before it;
        a writer refuses (creating an empty one in its place would make its records' addresses
        mean other blocks), except `rebuild --salvage`, which goes on in arena n + 1 and leaves n
        missing for ever, so no address is ever reused."""
        self.missing.append(n)
        self.lost.append((n, F.ARENA_HEADER_SIZE, self.head.end))
        if not self.writable:
            log.error("the newest arena %d %s (%s); its blocks cannot be read", n, why, self.path(n))
            oa = OpenArena(n, None, None, b"")
            oa.end = self.head.end
            return oa
        if not self.salvaging:
            raise DataCorrupt(f"the newest arena {n} {why} ({self.path(n)}) with committed records up to "
                              f"offset {self.head.end}: put it back from a copy, or run `foundation rebuild "
                              "--salvage` to go on without it")
        self.head = F.Head(n + 1, F.ARENA_HEADER_SIZE, 0, self.head.chain)
        self.repaired.append(f"the newest arena {n} {why}: its records are lost; new records go to arena {n + 1}")
        return None

    salvaging = False

    def _set_aside_orphans(self):
        """Arenas after the open one hold only records written after the last
        sync, behind a torn tail: never committed, so they are moved aside."""
        n = self.open.n + 1
        while os.path.exists(self.path(n)):
            d = os.path.join(self.root, "orphans")
            os.makedirs(d, exist_ok=True)
            fd = self.fds.pop(n, None)
            if fd is not None:
                os.close(fd)
            os.rename(self.path(n), os.path.join(d, F.arena_name(n)))
            self.repaired.append(f"moved uncommitted arena {n} to orphans/ (written after the last sync, behind a torn tail)")
            log.warning("arena %d was written after the last sync behind a torn tail; moved to orphans/", n)
            n += 1

    def _head_from_arenas(self):
        """No head copy is valid: the arenas give the open arena (every arena with a trailer and a
        successor is sealed), and its commit records the commit point (_roll_forward)."""
        n, chain = 0, F.ZERO_CHAIN
        while os.path.exists(self.path(n + 1)):
            tr = self.trailer(n)
            if tr is None:
                break
            chain = tr.chain
            n += 1
        log.warning("no valid head copy: the commit point is rebuilt from the arenas (open arena %d)", n)
        self.head = F.Head(n, F.ARENA_HEADER_SIZE, 0, chain)
        if n:
            self.head.generation = self._last_commit(n - 1)
        return self.head

    def _scan_open(self, n):
        """Scan arena n as the open arena. Returns the OpenArena, or None if it
        turned out to be sealed (a crash between seal and head update)."""
        fd = self.fd(n)
        size = os.fstat(fd).st_size
        committed = self.head.end if self.head.arena == n else F.ARENA_HEADER_SIZE
        if size < F.ARENA_HEADER_SIZE and committed <= F.ARENA_HEADER_SIZE:
            # Created but never written (by an older crash): nothing was committed in it.
            if not self.writable:
                oa = OpenArena(n, None, None, b"")
                oa.end = F.ARENA_HEADER_SIZE
                return oa
            os.close(self.fds.pop(n))
            os.unlink(self.path(n))
            self.repaired.append(f"recreated empty open arena {n}")
            return self._create_arena(n)
        buf = self.disk.pread(fd, "arena", 0, size)
        try:
            header, hbytes = self.header(n, buf)
        except DataCorrupt:
            if committed <= F.ARENA_HEADER_SIZE:
                raise
            # Its IV is gone, so none of its records decrypts: lost like a missing newest arena.
            self.forget(n)
            return self._lost_open(n, "has a damaged header")
        oa = OpenArena(n, fd, header, hbytes)
        mv = memoryview(buf)
        end = F.ARENA_HEADER_SIZE
        while True:
            got, end, err = native.scan_columns(self.codec, n, header.iv, mv[end:], end, self.keylen)
            oa.add_columns(got)
            if end >= committed:
                break
            # Committed damage: step over it to the next record that verifies (Log.salvage). Its
            # blocks cannot be read, the rest is served, and a writer stores them again when it
            # meets them (paper §3.4: archiving heals the archive).
            what = err.kind if err else "zeroed"
            _, lost = self.salvage(n, header.iv, buf, end, min(committed, size), first=True)
            nxt = lost[0][1] if lost else min(committed, size)
            if nxt >= size:
                nxt = committed  # the file ends before the commit point: the rest is lost
            log.error("arena %d offset %d: committed records are damaged (%s); bytes up to %d cannot be read",
                      n, end, what, nxt)
            self.damaged.append((n, end))
            self.lost.append((n, end, nxt))
            self.repaired.append(f"arena {n} offset {end}: stepped over damaged committed bytes up to {nxt} ({what})")
            end = nxt
            if end >= size:
                break
        del mv
        oa.end = end = self._whole_runs(oa, buf, end, committed)
        committed = self._roll_forward(n, oa, buf, committed)
        if size < end and self.writable:
            # Cut short below the commit point: new records go after it, so no address is used twice.
            os.ftruncate(fd, end)
            size = end
        if end < size:
            tail = buf[end:end + F.TRAILER_SIZE]
            if self._valid_trailer(n, oa, tail):
                log.info("arena %d was sealed before a crash; finishing the seal", n)
                g = self._newest_commit(n, oa.header.iv, buf,
                                        [a & 0xFFFFFFFF for a, t in zip(oa.addrs, oa.types) if t == F.COMMIT])
                self.head = F.Head(n + 1, F.ARENA_HEADER_SIZE, 0, F.Trailer.unpack(tail).chain, g)
                if self.writable:
                    if end + F.TRAILER_SIZE < size:
                        os.ftruncate(fd, end + F.TRAILER_SIZE)
                    self._write_summary(n, oa, F.Trailer.unpack(tail).amac)
                    self.repaired.append(f"finished sealing arena {n}")
                return None
            if self.writable:
                # Those bytes were encrypted under this arena's iv: new records there would use the
                # same counter blocks for other plaintext. So the arena is sealed at its last good
                # record before the next write, and writing goes on in a new arena with a fresh iv.
                log.warning("arena %d: torn tail at offset %d (%d bytes, %s); the arena is sealed there at "
                            "the next write", n, end, size - end, err.kind if err else "unwritten")
                self.torn = n
                self.repaired.append(f"cut torn tail of arena {n} at offset {end} ({size - end} bytes): "
                                     "sealed there at the next write")
        if not self.writable:
            # A reader trusts only what the head committed.
            k = sum(1 for a in oa.addrs if F.split(a)[1] < committed)
            del oa.addrs[k:]
            del oa.types[k:]
            del oa.keys[k * self.keylen:]
            del oa.tags[k * 16:]
            oa.end = committed
        return oa

    def _whole_runs(self, oa, buf, end, committed):
        """The end of oa's good records with a run a torn write left part of (past the commit
        point: its first records whole, its last ones never written) dropped: each of its records
        verifies alone, but none decodes, and a block found there would never be stored again.
        The torn-tail rule then seals the arena before it (§5.2, §12)."""
        if not oa.count:
            return end
        last = oa.addrs[-1] & 0xFFFFFFFF
        run = L.run_span(buf, last)
        if run is None or run[1] == end or run[0] < committed:
            return end
        k = bisect.bisect_left(oa.addrs, (oa.n << 32) | run[0])
        log.warning("arena %d: the run of records at offset %d was cut short by a torn write; its %d "
                    "records past the commit point are dropped", oa.n, run[0], oa.count - k)
        del oa.addrs[k:]
        del oa.types[k:]
        del oa.keys[k * self.keylen:]
        del oa.tags[k * 16:]
        return run[0]

    def _valid_trailer(self, n, oa, b):
        try:
            tr = F.Trailer.unpack(b)
        except ValueError:
            return False
        prev = self.head.chain
        amac = F.arena_mac(self.keys.mac, oa.hbytes, bytes(oa.tags), oa.count, oa.end)
        return tr.end == oa.end and tr.count == oa.count and tr.amac == amac and \
            tr.chain == F.chain_mac(self.keys.mac, prev, n, amac)

    def salvage(self, n, iv, buf, start, limit, first=False):
        """Every record of buf[start:limit] that verifies, stepping over damage -> (entries, lost).

        Where the scan stops short of limit (a bad tag, a lost length, a
        zeroed page), the next record is found by its header: the next magic
        from which a record verifies (its tag covers arena and offset, so a
        stray magic in a payload never passes). `lost` holds the [from, to)
        byte ranges stepped over: a damaged record costs that record only.
        With `first`, stop at the first damage (its range ends at the next record).
        """
        raw = buf if isinstance(buf, (bytes, bytearray)) else bytes(buf)
        mv = memoryview(raw)
        probe = RH + 2 * self.block_size + 64  # room for one record, however it was encoded
        entries, lost, off = [], [], start
        while off < limit:
            got, end, _err = self.scan(n, iv, mv[off:limit], off)
            entries += got
            if end >= limit:
                break
            nxt = raw.find(L.MAGIC, end + 1, limit)
            while nxt >= 0:
                if self.scan(n, iv, mv[nxt:min(limit, nxt + probe)], nxt)[0]:
                    break
                nxt = raw.find(L.MAGIC, nxt + 1, limit)
            nxt = limit if nxt < 0 else nxt
            lost.append((end, nxt))
            if first:
                break
            off = nxt
        return entries, lost

    def scan(self, n, iv, buf, base, verify=True):
        """Records of one arena region -> ([(off, btype, key, stored, raw, tag)], end, error)."""
        entries, end, err = native.scan(self.codec, n, iv, buf, base, verify)
        kl, at = self.keylen, L.H_TAG - base   # layout.tag inlined: one struct read per record, no slice
        out = [(off, btype, key[:kl], stored, raw, _tag_at(buf, off + at)[0])
               for off, btype, key, stored, raw in entries]
        return out, end, err

    # ---- files -----------------------------------------------------------------

    def path(self, n):
        p = self.moved.get(n)
        if p is not None and os.path.exists(p):
            return p
        return os.path.join(self.dir, F.arena_name(n))

    def fd(self, n):
        fd = self.fds.get(n)
        if fd is not None:
            self.fds.move_to_end(n)
            return fd
        try:
            fd = os.open(self.path(n), os.O_RDWR if self.writable else os.O_RDONLY)
        except FileNotFoundError:
            try:  # a moved file renamed into place since path() looked (a writer finishing a gc)
                fd = os.open(os.path.join(self.dir, F.arena_name(n)), os.O_RDONLY)
            except FileNotFoundError:
                raise DataCorrupt(f"arena {n} is missing ({self.path(n)})") from None
        self.fds[n] = fd
        while len(self.fds) > MAX_FDS:
            old, ofd = self.fds.popitem(last=False)
            if self.open is not None and old == self.open.n:
                self.fds[old] = ofd
                continue
            self.drain()  # no queued write may outlive its file's descriptor
            self._wait_syncs(old)  # nor its fsync (those of the arenas sealed since run on)
            if old in self.dirty and old not in self.synced:
                self.disk.fsync(ofd, "arena")
                self.dirty.discard(old)
            os.close(ofd)
        return fd

    def forget(self, n):
        """Arena n's file is about to be replaced: close it and drop what was read from it."""
        self.drain()
        self._wait_syncs(n)
        self.synced.discard(n)
        fd = self.fds.pop(n, None)
        if fd is not None:
            os.close(fd)
        self.ivs.pop(n, None)
        self.window = None

    def file_size(self, n):
        return os.path.getsize(self.path(n))

    def record_header(self, n, off):
        """The header bytes of the record at offset off of arena n, as they are (not verified)."""
        self.drain()
        return self.disk.pread(self.fd(n), "arena", off, L.HEADER_SIZE)

    def close(self):
        with contextlib.suppress(Exception):  # a write's failure was raised where it was found
            self.drain()
        with contextlib.suppress(Exception):
            self._wait_syncs()
        self._end_direct()
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()

    def header(self, n, buf):
        """(ArenaHeader, its bytes) of arena n from the file's first bytes; DataCorrupt if they are not its header."""
        try:
            h = F.ArenaHeader.unpack(bytes(buf[:F.ARENA_HEADER_SIZE]), self.keys.mac)
        except ValueError as e:
            raise DataCorrupt(f"arena {n} offset 0: header damaged ({e})") from None
        if h.arena != n or h.uuid != self.uuid:
            raise DataCorrupt(f"arena {n} offset 0: file holds arena {h.arena} of another log (moved or reordered arena)")
        self.ivs[n] = h.iv
        return h, bytes(buf[:F.ARENA_HEADER_SIZE])

    def iv(self, n):
        iv = self.ivs.get(n)
        if iv is None:
            b = self.disk.pread(self.fd(n), "arena", 0, F.ARENA_HEADER_SIZE)
            iv = self.header(n, b)[0].iv
        return iv

    def trailer(self, n, aside=False):
        """The trailer of sealed arena n (either generation), or None if its file has none.
        aside: read through a descriptor of its own, the queue and the descriptor cache left
        alone (another thread appends meanwhile; n is an arena the index covers, long written)."""
        if aside:
            fd = os.open(self.path(n), os.O_RDONLY)
            try:
                return self._trailer(n, fd)
            finally:
                os.close(fd)
        self.drain()
        return self._trailer(n, self.fd(n))

    def _trailer(self, n, fd):
        size = os.fstat(fd).st_size
        k = min(size - F.ARENA_HEADER_SIZE, F.MAX_TRAILER)
        if k < F.TRAILER_SIZE:
            return None
        try:
            return F.Trailer.from_tail(self.disk.pread(fd, "arena", size - k, k), self.keys.mac, n)
        except ValueError:
            return None

    def _create_arena(self, n):
        h = F.ArenaHeader(n, self.uuid, os.urandom(16), self.arena_size)
        hb = h.pack(self.keys.mac)
        # Written under a temporary name and renamed: an arena file never
        # exists without its header.
        tmp = self.path(n) + ".new"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            self.disk.pwrite(fd, "arena", 0, hb)
        except BaseException:
            os.close(fd)
            raise
        if os.path.exists(self.path(n)):
            os.close(fd)
            raise DataCorrupt(f"arena {n} already exists ({self.path(n)}); refusing to overwrite it")
        os.rename(tmp, self.path(n))
        self.fds[n] = fd
        self.dirty.add(n)
        self.ivs[n] = h.iv
        return OpenArena(n, fd, h, hb)

    def write_head(self, both=False):
        """Write the head to the slot of its generation (both slots: a new store)."""
        oa = self.open
        if oa is not None and oa.n == self.head.arena:
            self.head.end, self.head.count = oa.end, oa.count
        b = self.head.pack(self.keys.mac)
        if both:
            write_heads(self.root, b, self.disk)
        else:
            write_slot(self.root, F.HEADS[self.head.generation % 2], b, self.disk)
        self.committed = (self.head.arena, self.head.end)

    def commit(self):
        """The newest commit: (generation, arena, end)."""
        return Commit(self.head.generation, self.head.arena, self.head.end)

    # ---- writing ---------------------------------------------------------------

    def append(self, btype, buf, bs, keys, threads=1, filled=None):
        """Append len(buf)//bs blocks (or one short block) as records; return their
        addresses. filled: native.fill() of buf made beforehand (in another thread), or None."""
        n = max(1, len(buf) // bs)
        addrs = []
        i = 0
        mv = memoryview(buf)  # each pack is handed its blocks in place, not a copy of them
        if self.torn is not None:
            self.seal()
        if filled is not None:
            return self._append_filled(btype, mv, bs, keys, threads, filled, n)
        while i < n:
            oa, room = self._room()
            # Pack about what fits, judged by the size of recent records;
            # records past the arena's end are packed again into the next one.
            # Where the rest might not fit, half the room at a time: the next
            # blocks may compress worse than the last ones (up to 1 MB of an
            # arena was packed twice), and the last small pack overshoots by
            # a few records only. At most PACK_BYTES of blocks a call (memory).
            est = room / self.avg_record
            m = min(n - i, int(est / 2) if est > 512 else max(16, int(est * 1.03) + 8), max(16, PACK_BYTES // bs))
            d, lead, out = self._out(oa, m * (RH + bs))
            recs, offs = native.pack(self.codec, oa.n, oa.header.iv, oa.end, btype,
                                     mv[i * bs:(i + m) * bs], bs, keys[i * 32:(i + m) * 32], threads,
                                     out=memoryview(out)[lead:] if d else out, scratch=self._scratch(m * bs),
                                     run=self.run if btype == F.DATA else 1)
            ends = offs[1:] + [oa.end + len(recs)]
            k = L.whole_runs(recs, oa.end, offs, bisect.bisect_right(ends, oa.end + room))  # ends ascend
            if k == 0:
                self.spare.append(out)
                self.seal()
                continue
            used = ends[k - 1] - oa.end
            self.avg_record = max(RH + 1, (ends[-1] - oa.end) / len(ends))
            if d:
                self._put_direct(d, out, lead + used)
            else:
                self._put(oa.fd, oa.end, recs[:used], out)
            first = len(oa.addrs)
            oa.add_packed(self._tags(oa, recs, offs, k, used), offs[:k], btype, keys[i * 32:(i + k) * 32],
                          self.keylen)
            addrs += oa.addrs[first:]
            oa.end += used
            i += k
        return addrs

    def _append_filled(self, btype, mv, bs, keys, threads, filled, n):
        """append() of blocks compressed already: each arena takes exactly the records that fit
        (their sizes are known), none is packed twice, and the tags come with the records."""
        addrs, i = [], 0
        while i < n:
            oa, room = self._room()
            d, lead, out = self._out(oa, min(room, (n - i) * (RH + filled.blen)))
            recs, offs, tags = native.seal(self.codec, oa.n, oa.header.iv, oa.end, btype, mv, bs, keys, filled,
                                           i, room, out=memoryview(out)[lead:] if d else out, threads=threads)
            k, used = len(offs), len(recs)
            if k == 0:
                self.spare.append(out)
                self.seal()
                continue
            if d:
                self._put_direct(d, out, lead + used)
            else:
                self._put(oa.fd, oa.end, recs, out)
            first = len(oa.addrs)
            oa.add_packed(tags, offs, btype, keys[i * 32:(i + k) * 32], self.keylen)
            addrs += oa.addrs[first:]
            oa.end += used
            i += k
        return addrs

    def _room(self):
        """(open arena, bytes its records may still take), a full arena sealed first."""
        while True:
            oa = self.open
            room = self.arena_size - F.TRAILER_SIZE - oa.end
            if room >= RH + 16:
                return oa, room
            self.seal()

    def _out(self, oa, size):
        """(O_DIRECT state or None, lead, buffer) for records of up to size bytes appended to oa:
        the partial page before oa.end (lead bytes) goes in front of them when written direct."""
        d = self._direct_for(oa)
        lead = len(d.carry) if d else 0
        out = self._pack_buffer(lead + size)
        if lead:
            out[:lead] = d.carry
        return d, lead, out

    def _tags(self, oa, recs, offs, k, used):
        """The tags of the first k records packed into recs (used bytes): gathered by one walk of
        their headers in C, not a slice per record."""
        got = native.scan_columns(self.codec, oa.n, oa.header.iv, recs[:used], oa.end, self.keylen,
                                  verify=False)[0]
        if len(got.tags) == k * L.TAG_SIZE:
            return got.tags
        return b"".join(recs[o - oa.end + L.H_TAG:o - oa.end + L.HEADER_SIZE] for o in offs[:k])

    @contextlib.contextmanager
    def write_behind(self):
        """A scope in which appended records are written by a writer thread, in order."""
        if self.writer is not None:
            yield
            return
        self.writer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="arena-write")
        if SYNC_SEALED:
            self.syncer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="arena-sync")
        try:
            yield
        finally:
            try:
                self.drain()
                self._wait_syncs()
            finally:
                self.writer.shutdown()
                self.writer = None
                if self.syncer is not None:
                    self.syncer.shutdown()
                    self.syncer = None
                self._end_direct()
                self.spare.clear()  # ~4 MiB each: not held through the flush at close
                self.scratch = None

    scratch = None  # the compressed payloads of a pack on several threads, inside write_behind()

    def _scratch(self, size):
        """Inside write_behind(), one buffer every pack reuses for its compressed payloads (its
        pages stay mapped); outside it, None: a pack then allocates its own."""
        if self.writer is None:
            return None
        if self.scratch is None or len(self.scratch) < size:
            self.scratch = mmap.mmap(-1, max(size, PACK_BYTES))
        return self.scratch

    def _pack_buffer(self, size):
        """A buffer to pack into: one whose records are written already, or a new one. Reusing
        them keeps the write path's memory at a few buffers, never returned to and taken from
        the allocator per batch (which left the heap fragmented), and copies nothing."""
        while self.spare:
            b = self.spare.popleft()
            if len(b) >= size:
                return b
        # A 4 MiB batch, its headers and a partial page; page-aligned (an anonymous map) for O_DIRECT.
        return mmap.mmap(-1, max(size, PACK_BYTES + (PACK_BYTES >> 6) + PAGE))

    def _put(self, fd, off, data, buf=None):
        """Write packed records at off (a view of buf): now, or queued to the writer thread;
        buf, if given, is reused once they are written (a trailer has none)."""
        if self.failed is not None:
            raise self.failed
        if self.writer is None:
            self.disk.pwrite(fd, "arena", off, data)
            self._spare(buf)
            return
        self.queued.append(self.writer.submit(self._write_out, fd, off, data, buf))
        while len(self.queued) > WRITE_QUEUE:  # bounded: each holds a packed batch
            self._wait_one()

    def _spare(self, buf):
        if buf is not None and len(self.spare) <= WRITE_QUEUE:
            self.spare.append(buf)

    def _write_out(self, fd, off, data, buf):
        self.disk.pwrite(fd, "arena", off, data)
        # Start the disk on these bytes now, so the sync at the end waits for
        # the last batch only, not for the whole day's writes at once.
        _writeback(fd, off, len(data))
        self._spare(buf)

    # ---- page-aligned writes around the page cache (inside write_behind) ------------

    def _direct_for(self, oa):
        """The _Direct of the open arena inside write_behind(), started at its first append; None
        outside it, or where the file system refuses O_DIRECT."""
        d = self.direct
        if d is not None and d.n == oa.n:
            return d
        if self.writer is None or not self.direct_ok or self.torn is not None:
            return None
        self._end_direct()
        try:
            dfd = os.open(self.path(oa.n), os.O_WRONLY | os.O_DIRECT)
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise self.disk._error(e, "arena") from None
            self.direct_ok = False
            return None
        pos = oa.end - oa.end % PAGE
        if pos == 0 and oa.end == len(oa.hbytes):
            carry = oa.hbytes  # a new arena: its header, written already
        else:  # the session's first append to an arena: its partial page as the file holds it
            self.drain()
            carry = self.disk.pread(oa.fd, "arena", pos, oa.end - pos)
            if len(carry) != oa.end - pos:
                os.close(dfd)
                raise DataCorrupt(f"arena {oa.n} is shorter than its records ({pos + len(carry)} < {oa.end})")
        self.direct = d = _Direct(oa.n, oa.fd, dfd, pos, carry)
        return d

    def _put_direct(self, d, out, total):
        """Queue out[:total] (the carried partial page, then the new records) at d.pos: its
        whole pages written around the page cache, the rest carried to the next append."""
        if self.failed is not None:
            raise self.failed
        whole = total - total % PAGE
        d.carry = bytes(out[whole:total])
        d.written = False
        if whole:
            self.queued.append(self.writer.submit(self._write_direct, d, d.pos, memoryview(out)[:whole], out))
            d.pos += whole
        else:
            self._spare(out)
        while len(self.queued) > WRITE_QUEUE:
            self._wait_one()

    def _write_direct(self, d, off, data, buf):
        try:
            n = os.pwrite(d.dfd, data, off)
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise self.disk._error(e, "arena") from None
            self.direct_ok = False  # refused after all: through the page cache, as without
            n = 0
        self.disk.count_write("arena", d.fd, off, n)
        if n < len(data):  # the rest (never seen short on a local file system) through the cache
            self.disk.pwrite(d.fd, "arena", off + n, data[n:])
        self._spare(buf)

    def _flush_carry(self):
        """Write the carried partial page through the page cache (the queue is empty): readers,
        seals and fsync see every byte appended. It stays carried: the next whole page rewrites it."""
        d = self.direct
        if d is not None and not d.written and d.carry:
            self.disk.pwrite(d.fd, "arena", d.pos, d.carry)
            d.written = True

    def _end_direct(self):
        """Stop carrying (write_behind ends, or the arena is sealed); its descriptor is closed
        once no queued write needs it."""
        d, self.direct = self.direct, None
        if d is None:
            return
        if self.writer is not None and self.queued:  # after the writes queued for it, in the writer
            self.queued.append(self.writer.submit(os.close, d.dfd))
        else:
            os.close(d.dfd)

    def _wait_one(self):
        try:
            self.queued.popleft().result()
        except BaseException as e:
            self.failed = self.failed or e
            raise

    def _sync_sealed(self, fd, written):
        """The syncer's fsync of a sealed arena's file once its last write (`written`) is done."""
        written.result()  # (its failure is the writer's to report: then this arena is not synced)
        self.disk.fsync(fd, "arena")

    def _wait_syncs(self, n=None):
        """Wait for the background fsyncs (n: arena n's only): their arenas join `synced`; a failure
        fails every later write and sync (an fsync that failed once may pass the next time without
        the data)."""
        for k in list(self.syncing) if n is None else [n]:
            f = self.syncing.pop(k, None)
            if f is None:
                continue
            try:
                f.result()
                self.synced.add(k)
            except BaseException as e:
                self.failed = self.failed or e
        if self.failed is not None:
            raise self.failed

    def drain(self):
        """Wait for every write queued; the first failure is raised (and by every later call)."""
        while self.queued:
            self._wait_one()
        if self.failed is not None:
            raise self.failed
        self._flush_carry()

    def seal(self):
        """Seal the open arena and start the next one (write order: trailer,
        fsync, summary, new arena, head). Inside write_behind() the trailer is queued behind
        the arena's records, so an append does not wait for the writer at every seal."""
        oa = self.open
        amac = F.arena_mac(self.keys.mac, oa.hbytes, bytes(oa.tags), oa.count, oa.end)
        chain = F.chain_mac(self.keys.mac, self.head.chain, oa.n, amac)
        trailer = F.Trailer(oa.count, oa.end, amac, chain).pack()
        if self.torn == oa.n:
            self.drain()
            self.disk.pwrite(oa.fd, "arena", oa.end, trailer)
            # The trailer first: killed before this cut, the next open finds the seal and finishes it.
            os.ftruncate(oa.fd, oa.end + F.TRAILER_SIZE)
            self.torn = None
        elif self.direct is not None and self.direct.n == oa.n:
            d = self.direct  # the carried partial page and the trailer: the arena's last bytes
            self._put(oa.fd, d.pos, d.carry + trailer)
            self._background_sync(oa)
            self._end_direct()
        else:
            self._put(oa.fd, oa.end, trailer)
            self._background_sync(oa)
        # No fsync here: the next sync() makes every arena written since the
        # last one durable before the head names them (see docs/format.md).
        self.dirty.add(oa.n)
        self._write_summary(oa.n, oa, amac)
        if self.on_seal:
            self.on_seal(oa)
        self.open = self._create_arena(oa.n + 1)
        self.head = F.Head(oa.n + 1, F.ARENA_HEADER_SIZE, 0, chain, self.head.generation)

    on_seal = None

    def _background_sync(self, oa):
        """Inside write_behind(), sealed arena oa fsynced by the syncer after its last write (the
        newest one queued): sync() then need not. Its descriptor stays open until the fsync was
        waited for (fd(), forget() and close() wait for the fsyncs first)."""
        if self.syncer is None or not self.queued:
            return
        self.synced.discard(oa.n)
        self.syncing[oa.n] = self.syncer.submit(self._sync_sealed, oa.fd, self.queued[-1])

    def _write_summary(self, n, oa, amac):
        b = F.pack_summary(n, self.keylen, amac, oa.keys, oa.addrs, oa.types)
        p = os.path.join(self.sumdir, F.summary_name(n))
        try:
            atomic_write(p, b, sync=False)
        except FileNotFoundError:
            # Only the summaries' own directory is made again (derived data someone deleted), never
            # the store's: under a disk unmounted beneath us that stays ENOENT (the disk is gone),
            # where makedirs made directories on the mount point's file system, or raised
            # FileExistsError when the unmount fell between its mkdir and its check.
            try:
                os.mkdir(self.sumdir)
            except FileExistsError:
                pass
            atomic_write(p, b, sync=False)
        self.disk.count_write("summary", "sum%d" % n, 0, len(b))

    def sync(self):
        """The commit point: a COMMIT record ends what was written, every arena written since the
        last sync is made durable, then the head slot of the new generation (docs/format.md §12)."""
        self.drain()
        self._wait_syncs()  # (a failed one: no commit record written)
        if (self.open.n, self.open.end) == self.committed and not self.dirty:
            return
        if (self.open.n, self.open.end) != self.committed:
            self._append_commit()
            self.drain()  # the commit record is on its way to the file before the fsync
        self._wait_syncs()  # (the commit's seal, if it sealed)
        for n in sorted(self.dirty - self.synced):
            self.disk.fsync(self.fd(n), "arena")
        self.disk.fsync(self.open.fd, "arena")
        if self.dirty:
            fsync_dir(self.dir)  # the names of the arenas created since the last sync
        self.dirty.clear()
        self.synced.clear()
        self.write_head()

    def _append_commit(self):
        """Append the COMMIT record of the next generation, in the arena it names (sealing first if
        it would not fit)."""
        if self.arena_size - F.TRAILER_SIZE - self.open.end < RH + F.COMMIT_SIZE + 16:
            self.seal()
        g = self.head.generation + 1
        payload = F.pack_commit(g, self.open.n, self.head.chain)
        if self.keylen == 32:
            key = native.scores(payload, len(payload), F.COMMIT, key=self.keys.score)
        else:
            key = native.weak_hashes(payload, len(payload), F.COMMIT, self.keys.weak_seed) + bytes(24)
        self.append(F.COMMIT, payload, len(payload), key)
        self.head.generation = g

    @property
    def end_addr(self):
        return F.addr(self.open.n, self.open.end)

    # ---- reading ---------------------------------------------------------------

    def read(self, address):
        """-> (btype, key, data) of the record at `address`; DataCorrupt if it does not verify."""
        self.drain()
        n, off = F.split(address)
        w = self.window
        if w and w[0] == n and w[1] <= off and off + RH <= w[1] + len(w[2]):
            rec = memoryview(w[2])[off - w[1]:]
            if self._complete(rec):
                return self._unpack(n, off, w[2], w[1])
        limit = self._limit(n)
        if off >= limit:
            raise DataCorrupt(f"arena {n} offset {off}: no record there (beyond the end of the log)")
        sequential = w and w[0] == n and w[1] <= off <= w[1] + len(w[2]) + SPAN_GAP
        size = WINDOW if sequential else RH + self.block_size
        size = min(size, limit - off)
        b = self.disk.pread(self.fd(n), "arena", off, size)
        if sequential:
            self.window = (n, off, b)
        else:
            self.window = (n, off, b) if len(b) > 0 else None
        return self._unpack(n, off, b, off)

    def read_many(self, addresses, tolerant=False):
        """Read many records, sorted by log address and merged into spans;
        with `tolerant`, damaged records are left out instead of raising."""
        self.drain()
        out = {}
        addrs = sorted(set(addresses))
        spans = []  # (arena, start, size, i, j): addrs[i:j] read with one pread
        i = 0
        while i < len(addrs):
            n, start = F.split(addrs[i])
            j = i + 1
            last = start
            while j < len(addrs):
                m, o = F.split(addrs[j])
                if m != n or o - last > SPAN_GAP + RH + self.block_size or o - start > (8 << 20):
                    break
                last = o
                j += 1
            limit = self._limit(n)
            size = min(last + RH + self.block_size, limit) - start
            if size <= 0:
                raise DataCorrupt(f"arena {n} offset {start}: no record there (beyond the end of the log)")
            spans.append((n, start, size, i, j))
            i = j
        cuts = _ahead_groups(spans)
        for g, (n, start, size, i, j) in enumerate(spans):
            if g in cuts:
                self._ask_ahead(spans[g:cuts[g]])
            b = self.disk.pread(self.fd(n), "arena", start, size)
            group = addrs[i:j]
            if len(b) < size:  # the file was cut short: records past its end are gone
                cut = [a for a in group if (a & 0xFFFFFFFF) >= start + len(b)]
                if cut and not tolerant:
                    raise DataCorrupt(f"arena {n} offset {cut[0] & 0xFFFFFFFF}: the arena file ends at offset "
                                      f"{start + len(b)} (cut short); its records past that are lost")
                group = group[:len(group) - len(cut)]
            got = native.unpack_many(self.codec, n, self.iv(n), b, start, [a & 0xFFFFFFFF for a in group],
                                     self.threads)
            if any(isinstance(v, native.RecordError) and v.kind == "span" for v in got):
                got = self._mend_runs(n, b, start, group, got)
            for a, v in zip(group, got):
                if isinstance(v, native.RecordError):
                    if not tolerant:
                        raise DataCorrupt(f"arena {n} offset {v.offset}: record {v.kind} check failed")
                    continue
                out[a] = v
        return out

    def _ask_ahead(self, spans):
        """Ask the kernel for a group of read_many's spans at once (posix_fadvise WILLNEED), so the
        disk serves scattered records (old tree nodes) together instead of one latency after
        another; so is the header (its iv) of each arena not read yet, one more latency apiece."""
        if len(spans) < 2:
            return
        heads = {sp[0] for sp in spans if sp[0] not in self.ivs}
        for n, start, size in [(n, 0, F.ARENA_HEADER_SIZE) for n in sorted(heads)] + [sp[:3] for sp in spans]:
            try:
                os.posix_fadvise(self.fd(n), start, size, os.POSIX_FADV_WILLNEED)
            except OSError:
                pass  # only a hint: the pread reports any error

    def _limit(self, n):
        if self.open is not None and n == self.open.n:
            return self.open.end
        if n >= self.head.arena:
            raise DataCorrupt(f"arena {n} does not exist in this log (log ends at arena {self.head.arena})")
        return self.arena_size

    def _complete(self, rec):
        if len(rec) < RH:
            return False
        stored = L.stored(rec, 0)
        return len(rec) >= RH + stored

    def _mend_runs(self, n, b, start, group, got):
        """got with its run slices whose runs the span b (from arena offset start) did not hold
        decoded again from each run read whole, once."""
        runs = L.runs_to_read(b, start, ((x, group[x] & 0xFFFFFFFF) for x, v in enumerate(got)
                                         if isinstance(v, native.RecordError) and v.kind == "span"))
        got = list(got)
        for (first, end), xs in runs.items():
            rb = self.disk.pread(self.fd(n), "arena", first, end - first)
            for x, v in zip(xs, native.unpack_many(self.codec, n, self.iv(n), rb, first,
                                                   [group[x] & 0xFFFFFFFF for x in xs], self.threads)):
                got[x] = v  # (a run cut short by the file's end: truncated)
        return got

    def _unpack(self, n, off, rec, base):
        """The record at arena offset off of rec (rec[0] at base); a run slice's run read whole
        when rec does not hold it."""
        try:
            try:
                return native.unpack(self.codec, n, self.iv(n), off, rec, base)
            except native.RecordError as e:
                if e.kind != "span":
                    raise
                first, end = L.run_span(rec, off - base)
            run = self.disk.pread(self.fd(n), "arena", first + base, end - first)
            return native.unpack(self.codec, n, self.iv(n), off, run, first + base)
        except native.RecordError as e:
            kind, at = e.kind, e.offset
        # Raised outside the handler: a chained RecordError would keep the
        # frames (and the buffers they lent to C) alive with the exception.
        raise DataCorrupt(f"arena {n} offset {at}: record {kind} check failed"
                          + (f" (in the run of the record at offset {off})" if at != off else ""))


def _ahead_groups(spans):
    """{first span of a group: its end} for read_many's spans cut in order into groups of at most
    MAX_FDS // 2 arenas and AHEAD_BYTES: a group's descriptors all stay open while it is asked
    for and read (opening more closes the least used), and a group is no more than the page cache
    should take at once. A newest day's tree nodes lie in ~90 arenas of a year: asked for in one
    group of 32 arenas at a time, not read one latency after another."""
    cuts, g, arenas, nbytes = {}, 0, set(), 0
    for k, sp in enumerate(spans):
        if k > g and ((sp[0] not in arenas and len(arenas) == MAX_FDS // 2) or nbytes + sp[2] > AHEAD_BYTES):
            cuts[g], g, arenas, nbytes = k, k, set(), 0
        arenas.add(sp[0])
        nbytes += sp[2]
    if spans:
        cuts[g] = len(spans)
    return cuts
