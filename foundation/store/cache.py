"""What the store keeps in memory: the write buffer, the index cache of arena summaries, the Bloom
filter and the block cache, and the knobs that size them.

None of it is primary: it is rebuilt from the summaries and the index at
every open (`_catch_up` puts the records the on-disk index does not cover
yet back into the write buffer), so losing it costs time, never data.
`IndexCache` is the part of Store that keeps it.
"""

import array
import bisect
import contextlib
import json
import logging
import os
import sys
from collections import OrderedDict

from foundation import native
from foundation.errors import DataCorrupt, DerivedCorrupt
from foundation.fields import Fields
from foundation.store import bloom
from foundation.store import format as F
from foundation.store.disk import atomic_write

log = logging.getLogger(__name__)


def _malloc_trim():
    """glibc's malloc_trim(3), or None elsewhere."""
    import ctypes  # here: only a flush needs it, and every command's start would pay the import

    try:
        f = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    f.argtypes = [ctypes.c_size_t]
    return f


_TRIM = False  # looked up at the first flush


def give_back():
    """Hand freed heap memory back to the system. glibc keeps a freed block below its (adaptive,
    up to 32 MiB) mmap threshold for reuse: a flush that let go of a write buffer of tens of MB
    would otherwise leave them counted in the process until it exits."""
    global _TRIM
    if _TRIM is False:
        _TRIM = _malloc_trim()
    if _TRIM is not None:
        _TRIM(0)


class Tuning(Fields):
    """Memory and policy knobs; none of them changes a byte on disk. Tuning(name=value, ...) sets
    any of them; the class's values are the defaults."""

    # Loaded arena summaries (LRU), counted at K + 24 bytes an entry; a table takes ~1.3x that
    # (600 k entries, ~40 MB, in hash mode: the summaries of ~2.3 GiB of log).
    index_cache_bytes = 32 << 20
    # Index entries waiting for a flush, counted at K + 8 bytes each: 419 k entries in hash mode,
    # held once, in a lookup table of K + 12 bytes an entry and 512 k slots of 8 bytes (~22 MB);
    # a flush takes the table's own entries and sorts them in place.
    write_buffer_bytes = 16 << 20
    block_cache_bytes = 32 << 20  # decoded blocks (LRU)
    policy = "foundation"  # or "venti": no Bloom filter, summaries or write buffer
    flush_at_close = 0.25  # flush the write buffer at close when at least this full,
    flush_arenas = 4  # or when it holds records of more sealed arenas than this
    flush_share = 0.125  # and at least this share of the index's entries
    zlevel = None  # the zstd level of writes; None: the store's `compression` setting
    threads = None  # threads of the C core's batches; None: the cores, up to 4

    def __init__(self, **knobs):
        self._set(knobs)
        if self.threads is None:
            self.threads = min(4, os.cpu_count() or 1)


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

AHEAD_KEYS = 512  # prefetch asks for at most this many keys' buckets at once (16 KiB each)


def _willneed(fd, spans):
    """Ask the kernel to start reading these (offset, length) spans of fd (length 0: to the end),
    lowest offset first; it returns at once, the reads that follow wait only for what is left."""
    for off, n in sorted(spans):
        try:
            os.posix_fadvise(fd, off, n, os.POSIX_FADV_WILLNEED)
        except OSError:
            return  # only a hint: the reads themselves report any error


