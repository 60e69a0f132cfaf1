"""The arena log: the only primary data of the store.

Blocks are appended as self-describing records to the one open arena; when
it is full it is sealed with a trailer (a MAC over its records' tags, and a
chain MAC over every arena before it) and never changes again. The commit
point is the `head` file, rewritten atomically at each sync: records below
it must verify, records past it are kept only while they verify in order,
so a torn tail is cut and no record is ever half-trusted.
"""

import bisect
import logging
import os
from collections import OrderedDict

from foundation import native
from foundation.errors import DataCorrupt
from foundation.store import format as F
from foundation.store import layout as L
from foundation.store.disk import atomic_write, fsync_dir

log = logging.getLogger(__name__)

RH = L.HEADER_SIZE
MAX_FDS = 64
WINDOW = 1 << 20  # read-ahead for sequential single-record reads
SPAN_GAP = 64 << 10  # batched reads merge records closer than this


def read_head(root, mac_key):
    """(bytes, Head) of the head file of the store at root, or None if there is none; DataCorrupt if
    it is damaged."""
    path = os.path.join(root, F.HEAD)
    try:
        with open(path, "rb") as f:
            b = f.read()
    except FileNotFoundError:
        return None
    try:
        return b, F.Head.unpack(b, mac_key)
    except ValueError as e:
        raise DataCorrupt(f"head file {path} is damaged ({e})") from None


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
        for off, btype, key, _stored, _raw, tag in entries:
            self.tags += tag
            self.keys += key
            self.addrs.append(F.addr(self.n, off))
            self.types.append(btype)

    def add_packed(self, recs, rel, offs, btype, keys, keylen):
        """Add k freshly packed records: rel are their offsets in recs, keys their 32-byte key fields."""
        k = len(offs)
        self.tags += b"".join(recs[o + L.H_TAG:o + L.HEADER_SIZE] for o in rel)
        self.keys += keys[:k * 32] if keylen == 32 else b"".join(keys[j * 32:j * 32 + keylen] for j in range(k))
        base = self.n << 32
        self.addrs += [base | o for o in offs]
        self.types += bytes([btype]) * k


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
        self.writable = writable
        self.fds = OrderedDict()
        self.ivs = {}
        self.window = None  # (arena, start, bytes)
        self.head = None
        self.open = None
        self.repaired = []
        self.damaged = []
        self.dirty = set()  # arenas written since the last sync
        self.avg_record = RH + self.block_size  # bytes per record in the last pack
        self.threads = 1

    # ---- opening and recovery ------------------------------------------------

    def load(self):
        """Read the head and the open arena; cut a torn tail; finish a crashed seal."""
        self.head = self._read_head()
        for n in range(self.head.arena):
            if not os.path.exists(self.path(n)):
                raise DataCorrupt(f"arena {n} is missing ({self.path(n)})")
        while True:
            n = self.head.arena
            if not os.path.exists(self.path(n)):
                # A crash between moving the head and creating the arena.
                if not self.writable:
                    self.open = OpenArena(n, None, None, b"")
                    self.open.end = F.ARENA_HEADER_SIZE
                    return
                self.open = self._create_arena(n)
                self.repaired.append(f"created missing open arena {n}")
            oa = self._scan_open(n)
            if oa is not None:
                self.open = oa
                break
        if self.writable:
            self._set_aside_orphans()

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

    def _read_head(self):
        got = read_head(self.root, self.keys.mac)
        if got is not None:
            return got[1]
        # No head: derive it from the arenas (a store created by an older
        # crash or a copied log); rollback protection of the tail is lost.
        n, chain = 0, F.ZERO_CHAIN
        while os.path.exists(self.path(n + 1)):
            tr = self.trailer(n)
            if tr is None:
                break
            chain = tr.chain
            n += 1
        self.repaired.append("head file was missing; rebuilt from the arenas")
        log.warning("store head missing: rebuilt from arenas (open arena %d)", n)
        return F.Head(n, F.ARENA_HEADER_SIZE, 0, chain)

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
        header, hbytes = self.header(n, buf)
        oa = OpenArena(n, fd, header, hbytes)
        mv = memoryview(buf)
        end = F.ARENA_HEADER_SIZE
        while True:
            entries, end, err = self.scan(n, header.iv, mv[end:], end)
            oa.add(entries)
            if end >= committed:
                break
            what = err.kind if err else "missing"
            stored = L.stored_at(buf, end, size)
            skip = end + RH + stored
            if what not in ("tag", "decompress") or not end < skip <= committed:
                raise DataCorrupt(f"arena {n} offset {end}: committed record is damaged ({what})")
            # Step over one damaged record whose header still gives its length:
            # its reads fail, the rest is served, and a writer stores the block
            # again when it meets it (paper §3.4: archiving heals the archive).
            log.error("arena %d offset %d: committed record is damaged (%s); its block cannot be read", n, end, what)
            self.damaged.append((n, end))
            self.repaired.append(f"arena {n} offset {end}: stepped over a damaged committed record ({what})")
            end = skip
        del mv
        oa.end = end
        if end < size:
            tail = buf[end:end + F.TRAILER_SIZE]
            if self._valid_trailer(n, oa, tail):
                log.info("arena %d was sealed before a crash; finishing the seal", n)
                self.head = F.Head(n + 1, F.ARENA_HEADER_SIZE, 0, F.Trailer.unpack(tail).chain)
                if self.writable:
                    if end + F.TRAILER_SIZE < size:
                        os.ftruncate(fd, end + F.TRAILER_SIZE)
                    self._write_summary(n, oa, F.Trailer.unpack(tail).amac)
                    self.write_head()
                    self.repaired.append(f"finished sealing arena {n}")
                return None
            if self.writable:
                log.warning("arena %d: cutting torn tail at offset %d (%d bytes, %s)", n, end, size - end,
                            err.kind if err else "unwritten")
                os.ftruncate(fd, end)
                self.repaired.append(f"cut torn tail of arena {n} at offset {end} ({size - end} bytes)")
        if not self.writable:
            # A reader trusts only what the head committed.
            k = sum(1 for a in oa.addrs if F.split(a)[1] < committed)
            del oa.addrs[k:]
            del oa.types[k:]
            del oa.keys[k * self.keylen:]
            del oa.tags[k * 16:]
            oa.end = committed
        return oa

    def _valid_trailer(self, n, oa, b):
        try:
            tr = F.Trailer.unpack(b)
        except ValueError:
            return False
        prev = self.head.chain
        amac = F.arena_mac(self.keys.mac, oa.hbytes, bytes(oa.tags), oa.count, oa.end)
        return tr.end == oa.end and tr.count == oa.count and tr.amac == amac and \
            tr.chain == F.chain_mac(self.keys.mac, prev, n, amac)

    def scan(self, n, iv, buf, base, verify=True):
        """Records of one arena region -> ([(off, btype, key, stored, raw, tag)], end, error)."""
        entries, end, err = native.scan(self.codec, n, iv, buf, base, verify)
        out = []
        for off, btype, key, stored, raw in entries:
            o = off - base
            out.append((off, btype, key[: self.keylen], stored, raw, L.tag(buf, o)))
        return out, end, err

    # ---- files -----------------------------------------------------------------

    def path(self, n):
        return os.path.join(self.dir, F.arena_name(n))

    def fd(self, n):
        fd = self.fds.get(n)
        if fd is not None:
            self.fds.move_to_end(n)
            return fd
        try:
            fd = os.open(self.path(n), os.O_RDWR if self.writable else os.O_RDONLY)
        except FileNotFoundError:
            raise DataCorrupt(f"arena {n} is missing ({self.path(n)})") from None
        self.fds[n] = fd
        while len(self.fds) > MAX_FDS:
            old, ofd = self.fds.popitem(last=False)
            if self.open is not None and old == self.open.n:
                self.fds[old] = ofd
                continue
            if old in self.dirty:
                self.disk.fsync(ofd, "arena")
                self.dirty.discard(old)
            os.close(ofd)
        return fd

    def forget(self, n):
        """Arena n's file is about to be replaced: close it and drop what was read from it."""
        fd = self.fds.pop(n, None)
        if fd is not None:
            os.close(fd)
        self.ivs.pop(n, None)
        self.window = None

    def file_size(self, n):
        return os.path.getsize(self.path(n))

    def record_header(self, n, off):
        """The header bytes of the record at offset off of arena n, as they are (not verified)."""
        return self.disk.pread(self.fd(n), "arena", off, L.HEADER_SIZE)

    def close(self):
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

    def trailer(self, n):
        """The trailer of sealed arena n (either generation), or None if its file has none."""
        fd = self.fd(n)
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

    def write_head(self):
        oa = self.open
        if oa is not None and oa.n == self.head.arena:
            self.head.end, self.head.count = oa.end, oa.count
        atomic_write(os.path.join(self.root, F.HEAD), self.head.pack(self.keys.mac))
        self.disk.count_write("head", "head", 0, F.HEAD_SIZE)

    # ---- writing ---------------------------------------------------------------

    def append(self, btype, buf, bs, keys, threads=1):
        """Append len(buf)//bs blocks (or one short block) as records; return their
        addresses and the summary entries [(key, addr, btype)] of the new records."""
        n = max(1, len(buf) // bs)
        addrs = []
        i = 0
        while i < n:
            oa = self.open
            room = self.arena_size - F.TRAILER_SIZE - oa.end
            if room < RH + 16:
                self.seal()
                continue
            # Pack about what fits, judged by the size of recent records;
            # records past the arena's end are packed again into the next one.
            m = min(n - i, max(16, int(room / self.avg_record * 1.03) + 8))
            recs, offs = native.pack(self.codec, oa.n, oa.header.iv, oa.end, btype,
                                     buf[i * bs:(i + m) * bs], bs, keys[i * 32:(i + m) * 32], threads)
            ends = offs[1:] + [oa.end + len(recs)]
            k = bisect.bisect_right(ends, oa.end + room)  # ends ascend
            if k == 0:
                self.seal()
                continue
            used = ends[k - 1] - oa.end
            self.avg_record = max(RH + 1, (ends[-1] - oa.end) / len(ends))
            self.disk.pwrite(oa.fd, "arena", oa.end, memoryview(recs)[:used])
            first = len(oa.addrs)
            oa.add_packed(recs, [o - oa.end for o in offs[:k]], offs[:k], btype, keys[i * 32:(i + k) * 32],
                          self.keylen)
            addrs += oa.addrs[first:]
            oa.end += used
            i += k
        return addrs

    def seal(self):
        """Seal the open arena and start the next one (write order: trailer,
        fsync, summary, new arena, head)."""
        oa = self.open
        amac = F.arena_mac(self.keys.mac, oa.hbytes, bytes(oa.tags), oa.count, oa.end)
        chain = F.chain_mac(self.keys.mac, self.head.chain, oa.n, amac)
        self.disk.pwrite(oa.fd, "arena", oa.end, F.Trailer(oa.count, oa.end, amac, chain).pack())
        # No fsync here: the next sync() makes every arena written since the
        # last one durable before the head names them (see docs/format.md).
        self.dirty.add(oa.n)
        self._write_summary(oa.n, oa, amac)
        if self.on_seal:
            self.on_seal(oa)
        self.open = self._create_arena(oa.n + 1)
        self.head = F.Head(oa.n + 1, F.ARENA_HEADER_SIZE, 0, chain)

    on_seal = None

    def _write_summary(self, n, oa, amac):
        b = F.pack_summary(n, self.keylen, amac, oa.keys, oa.addrs, oa.types)
        os.makedirs(self.sumdir, exist_ok=True)
        atomic_write(os.path.join(self.sumdir, F.summary_name(n)), b, sync=False)
        self.disk.count_write("summary", "sum%d" % n, 0, len(b))

    def sync(self):
        for n in sorted(self.dirty):
            self.disk.fsync(self.fd(n), "arena")
        self.disk.fsync(self.open.fd, "arena")
        if self.dirty:
            fsync_dir(self.dir)  # the names of the arenas created since the last sync
        self.dirty.clear()
        self.write_head()

    @property
    def end_addr(self):
        return F.addr(self.open.n, self.open.end)

    # ---- reading ---------------------------------------------------------------

    def read(self, address):
        """-> (btype, key, data) of the record at `address`; DataCorrupt if it does not verify."""
        n, off = F.split(address)
        w = self.window
        if w and w[0] == n and w[1] <= off and off + RH <= w[1] + len(w[2]):
            rec = memoryview(w[2])[off - w[1]:]
            if self._complete(rec):
                return self._unpack(n, off, rec)
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
        return self._unpack(n, off, b)

    def read_many(self, addresses, tolerant=False):
        """Read many records, sorted by log address and merged into spans;
        with `tolerant`, damaged records are left out instead of raising."""
        out = {}
        addrs = sorted(set(addresses))
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
            b = self.disk.pread(self.fd(n), "arena", start, size)
            group = addrs[i:j]
            got = native.unpack_many(self.codec, n, self.iv(n), b, start, [a & 0xFFFFFFFF for a in group],
                                     self.threads)
            for a, v in zip(group, got):
                if isinstance(v, native.RecordError):
                    if not tolerant:
                        raise DataCorrupt(f"arena {n} offset {v.offset}: record {v.kind} check failed")
                    continue
                out[a] = v
            i = j
        return out

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

    def _unpack(self, n, off, rec):
        try:
            return native.unpack(self.codec, n, self.iv(n), off, rec)
        except native.RecordError as e:
            kind = e.kind
        # Raised outside the handler: a chained RecordError would keep the
        # frames (and the buffers they lent to C) alive with the exception.
        raise DataCorrupt(f"arena {n} offset {off}: record {kind} check failed")
