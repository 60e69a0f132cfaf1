"""The content-addressed store of paper §3 (Figure 4b and 4c), on one disk.

A write is decided fresh or duplicate without touching the disk in the
common cases: the in-memory index cache (write buffer + recently loaded
arena summaries) answers duplicates of recent data, and the Bloom filter
answers fresh data; only a Bloom "maybe" costs an index seek, after which
the whole summary of the hit's arena is loaded, so the rest of a sequential
run is answered from memory. Compare-by-hash names a block by its score;
compare-by-value names it by its log address and checks every candidate
byte for byte. The "venti" policy turns those tricks off, for benchmarks.
"""

import array
import bisect
import json
import logging
import os
import sys
import uuid as uuidlib
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import datetime, timezone

import pybloomfilter

from foundation import native
from foundation.crypto.keys import Keys, create_key_file
from foundation.errors import (BadInput, DataCorrupt, DerivedCorrupt, NotFound, StoreBusy, StoreMissing,
                               StoreNotEmpty, UsageError)
from foundation.store import format as F
from foundation.store import primary, switch
from foundation.store.arena import Log
from foundation.store.disk import Disk, atomic_write
from foundation.store.index import Index, IndexFull, plan

log = logging.getLogger(__name__)

DATA, TREE, CATALOG = F.DATA, F.TREE, F.CATALOG


class BlockType:
    DATA = F.DATA
    TREE = F.TREE
    CATALOG = F.CATALOG


@dataclass
class Tuning:
    """Memory and policy knobs; none of them changes a byte on disk."""

    index_cache_bytes: int = 64 << 20  # loaded arena summaries (LRU)
    write_buffer_bytes: int = 128 << 20  # index entries waiting for a flush
    block_cache_bytes: int = 32 << 20  # decoded blocks (LRU)
    policy: str = "foundation"  # or "venti": no Bloom filter, summaries or write buffer
    flush_at_close: float = 0.25  # flush the write buffer at close when at least this full
    zlevel: int = 1  # zstd level 1: ~3x faster than 3 for ~5 % more bytes
    threads: int = field(default_factory=lambda: min(4, os.cpu_count() or 1))


class LRU:
    """A byte-bounded LRU map."""

    def __init__(self, limit):
        self.limit, self.size, self.d = limit, 0, OrderedDict()

    def get(self, k):
        e = self.d.get(k)
        if e is None:
            return None
        self.d.move_to_end(k)
        return e[0]

    def put(self, k, v, size):
        if k in self.d:
            return
        self.d[k] = (v, size)
        self.size += size
        while self.size > self.limit and len(self.d) > 1:
            _, (_, s) = self.d.popitem(last=False)
            self.size -= s

    def clear(self):
        self.d.clear()
        self.size = 0

    def __len__(self):
        return len(self.d)