class IndexCache:
    """Store's in-memory structures (mixed into foundation.store.store.Store)."""

    def _reset_buffer(self):
        # The write buffer: entries of records not yet merged into the index, in log order, in
        # one lookup table (its entries() are what a flush merges: no second copy of them).
        self.wbuf = native.Table(self.keylen, 1024)
        self._ahead = {}  # key -> addresses: index lookups prefetch made, each used once
        self.holding = None  # (state, table of every intact record's ref) unreadable() made
        oa = self.log.open
        self.open_table = native.Table(self.keylen, oa.count + 1024)
        if oa.count and not self.venti:  # Venti starts every session with a cold index cache
            self.open_table.add(bytes(oa.keys), array.array("Q", oa.addrs))  # an array: no check per entry

    def _buffer_from(self, entries):
        """A write buffer holding these index entries again (a flush that failed gives them back)."""
        kl, es = self.keylen, self.keylen + 8
        entries = memoryview(entries)  # (a bytearray, or the buffer Table.take handed over)
        n = len(entries) // es
        keys = bytearray(n * kl)
        for j in range(kl):
            keys[j::kl] = entries[j::es]
        ab = bytearray(n * 8)
        for j in range(8):
            ab[j::8] = entries[kl + j::es]
        addrs = array.array("Q", bytes(ab))
        if sys.byteorder != "little":
            addrs.byteswap()
        t = native.Table(self.keylen, n + 1024)
        t.add(keys, addrs)
        return t

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
            # an array goes to the table without a check per entry
            self.wbuf.add(bytes(keys[first * kl:len(addrs) * kl]), array.array("Q", addrs[first:]))

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
            self.adopt_bloom(bloom.Bloom.open(p))
        except (OSError, ValueError):
            self.repaired.append("rebuilt the Bloom filter")
            from foundation.store.rebuild import rebuild_bloom
            rebuild_bloom(self)
            covered = self.index.h.covered
        # Keys written after that are in the write buffer; add them.
        kl, es = self.keylen, self.keylen + 8
        ents = self.wbuf.entries()
        first = bisect.bisect_left(range(len(ents) // es), covered,  # addresses ascend (log order)
                                   key=lambda i: int.from_bytes(ents[i * es + kl:(i + 1) * es], "little"))
        self.bloom.count = self.index.h.entries + first
        bloom.add_entries(self.bloom, memoryview(ents)[first * es:], kl)

    def adopt_bloom(self, bf):
        """Make bf the store's Bloom filter, grown (made again twice as large) once it is full."""
        self.bloom = bf
        bf.count = self.index.h.entries
        bf.on_full = self._grow_bloom

    def _grow_bloom(self, expect=0):
        """The filter holds more keys than it was made for (or `expect` more are coming): make it
        again from the index and the write buffer."""
        old = self.bloom
        self.adopt_bloom(bloom.build(self, self.wbuf.entries(), expect))
        self.bloom.count += len(self.wbuf)
        old.close()

    def _save_bloom(self):
        self.bloom.sync()
        atomic_write(os.path.join(self.path, F.BLOOM_STATE),
                     json.dumps({"covered": self.log.end_addr}).encode(), sync=False)

    def _flush_due(self):
        """At a clean close: is the write buffer worth merging into the index now? A flush is a pass
        over the whole index (a night's entries reach nearly every bucket), so entries wait until
        they fill a share of it: a 36 MB index took a night's 64 MiB every fourth night, not every
        other, and a large store's index is rewritten far less often. The next open puts every
        record past the index's `covered` back into the buffer, re-reading their arenas'
        summaries: little (17 arenas, 65 k entries: no slower an open, benchmarks/README.md)."""
        if self.venti:
            return True
        n = len(self.wbuf)
        if n * (self.keylen + 8) >= self.tuning.write_buffer_bytes * self.tuning.flush_at_close:
            return True
        arenas = self.log.open.n - F.split(self.index.h.covered)[0]
        return arenas > self.tuning.flush_arenas and n >= self.index.h.entries * self.tuning.flush_share

    def _sealed(self, oa):
        """An arena was sealed. The write buffer holds its entries and answers for them until the
        flush (probing its summary too would cost a cache miss per arena per block: seconds on a day
        0 of a hundred arenas), and a second table of them would double the buffer's memory: its
        summary joins the index cache when a lookup asks for it, read from disk. Venti's cache
        keeps it."""
        if self.venti:
            t = native.Table(self.keylen, oa.count + 1)
            t.add(bytes(oa.keys), oa.addrs)
            self.summaries[oa.n] = t
            self.summary_entries += len(t)
        self.open_table = native.Table(self.keylen, 4096)

    def forget_summary(self, n):
        """Arena n was replaced (gc, repair): its summary leaves the index cache."""
        self.holding = None
        t = self.summaries.pop(n, None)
        if t is not None:
            self.summary_entries -= len(t)

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
                tr = self.log.trailer(n, aside=self._aside)
            except DataCorrupt:
                tr = None
            except OSError:
                if not self._aside:
                    raise
                self._quiet()  # read again the careful way, nothing beside it
                return self.summary_records(n)
            if tr is not None and amac != tr.amac:   # e.g. a gc swap cut short by a power loss
                from foundation.store.rebuild import rebuild_summary
                self._quiet()
                log.warning("summary of arena %d is of another version of the arena; rebuilding it", n)
                try:
                    return rebuild_summary(self, n, write=self.writable)
                except DataCorrupt:
                    pass   # the arena itself is wrong (moved, reordered): reads and verify say so
            return keys, addrs, types
        except (OSError, ValueError) as e:
            from foundation.store.rebuild import rebuild_summary
            self._quiet()
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
        self._cache_summary(n, t)
        return t

    def _cache_summary(self, n, t):
        """Put arena n's summary table into the index cache, oldest out past its limit."""
        self.summaries[n] = t
        self.summary_entries += len(t)
        limit = self.tuning.index_cache_bytes // (self.keylen + 24)
        while self.summary_entries > limit and len(self.summaries) > 1:
            _, old = self.summaries.popitem(last=False)
            self.summary_entries -= len(old)

    # True while an append runs in another thread (dedup's older duplicates, decided beside it): the
    # log is then read aside (own descriptors, its write queue left alone); anything more (a rebuild)
    # first ends the append (_quiet).
    _aside = False

    def _quiet(self):
        """Before a summary rebuild or an index replacement: no append may run beside it."""

    def _tables(self):
        return [self.open_table, self.wbuf] + list(reversed(self.summaries.values()))

    def prefetch(self, keys):
        """Before many keys are located one by one (each an index bucket, then its arena's summary
        and trailer, each read waiting for the one before: ~a disk latency apiece, cold): ask the
        kernel for every bucket at once, look them all up, then ask for every summary and trailer
        at once, so the disk serves each stage's reads together. The lookups are kept for
        _index_lookup until `forget_ahead`; the rest are only hints, nothing is read twice."""
        keys = [k for k in keys if k not in self._ahead]
        if not 1 < len(keys) <= AHEAD_KEYS or self.index is None:
            return
        self.index.willneed(keys)
        arenas = set()
        for k in keys:
            addrs = self._ahead[k] = self._index_lookup(k)
            arenas.update(F.split(a)[0] for a in addrs)
        if self.venti:
            return
        for n in sorted(arenas):
            if n in self.summaries or n == self.log.open.n:
                continue
            try:
                fd = os.open(os.path.join(self.path, F.SUMMARIES, F.summary_name(n)), os.O_RDONLY)
            except OSError:
                continue  # summary_records says what is wrong, when it needs it
            try:
                _willneed(fd, [(0, 0)])
            finally:
                os.close(fd)
            try:
                fd = os.open(self.log.path(n), os.O_RDONLY) if self._aside else self.log.fd(n)
            except (OSError, DataCorrupt):
                continue
            try:
                size = os.fstat(fd).st_size
                _willneed(fd, [(max(0, size - F.MAX_TRAILER), F.MAX_TRAILER)])
            except OSError:
                pass
            finally:
                if self._aside:
                    os.close(fd)

    def forget_ahead(self):
        """The lookups prefetch kept are dropped (the index may change after this)."""
        self._ahead.clear()

    _trusting = False

    @contextlib.contextmanager
    def trusting_index(self):
        """A scope in which a key that prefetch looked up is located by the index's one answer
        alone, without loading its arena's summary to confirm it: a later day's old tree nodes
        (a few per arena, over dozens of arenas, all looked up together). Reads still check
        every record's key against the ref, so a wrong answer fails loudly; the caller then
        reads again outside the scope, the careful way."""
        self._trusting = True
        try:
            yield self
        finally:
            self._trusting = False

    def _index_lookup(self, key):
        """Addresses the on-disk index has for key (Bloom already said maybe)."""
        got = self._ahead.pop(key, None)
        if got is not None:
            return got
        try:
            addrs = self.index.lookup(key)
        except DerivedCorrupt as e:  # found damaged in use: it is derived, so made again and asked again
            self._quiet()
            self.replace_index(e)
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
        if self._trusting and len(self._ahead.get(score, ())) == 1:
            return self._ahead.pop(score)[0]
        for a in self._index_lookup(score):
            if self.venti:
                self._venti_cache(score, [a])
                return a
            t = self._load_summary(F.split(a)[0])
            if a in t.find(score):
                self._recent = [t] + self._recent[:3]
                return a
        return None

    def _venti_cache(self, keys, addrs):
        """Venti's index cache: single entries looked up or written, not summaries."""
        t = self.summaries.get(-1)
        if t is None or len(t) > self.tuning.index_cache_bytes // (self.keylen + 24):
            t = self.summaries[-1] = native.Table(self.keylen, 1024)
        t.add(keys, addrs)

    def replace_index(self, why):
        """The index turned out damaged: a writer rebuilds it from the arenas, a reader builds one in
        memory; either says so."""
        if not self.writable:
            self.index.close()
            self.index = self._memory_index(why)
            return
        from foundation.store.rebuild import rebuild_index
        log.warning("%s; rebuilding it from the arenas", why)
        self.repaired.append(f"rebuilt the index ({why})")
        rebuild_index(self)

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