class Store:
    """Open with Store.open(); a context manager. See docs/design.md."""

    # ---- creating ------------------------------------------------------------

    @staticmethod
    def create(path, mode="hash", block_size=4096, arena_size=16 << 20, max_log_size=256 << 30,
               encrypt=True, key_file=None, passphrase=None):
        """Make a new store in the empty directory `path`; returns the key file path (or None)."""
        if mode not in ("hash", "value"):
            raise BadInput(f"mode must be 'hash' or 'value', not {mode!r}")
        if block_size < 512 or block_size > 65536 or block_size & (block_size - 1):
            raise BadInput(f"block size must be a power of two from 512 to 65536, not {block_size}")
        if arena_size < 64 * block_size or arena_size > (1 << 32) - 1:
            raise BadInput(f"arena size must be at least 64 blocks ({64 * block_size}) and below 4 GiB, not {arena_size}")
        if max_log_size < arena_size:
            raise BadInput("the maximum log size must be at least one arena")
        if not os.path.isdir(path):
            raise StoreMissing(path)
        if os.listdir(path):
            raise StoreNotEmpty(path)
        su = str(uuidlib.uuid4())
        keys = Keys.unkeyed()
        if encrypt:
            key_file = key_file or primary.default_key_path(su)
            os.makedirs(os.path.dirname(os.path.abspath(key_file)), mode=0o700, exist_ok=True)
            if os.path.realpath(os.path.dirname(os.path.abspath(key_file))).startswith(os.path.realpath(path) + os.sep):
                raise BadInput("the key file must not be kept inside the store: the store disk may be stolen")
            master = create_key_file(key_file, su, passphrase)
            keys = Keys.derive(master, su)
        keylen = 32 if mode == "hash" else 8
        home, _ = plan(primary.capacity(max_log_size, block_size), keylen)
        conf = dict(format="foundation-store", version=F.VERSION, uuid=su, mode=mode, block_size=block_size,
                    arena_size=arena_size, max_log_size=max_log_size, encrypted=bool(encrypt),
                    key_check=keys.check_value(), index_buckets=home, bucket_size=4096,
                    created=datetime.now(timezone.utc).isoformat(timespec="seconds"))
        os.makedirs(os.path.join(path, F.ARENAS))
        os.makedirs(os.path.join(path, F.SUMMARIES))
        disk = Disk(path)
        lg = Log(path, disk, primary.codec(keys, 0), keys, conf, True)
        lg.head = F.Head(0, F.ARENA_HEADER_SIZE, 0, F.ZERO_CHAIN)
        lg.open = lg._create_arena(0)
        lg.write_head()
        lg.close()
        primary.make_derived(path, disk, conf, keylen, lg.uuid)
        primary.write_config(path, F.pack_config(conf))
        return key_file if encrypt else None

    # ---- opening -------------------------------------------------------------

    @classmethod
    def open(cls, path, key_file=None, passphrase=None, writable=False, tuning=None, master=None,
             recovering=False):
        """`recovering`: foundation recover's own opens of a store it has not finished."""
        s = cls.__new__(cls)
        s._init(path, key_file, passphrase, writable, tuning or Tuning(), master, recovering)
        return s

    def _init(self, path, key_file, passphrase, writable, tuning, master, recovering=False):
        self.path, self.writable, self.tuning = path, writable, tuning
        self.lockfd = self.readfd = None
        self.index = self.bloom = None
        self.log = None
        conf, _ = primary.read_config(path, recovering=recovering)
        self.conf = conf
        self.uuid = conf["uuid"]
        self.mode = conf["mode"]
        self.block_size = conf["block_size"]
        self.arena_size = conf["arena_size"]
        self.ref_size = 32 if self.mode == "hash" else 8
        self.keylen = self.ref_size
        self.null_ref = bytes(self.ref_size)
        self.zero_block = bytes(self.block_size)
        self.keys, _ = primary.load_keys(conf, path, key_file, master, passphrase)
        if writable:
            self._lock()
        else:
            self._share()
        self.disk = Disk(path)
        self.codec = primary.codec(self.keys, tuning.zlevel)
        self.venti = tuning.policy == "venti"
        self.blocks = LRU(tuning.block_cache_bytes)
        self.summaries = OrderedDict()  # arena -> native.Table (the index cache)
        self.summary_entries = 0
        self.counters = self._load_counters()
        self.repaired = []
        self._recent = []  # summaries loaded by the current write batch
        try:
            self._open_structures()
        except BaseException:
            self.close()
            raise

    def _lock(self):
        self.lockfd = primary.lock_writer(self.path)

    def _share(self):
        """Readers hold a shared lock on `readers`, so gc never moves arenas under them."""
        self.readfd = primary.lock_readers(self.path, False, lambda: StoreBusy(
            f"garbage collection is running on store {self.path}; try again when it has finished"))

    def exclusive(self):
        """For gc: no reader may have the store open while arenas move."""
        self.readfd = primary.lock_readers(self.path, True, lambda: StoreBusy(
            f"store {self.path} is open for reading (the /snapshot tree is mounted, or a restore "
            "or replicate is running); stop it and run gc again"))

    def _open_structures(self):
        if switch.pending(self.path):
            if not self.writable:
                raise StoreBusy(f"a garbage collection of store {self.path} was interrupted; run `foundation gc` "
                                "(or any archive) to finish it")
            switch.finish(self.path)
            self.repaired.append("finished the switch of an interrupted gc")
        if self.writable:
            switch.drop_leftovers(self.path)
        self.log = Log(self.path, self.disk, self.codec, self.keys, self.conf, self.writable)
        self.log.threads = self.tuning.threads
        self.log.on_seal = self._sealed
        self.log.load()
        self.repaired += self.log.repaired
        self.bad = self._load_damaged()
        if self.log.damaged:
            self.remember_damaged(self.log.damaged)
        uuidb = self.log.uuid
        ipath = os.path.join(self.path, F.INDEX)
        try:
            self.index = Index.open(ipath, self.disk, self.keylen, uuidb, self.writable)
            if self.index.h.covered > self.log.end_addr:
                raise DerivedCorrupt("the index is ahead of the log")
        except DerivedCorrupt as e:
            if self.index:
                self.index.close()
                self.index = None
            if not self.writable:
                self.index = self._memory_index(e)
                return self._finish_open()
            log.warning("%s; rebuilding it from the arenas", e)
            self.repaired.append(f"rebuilt the index ({e})")
            from foundation.store.rebuild import rebuild_index
            rebuild_index(self)
        self._finish_open()

    def _finish_open(self):
        self._reset_buffer()
        self._catch_up(self.index.h.covered)
        if self.writable and not self.venti:
            self._open_bloom()

    def _memory_index(self, why):
        """A reader that finds the index unusable (a writer crashed mid-flush,
        say) builds one in memory from the summaries rather than fail."""
        from foundation.store.index import MemIndex
        log.warning("%s; reading with an index built in memory from the summaries", why)
        t = native.Table(self.keylen, 1024)
        count = 0
        for n in range(self.log.open.n):
            keys, addrs, _ = self._summary_arrays(n)
            t.add(bytes(keys), addrs)
            count += len(addrs)
        return MemIndex(t, count, F.addr(self.log.open.n, 0), self.keylen)

    def _reset_buffer(self):
        # The write buffer: entries of records not yet merged into the index,
        # as a lookup table and as parallel arrays of keys and addresses.
        self.wbuf = native.Table(self.keylen, 1024)
        self.pkeys = bytearray()
        self.paddrs = array.array("Q")
        oa = self.log.open
        self.open_table = native.Table(self.keylen, oa.count + 1024)
        if oa.count and not self.venti:  # Venti starts every session with a cold index cache
            self.open_table.add(bytes(oa.keys), oa.addrs)

    def _pending_entries(self):
        """The write buffer as index entries (key, u64le addr), unsorted."""
        kl = self.keylen
        ab = self.paddrs.tobytes() if sys.byteorder == "little" else _le(self.paddrs)
        return b"".join(self.pkeys[i * kl:(i + 1) * kl] + ab[i * 8:(i + 1) * 8] for i in range(len(self.paddrs)))

    def _catch_up(self, covered):
        """Put every record at or after `covered` into the write buffer."""
        ca, _ = F.split(covered)
        for n in range(ca, self.log.open.n):
            keys, addrs, _ = self._summary_arrays(n)
            self._buffer(keys, addrs, covered)
        oa = self.log.open
        self._buffer(oa.keys, oa.addrs, covered)

    def _buffer(self, keys, addrs, covered=0):
        kl = self.keylen
        first = bisect.bisect_left(addrs, covered)  # an arena's addresses ascend
        if first < len(addrs):
            ks, ads = bytes(keys[first * kl:len(addrs) * kl]), addrs[first:]
            self.wbuf.add(ks, ads)
            self.pkeys += ks
            self.paddrs.extend(ads)

    def _open_bloom(self):
        p = os.path.join(self.path, F.BLOOM)
        sp = os.path.join(self.path, F.BLOOM_STATE)
        # The filter holds every key below its `covered`, which lies between
        # the index's and the log's end; anything else means a rebuild.
        try:
            with open(sp) as f:
                covered = json.load(f).get("covered")
            if not isinstance(covered, int) or not self.index.h.covered <= covered <= self.log.end_addr:
                raise ValueError("stale")
            self.bloom = pybloomfilter.BloomFilter.open(p)
        except (OSError, ValueError):
            self.repaired.append("rebuilt the Bloom filter")
            from foundation.store.rebuild import rebuild_bloom
            rebuild_bloom(self)
            covered = self.index.h.covered
        # Keys written after that are in the write buffer; add them.
        kl = self.keylen
        first = bisect.bisect_left(self.paddrs, covered)
        self.bloom.update(bytes(self.pkeys[i * kl:(i + 1) * kl]) for i in range(first, len(self.paddrs)))

    def _save_bloom(self):
        self.bloom.sync()
        atomic_write(os.path.join(self.path, F.BLOOM_STATE),
                     json.dumps({"covered": self.log.end_addr}).encode(), sync=False)

    def bloom_capacity(self):
        return primary.bloom_capacity(self.conf)

    def forget_damaged(self, n):
        """Arena n was rewritten: the damaged records known there are gone (gc kept intact copies)."""
        self.bad = {a for a in self.bad if a >> 32 != n}

    def skip_records(self, addrs):
        """Never deduplicate against the records at these addresses in this session (known damaged)."""
        self.bad |= set(addrs)

    def rebuild_derived(self):
        """After records moved (gc) or summaries were rebuilt: index and Bloom filter rebuilt from the
        summaries, every cache started afresh."""
        from foundation.store.rebuild import rebuild_bloom, rebuild_index
        self.summaries.clear()
        self.summary_entries = 0
        self.blocks.clear()
        rebuild_index(self)
        rebuild_bloom(self)
        self._reset_buffer()
        self._catch_up(self.index.h.covered)

    def forget_summary(self, n):
        """Arena n was replaced (gc, repair): its summary leaves the index cache."""
        t = self.summaries.pop(n, None)
        if t is not None:
            self.summary_entries -= len(t)

    def _sealed(self, oa):
        """An arena was sealed: its in-memory summary joins the index cache."""
        t = native.Table(self.keylen, oa.count + 1)
        t.add(bytes(oa.keys), oa.addrs)
        self.summaries[oa.n] = t
        self.summary_entries += len(t)
        self.open_table = native.Table(self.keylen, 4096)

    # ---- closing ---------------------------------------------------------------

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close(clean=exc[0] is None)

    def suspend(self):
        """Close the log and derived structures, keeping the locks (gc switches the log)."""
        self._close_structures()

    def resume(self):
        self.summaries.clear()
        self.summary_entries = 0
        self.blocks.clear()
        self._open_structures()

    def close(self, clean=True):
        try:
            if self.writable and clean and self.log is not None and self.index is not None:
                self.sync()
                # A flush is a pass over the whole index: worth it only for a
                # big buffer. Fewer entries are found again at the next open
                # from the summaries of the arenas after the index's `covered`.
                if self.venti or len(self.paddrs) * (self.keylen + 8) >= \
                        self.tuning.write_buffer_bytes * self.tuning.flush_at_close:
                    self.flush()
                elif self.bloom is not None:
                    self._save_bloom()
        finally:
            self._close_structures()
            for fd in (self.lockfd, self.readfd):
                if fd is not None:
                    os.close(fd)
            self.lockfd = self.readfd = None

    def _close_structures(self):
        if self.index:
            self.index.close()
            self.index = None
        if self.bloom is not None:
            self.bloom.close()
            self.bloom = None
        if self.log:
            self.log.close()
            self.log = None

    def sync(self):
        """The commit point: everything written so far survives a crash."""
        self._need_writable()
        self.log.sync()
        atomic_write(os.path.join(self.path, F.COUNTERS), json.dumps(self.counters).encode(), sync=False)

    def flush(self):
        """Merge the write buffer into the on-disk index in one sorted pass."""
        self._need_writable()
        if self.log.end_addr == self.index.h.covered and not self.paddrs:
            return
        # The index may only cover committed records: a cut tail must never
        # leave an index entry behind that names a block we no longer have.
        self.log.sync()
        entries = bytearray(self._pending_entries())
        native.sort_entries(entries, self.keylen + 8, self.keylen)
        covered = self.log.end_addr
        try:
            self.index.flush(bytes(entries), covered)
        except IndexFull:
            from foundation.store.rebuild import grow_index
            grow_index(self, bytes(entries), covered)
        if self.bloom is not None:
            self._save_bloom()
        self.wbuf = native.Table(self.keylen, 1024)
        self.pkeys = bytearray()
        self.paddrs = array.array("Q")

    def _need_writable(self):
        if not self.writable:
            raise UsageError("the store was opened read-only")

    # ---- the index cache -------------------------------------------------------

    def _load_damaged(self):
        """Addresses of records known to be damaged (by `verify`, or stepped
        over at open). Deduplication never points at them, so the next archive
        that meets such a block stores it again and heals the archive (§3.4)."""
        bad = {F.addr(n, o) for n, o in self.log.damaged}
        try:
            with open(os.path.join(self.path, F.DAMAGED)) as f:
                recs = json.load(f)["records"]
            # [arena, offset, generation]: written by gc before it swapped in a
            # rewritten arena; it names a record of that generation only.
            gen = {n: self._generation(n) for n, _, *g in recs if g}
            bad |= {F.addr(n, o) for n, o, *g in recs if not g or gen[n] == g[0]}
        except (OSError, ValueError, KeyError, TypeError):
            pass
        return bad

    def remember_damaged(self, pairs):
        """Records found damaged while scanning (stepped over in the open arena, left out of a
        rebuilt summary): no summary lists them, so they go into damaged.json (when writable),
        where deduplication, gc and later sessions find them."""
        self.bad |= {F.addr(n, o) for n, o in pairs}
        if not self.writable:
            return
        path = os.path.join(self.path, F.DAMAGED)
        try:
            with open(path) as f:
                recs = list(json.load(f)["records"])
        except (OSError, ValueError, KeyError, TypeError):
            recs = []
        have = {(r[0], r[1]) for r in recs}
        add = [[n, o] for n, o in sorted(set(pairs)) if (n, o) not in have]
        if add:
            atomic_write(path, json.dumps({"records": recs + add}).encode())

    def _generation(self, n):
        try:
            tr = self.log.trailer(n) if n < self.log.open.n else None
        except DataCorrupt:
            tr = None
        return tr.generation if tr else None

    def _drop_bad(self, keys, addrs, types):
        kl = self.keylen
        keep = [i for i, a in enumerate(addrs) if a not in self.bad]
        return (b"".join(keys[i * kl:(i + 1) * kl] for i in keep), [addrs[i] for i in keep],
                bytes(types[i] for i in keep))

    def _missing(self, score):
        """Raise the right error for a score nothing readable holds."""
        for n in sorted({F.split(a)[0] for a in self.bad}):
            if n < self.log.open.n:
                keys, addrs, _ = self.summary_records(n)
                for i, a in enumerate(addrs):
                    if a in self.bad and keys[i * 32:(i + 1) * 32] == score:
                        raise DataCorrupt(f"arena {n} offset {a & 0xFFFFFFFF}: the only copy of block "
                                          f"{score.hex()[:16]}… is damaged")
        known = self.log.damaged or sorted(F.split(a) for a in self.bad)
        if known:   # a record left out of its summary or index because it is damaged
            n, o = known[0]
            raise DataCorrupt(f"arena {n} offset {o}: block {score.hex()[:16]}… is missing, "
                              "most likely in this damaged record")
        raise NotFound(f"block {score.hex()} is not in the store")

    def _summary_arrays(self, n):
        """(keys, addrs, types) of sealed arena n, from its summary file or a
        scan, without the records known to be damaged."""
        keys, addrs, types = self.summary_records(n)
        if self.bad and addrs and any(F.split(a)[0] == n for a in self.bad):
            return self._drop_bad(keys, addrs, types)
        return keys, addrs, types

    def summary_records(self, n):
        """(keys, addrs, types) of sealed arena n from its summary (rebuilt if it is missing, damaged or
        of another version of the arena), every record included, damaged ones too."""
        p = os.path.join(self.path, F.SUMMARIES, F.summary_name(n))
        try:
            with open(p, "rb") as f:
                b = f.read()
            self.disk.count_read("summary", p, 0, len(b))
            arena, keylen, amac, keys, addrs, types = F.unpack_summary(b)
            if arena != n or keylen != self.keylen:
                raise ValueError("summary of another arena")
            try:
                tr = self.log.trailer(n)
            except DataCorrupt:
                tr = None
            if tr is not None and amac != tr.amac:   # e.g. a gc swap cut short by a power loss
                from foundation.store.rebuild import rebuild_summary
                log.warning("summary of arena %d is of another version of the arena; rebuilding it", n)
                try:
                    return rebuild_summary(self, n, write=self.writable)
                except DataCorrupt:
                    pass   # the arena itself is wrong (moved, reordered): reads and verify say so
            return keys, addrs, types
        except (OSError, ValueError) as e:
            from foundation.store.rebuild import rebuild_summary
            if not isinstance(e, FileNotFoundError):
                log.warning("summary of arena %d is damaged (%s); rebuilding it", n, e)
            return rebuild_summary(self, n, write=self.writable)

    def _load_summary(self, n):
        """Load arena n's whole summary into the index cache (paper §3.2)."""
        t = self.summaries.get(n)
        if t is not None:
            self.summaries.move_to_end(n)
            return t
        if n == self.log.open.n:
            return self.open_table
        keys, addrs, _ = self._summary_arrays(n)
        t = native.Table(self.keylen, len(addrs) + 1)
        t.add(bytes(keys), addrs)
        self.summaries[n] = t
        self.summary_entries += len(addrs)
        limit = self.tuning.index_cache_bytes // (self.keylen + 24)
        while self.summary_entries > limit and len(self.summaries) > 1:
            _, old = self.summaries.popitem(last=False)
            self.summary_entries -= len(old)
        return t

    def _tables(self):
        return [self.open_table, self.wbuf] + list(reversed(self.summaries.values()))

    def _index_lookup(self, key):
        """Addresses the on-disk index has for key (Bloom already said maybe)."""
        addrs = self.index.lookup(key)
        if not addrs and not self.writable and self.index.h.covered < self.log.end_addr:
            self.index.reread_header()
        return [a for a in addrs if a not in self.bad] if self.bad else addrs

    def _locate(self, score):
        """Log address of the block with this score (compare-by-hash), or None,
        after a miss in the index cache: recent summaries, then the on-disk index."""
        for t in self._recent:
            a = t.find(score)
            if a:
                return a[0]
        for a in self._index_lookup(score):
            if self.venti:
                self._venti_cache(score, [a])
                return a
            t = self._load_summary(F.split(a)[0])
            if a in t.find(score):
                self._recent = [t] + self._recent[:3]
                return a
        return None

    # ---- writing ---------------------------------------------------------------

    def write(self, data, btype=DATA):
        """Store one block (at most block_size bytes); returns its ref."""
        if not 0 < len(data) <= self.block_size:
            raise BadInput(f"a block must hold 1 to {self.block_size} bytes, not {len(data)}")
        return self._write(data, len(data), btype)

    def write_blocks(self, buf, btype=DATA):
        """Store len(buf)//block_size whole blocks; returns their refs concatenated."""
        bs = self.block_size
        if len(buf) % bs:
            raise BadInput(f"write_blocks needs whole blocks of {bs} bytes, got {len(buf)} bytes")
        if not buf:
            return b""
        return self._write(buf, bs, btype)

    def _write(self, buf, bs, btype):
        self._need_writable()
        self._recent = []
        n = len(buf) // bs
        zero = native.zero_flags(buf, bs) if btype == DATA and bs == self.block_size else bytes(n)
        c = self.counters
        c["offered_blocks"] += n
        c["offered_bytes"] += len(buf)
        if self.mode == "hash":
            keys = native.scores(buf, bs, btype, key=self.keys.score, skip=zero, threads=self.tuning.threads)
            return self._write_hash(buf, bs, btype, zero, keys, n)
        weak = native.weak_hashes(buf, bs, btype, self.keys.weak_seed, skip=zero)
        return self._write_value(buf, bs, btype, zero, weak, n)

    def _write_hash(self, buf, bs, btype, zero, keys, n):
        addrs, which = native.tables_lookup(self._tables(), keys, zero)
        fresh, seen = [], set()
        zeros = dups = 0
        for i in range(n):
            if zero[i]:
                zeros += 1
                continue
            if which[i] >= 0:
                dups += 1
                continue
            k = keys[i * 32:(i + 1) * 32]
            if k in seen or self._exists(k):
                dups += 1
                continue
            seen.add(k)
            fresh.append(i)
        self._count(zeros, dups)
        if fresh:
            fkeys = keys if len(fresh) == n else b"".join(keys[i * 32:(i + 1) * 32] for i in fresh)
            self._append(buf, bs, btype, fresh, fkeys)
        if not zeros:
            return bytes(keys)
        return b"".join(bytes(32) if zero[i] else keys[i * 32:(i + 1) * 32] for i in range(n))

    def _exists(self, score):
        """A duplicate check that missed the index cache: Bloom, then index."""
        for t in self._recent:
            if t.find(score):
                return True
        if self.bloom is not None and score not in self.bloom:
            return False
        return self._locate(score) is not None

    def _venti_cache(self, keys, addrs):
        """Venti's index cache: single entries looked up or written, not summaries."""
        t = self.summaries.get(-1)
        if t is None or len(t) > self.tuning.index_cache_bytes // (self.keylen + 24):
            t = self.summaries[-1] = native.Table(self.keylen, 1024)
        t.add(keys, addrs)

    def _write_value(self, buf, bs, btype, zero, weak, n):
        refs = bytearray(n * 8)
        fresh = []
        batch = {}  # weak hash -> indexes of fresh blocks in this batch
        later = []
        zeros = dups = 0
        mv = memoryview(buf)
        tables = self._tables()
        first, which = native.tables_lookup(tables, weak, zero)
        # Compare every block with its first candidate, read in one sorted
        # batch: a sequential duplicate run costs one span read per arena.
        known = self._read_addrs({first[i] for i in range(n) if which[i] >= 0})
        for i in range(n):
            if zero[i]:
                zeros += 1
                continue
            w = weak[i * 8:(i + 1) * 8]
            block = mv[i * bs:(i + 1) * bs]
            a = None
            if which[i] >= 0:
                v = known.get(first[i])
                if v is not None and v[0] == btype and native.equal(v[1], block):
                    a = first[i]
                else:
                    a = self._match(block, btype, (c for t in tables for c in t.find(w)))
            if a is None:
                for j in batch.get(w, ()):
                    if native.equal(mv[j * bs:(j + 1) * bs], block):
                        a = -1 - j
                        break
            if a is None:
                a = self._match_disk(block, btype, w)
            if a is None:
                batch.setdefault(w, []).append(i)
                fresh.append(i)
                continue
            dups += 1
            if a >= 0:
                refs[i * 8:(i + 1) * 8] = a.to_bytes(8, "big")
            else:
                later.append((i, -1 - a))  # a duplicate of a fresh block of this batch
        self._count(zeros, dups)
        if fresh:
            keys = b"".join(weak[i * 8:(i + 1) * 8] + bytes(24) for i in fresh)
            addrs = self._append(buf, bs, btype, fresh, keys)
            for i, a in zip(fresh, addrs):
                refs[i * 8:(i + 1) * 8] = a.to_bytes(8, "big")
        for i, j in later:
            refs[i * 8:(i + 1) * 8] = refs[j * 8:(j + 1) * 8]
        return bytes(refs)

    def _match(self, block, btype, candidates):
        """The first candidate address whose block equals `block`, compared byte for byte."""
        for a in candidates:
            try:
                t, data = self._read_addr(a)
            except DataCorrupt as e:
                log.warning("skipping damaged dedup candidate: %s", e)
                continue
            if t == btype and native.equal(data, block):
                return a
        return None

    def _match_disk(self, block, btype, w):
        for t in self._recent:
            a = self._match(block, btype, t.find(w))
            if a is not None:
                return a
        if self.bloom is not None and w not in self.bloom:
            return None
        for a in self._index_lookup(w):
            if self._match(block, btype, [a]) is not None:
                if not self.venti:
                    self._recent = [self._load_summary(F.split(a)[0])] + self._recent[:3]
                else:
                    self._venti_cache(w, [a])
                return a
        return None

    def _count(self, zeros, dups):
        self.counters["zero_blocks"] += zeros
        self.counters["dup_blocks"] += dups

    def _append(self, buf, bs, btype, fresh, fkeys):
        """Append the fresh blocks (fkeys: their 32-byte key fields) to the log
        and index them; returns their addresses."""
        if len(fresh) * bs == len(buf) or len(fresh) == 1 and bs == len(buf):
            data = buf
        else:
            mv = memoryview(buf)
            data = b"".join(mv[i * bs:(i + 1) * bs] for i in fresh)
        addrs = self.log.append(btype, data, bs, fkeys, self.tuning.threads)
        kl = self.keylen
        ks = bytes(fkeys[:len(addrs) * 32]) if kl == 32 else b"".join(
            fkeys[i * 32:i * 32 + kl] for i in range(len(addrs)))
        self.counters["records"] += len(addrs)
        self.counters["raw_bytes"] += len(data)
        if self.venti:
            # Venti: every new entry goes straight into its on-disk bucket.
            self.index.insert(b"".join(ks[i * kl:(i + 1) * kl] + a.to_bytes(8, "little")
                                       for i, a in enumerate(addrs)))
            self._venti_cache(ks, addrs)
            return addrs
        self.wbuf.add(ks, addrs)
        # Records sealed into an earlier arena by this append are already in
        # the index cache (_sealed); the rest belong to the open arena.
        first = bisect.bisect_left(addrs, self.log.open.n << 32)  # addresses ascend
        if first < len(addrs):
            self.open_table.add(ks[first * kl:], addrs[first:])
        self.pkeys += ks
        self.paddrs.extend(addrs)
        if self.bloom is not None:
            self.bloom.update(ks[i * kl:(i + 1) * kl] for i in range(len(addrs)))
        if len(self.paddrs) * (kl + 8) >= self.tuning.write_buffer_bytes:
            self.flush()
        return addrs

    # ---- reading ---------------------------------------------------------------

    def _read_addr(self, a):
        """(btype, data) of the record at log address a, through the block cache."""
        r = a.to_bytes(8, "big")
        v = self.blocks.get(r)
        if v is not None:
            return v
        btype, _key, data = self.log.read(a)
        v = (btype, data)
        self.blocks.put(r, v, len(data) + 64)
        return v

    def _read_addrs(self, addrs):
        """{address: (btype, data)} for many addresses; damaged ones are left out."""
        out, need = {}, []
        for a in addrs:
            v = self.blocks.get(a.to_bytes(8, "big"))
            if v is not None:
                out[a] = v
            else:
                need.append(a)
        if need:
            got = self.log.read_many(need, tolerant=True)  # the slow path skips damage
            for a, (btype, _key, data) in got.items():
                out[a] = (btype, data)
                self.blocks.put(a.to_bytes(8, "big"), out[a], len(data) + 64)
        return out

    def read(self, ref):
        """The block named by ref; exactly what was written, or DataCorrupt."""
        if ref == self.null_ref:
            return self.zero_block
        return self.read_blocks(ref)[0]

    def read_blocks(self, refs):
        """The blocks named by the concatenated refs, read sorted by log address."""
        rs = self.ref_size
        n = len(refs) // rs
        if len(refs) != n * rs:
            raise BadInput(f"refs must be a multiple of {rs} bytes")
        refs = bytes(refs)
        out = [None] * n
        todo = []
        self._recent = []
        for i in range(n):
            r = refs[i * rs:(i + 1) * rs]
            if r == self.null_ref:
                out[i] = self.zero_block
                continue
            v = self.blocks.get(r)
            if v is not None:
                out[i] = v[1]
            else:
                todo.append(i)
        if not todo:
            return out
        need = {}  # address -> positions
        if self.mode == "hash":
            keys = b"".join(refs[i * 32:(i + 1) * 32] for i in todo)
            addrs, which = native.tables_lookup(self._tables(), keys, None)
            for j, i in enumerate(todo):
                a = addrs[j] if which[j] >= 0 else self._locate(keys[j * 32:(j + 1) * 32])
                if a is None:
                    self._missing(keys[j * 32:(j + 1) * 32])
                need.setdefault(a, []).append(i)
        else:
            for i in todo:
                need.setdefault(int.from_bytes(refs[i * 8:(i + 1) * 8], "big"), []).append(i)
        if len(need) == 1:
            a = next(iter(need))
            got = {a: self.log.read(a)}
        else:
            got = self.log.read_many(need)
        cache = len(need) <= 64  # a streaming batch would only flush the cache
        for a, pos in need.items():
            btype, key, data = got[a]
            r = refs[pos[0] * rs:(pos[0] + 1) * rs]
            if self.mode == "hash" and key != r:
                raise DerivedCorrupt(f"the index names arena {a >> 32} offset {a & 0xFFFFFFFF} for a block it does not hold")
            if cache:
                self.blocks.put(r, (btype, data), len(data) + 64)
            for i in pos:
                out[i] = data
        return out

    def latest(self, btype):
        """The ref of the newest record of this type in the log, or None."""
        oa = self.log.open
        for i in range(oa.count - 1, -1, -1):
            if oa.types[i] == btype:
                return self._ref(oa.keys, i, oa.addrs[i])
        for n in range(oa.n - 1, -1, -1):
            keys, addrs, types = self._summary_arrays(n)
            for i in range(len(addrs) - 1, -1, -1):
                if types[i] == btype:
                    return self._ref(keys, i, addrs[i])
        return None

    def _ref(self, keys, i, a):
        if self.mode == "hash":
            return bytes(keys[i * 32:(i + 1) * 32])
        return a.to_bytes(8, "big")

    def refresh(self):
        """For a reader: see what a writer committed since we opened. True if anything changed."""
        if self.writable:
            return False
        try:
            with open(os.path.join(self.path, F.HEAD), "rb") as f:
                b = f.read()
        except OSError:
            return False
        old = self.log.head
        h = F.Head.unpack(b, self.keys.mac)
        if (h.arena, h.end) == (old.arena, old.end):
            return False
        self.log.close()
        self.log = Log(self.path, self.disk, self.codec, self.keys, self.conf, False)
        self.log.threads = self.tuning.threads
        self.log.load()
        self.index.reread_header()
        self._reset_buffer()
        self._catch_up(self.index.h.covered)
        return True

    # ---- accounting --------------------------------------------------------------

    def _load_counters(self):
        c = dict(offered_blocks=0, offered_bytes=0, zero_blocks=0, dup_blocks=0, records=0, raw_bytes=0)
        try:
            with open(os.path.join(self.path, F.COUNTERS)) as f:
                c.update(json.load(f))
        except (OSError, ValueError):
            pass
        return c

    def log_bytes(self):
        """Bytes of the log on disk (all arenas)."""
        total = 0
        d = os.path.join(self.path, F.ARENAS)
        for name in os.listdir(d):
            if name.endswith(".arena"):
                total += os.path.getsize(os.path.join(d, name))
        return total

    def stats(self):
        from foundation.store.verify import stats
        return stats(self)


def _le(arr):
    a = array.array("Q", arr)
    a.byteswap()
    return a.tobytes()
