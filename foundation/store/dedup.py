"""Writing blocks: deciding fresh or duplicate, then appending the fresh ones (paper §3.2, §3.3).

A write is decided without touching the disk in the common cases: the
index cache (write buffer, open arena, recently loaded summaries) answers
duplicates of recent data, and the Bloom filter answers fresh data; only a
Bloom "maybe" costs an index seek, after which the whole summary of the
hit's arena is loaded, so the rest of a sequential run is answered from
memory. Compare-by-hash names a block by its score; compare-by-value names
it by its log address and checks every candidate byte for byte, read in
sorted batches. `Writes` is the part of Store that does this.

Inside `pipelined()` (an image being archived), a compare-by-hash write
returns as soon as its blocks are named and decided: its fresh blocks are
compressed by one thread (native.fill) and their records sealed and
appended by another (native.seal: laid out, encrypted, tagged), so the
compression of a batch runs beside the seal of the one before, while the caller
feeds their keys to the Bloom filter (in C), reads, hashes and decides the
next batch against the filter, the index cache and a table of the keys of
the appends in flight; the caller then waits for the append and adds its
index entries to the tables itself (no other thread ever changes them);
what the filter says may be stored it asks of the index and the older
arenas' summaries while that append still packs (neither is the append's). The packed records are written by another thread while the next
batch is packed (`Log.write_behind`). So reading, hashing, deciding,
packing and writing overlap on every core, and the log is still written
in order.
"""

import array
import bisect
import collections
import concurrent.futures
import contextlib
import itertools
import logging
import mmap

from foundation import native
from foundation.errors import BadInput, DataCorrupt
from foundation.store import format as F

log = logging.getLogger(__name__)

DATA = F.DATA
GATHER = 4 << 20  # the gather buffer's first size: an image batch (image/tree.py CHUNK)
# Appends in flight inside pipelined() at most, unless its caller asks for more. 2 queues the
# next one behind the one packing, so the append thread never waits while the caller settles
# (~1 ms a 4 MiB batch), for a batch more held (+5 MB at day 0's peak): it pays only when the
# caller's reads keep up (image/tree.py DEEP; benchmarks/README.md, wave 18).
AHEAD = 1


class Writes:
    """Store's write path (mixed into foundation.store.store.Store)."""

    _pipe = None      # the append thread of a pipelined() scope
    _filler = None    # the thread that compresses a batch's fresh blocks ahead of its append
    _inflight = ()    # the write_blocks calls of the scope not yet settled, oldest first: (future of
    # its append, table of its keys, which the next batches are decided against), (None, None) for
    # a call that appended nothing (it still counts: the caller's buffers turn over per call)
    _broken = None    # the failure of an append in the scope: every later one fails with it
    ahead = AHEAD     # appends in flight at most: a caller of write_blocks keeps its buffers for as many calls
    _gathered = None  # the buffer _gather reuses outside pipelined()

    @contextlib.contextmanager
    def pipelined(self, expect=0, ahead=None):
        """A scope in which write_blocks (compare-by-hash) may return before its
        fresh blocks are appended. The caller leaves the buffer it passed as it
        is until `ahead` more write_blocks calls have returned (or another store
        call) and does not read it again (its fresh blocks may be moved to its
        front and replaced by their compressed forms), and calls settle() before any store call but write_blocks; leaving
        the scope settles. expect: about how many blocks will be written (a hint).
        ahead: the appends in flight in this scope (default: the store's `ahead`); a scope
        opened inside another keeps the outer one's."""
        if self.mode != "hash" or self._pipe is not None:
            yield self
            return
        bf = self.bloom
        if bf is not None and bf.count < expect and bf.count + expect > bf.capacity:
            # A first archive into a young store: the filter made once for all its blocks now,
            # while it holds few keys, instead of grown (every key added again) four times or so.
            self._grow_bloom(expect)
        with contextlib.ExitStack() as stack:
            stack.callback(setattr, self, "ahead", self.ahead)  # the store's own `ahead` again, last
            if ahead is not None:
                self.ahead = ahead
            stack.enter_context(self.log.write_behind())  # left after the appends end: its writes drained
            self._pipe = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="store-append")
            self._filler = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="store-fill")
            self._inflight, self._broken, self._spare_tables = collections.deque(), None, []
            self._fills, self._nfill = [], 0
            stack.callback(self._stop_pipe)
            yield self
            self.settle()

    def _stop_pipe(self):
        q, self._inflight = self._inflight, ()
        concurrent.futures.wait([f for f, _ in q if f is not None])  # the scope failed: its appends end first
        for f, _ in q:
            if f is None:
                continue
            if f.cancelled() or f.exception() is not None:
                break
            self._index_added(*f.result())  # its records are in the log: the index cache names them
        self._pipe.shutdown()
        self._filler.shutdown()  # (a fill whose append failed before it ended is not left running)
        self._pipe = self._filler = None
        self._fills = []  # ~4 MiB each: not held past the scope

    def settle(self):
        """Wait for the append in flight and the log's writes, if any; a failure is raised here."""
        self._settle_append()
        self.log.drain()

    def _settle_append(self, keep=0):
        """Wait for the appends in flight, oldest first, until `keep` are left; their records then
        join the index cache (in this thread: only the caller's thread changes the tables, so it
        may look them up while an append runs). A failure is raised, the appends queued after it
        (which fail with it) dropped."""
        q = self._inflight
        while len(q) > keep:
            f = q[0][0]
            if f is None:
                q.popleft()
                continue
            try:
                got = f.result()
            except BaseException:
                concurrent.futures.wait([g for g, _ in q if g is not None])
                q.clear()
                raise
            _, t = q.popleft()
            self._index_added(*got)
            if len(self._spare_tables) < self.ahead:   # reused by a later batch: no mmap/munmap a batch
                t.clear()
                self._spare_tables.append(t)

    def _quiet(self):
        """A summary rebuilt or the index replaced while deciding beside an append: it ends first."""
        if self._aside:
            self._aside = False
            self._settle_append()

    def _queued(self, *args):
        """One append in the append thread: none runs after one that failed (its arena's state is
        unknown), so nothing is appended past a failure."""
        if self._broken is not None:
            raise self._broken
        try:
            return self._append(*args)
        except BaseException as e:
            self._broken = e
            raise

    def write(self, data, btype=DATA):
        """Store one block (at most block_size bytes); returns its ref."""
        if not 0 < len(data) <= self.block_size:
            raise BadInput(f"a block must hold 1 to {self.block_size} bytes, not {len(data)}")
        return self._write(data, len(data), btype)

    def write_blocks(self, buf, btype=DATA, hashed=None):
        """Store len(buf)//block_size whole blocks; returns their refs concatenated.
        hashed: hash_blocks(buf) made beforehand (DATA blocks, compare-by-hash), or None."""
        bs = self.block_size
        if len(buf) % bs:
            raise BadInput(f"write_blocks needs whole blocks of {bs} bytes, got {len(buf)} bytes")
        if not buf:
            return b""
        if hashed is not None and (btype != DATA or self.mode != "hash" or len(hashed[0]) != len(buf) // bs
                                   or len(hashed[1]) != len(buf) // bs * 32):
            raise BadInput("write_blocks: `hashed` is not of these blocks (DATA, compare-by-hash)")
        return self._write(buf, bs, btype, hashed)

    def hash_blocks(self, buf, threads=1):
        """(zero flags, scores) of buf's whole DATA blocks, as write_blocks makes them, for
        write_blocks(buf, hashed=...) (compare-by-hash only). It touches nothing of the store, so
        any thread may call it: an image's read threads hash each batch as soon as it is read,
        beside the caller's decision of the batch before and the pack of the one before that."""
        bs = self.block_size
        if self.mode != "hash" or len(buf) % bs:
            raise BadInput(f"hash_blocks needs a compare-by-hash store and whole blocks of {bs} bytes")
        zero = native.zero_flags(buf, bs)
        return zero, native.scores(buf, bs, DATA, key=self.keys.score, skip=zero, threads=threads)

    def _write(self, buf, bs, btype, hashed=None):
        self._need_writable()
        self._recent = []
        n = len(buf) // bs
        if hashed is not None:
            zero = hashed[0]
        else:
            zero = native.zero_flags(buf, bs) if btype == DATA and bs == self.block_size else bytes(n)
        c = self.counters
        c["offered_blocks"] += n
        c["offered_bytes"] += len(buf)
        if self.mode == "hash":
            if hashed is not None:
                keys = hashed[1]
            else:
                keys = native.scores(buf, bs, btype, key=self.keys.score, skip=zero, threads=self.tuning.threads)
            if self.bloom is None or self.venti:
                self._settle_here()  # the index must hold the batch before this one
            return self._write_hash(buf, bs, btype, zero, keys, n)
        self.settle()
        weak = native.weak_hashes(buf, bs, btype, self.keys.weak_seed, skip=zero)
        return self._write_value(buf, bs, btype, zero, weak, n)

    def _settle_here(self, keep=0):
        """The appends in flight end (all but `keep` of them) and the index cache holds their
        records; flushed if full (with none in flight: a flush syncs the log)."""
        self._settle_append(keep)
        if self._pipe is not None and self._full():
            self._settle_append()
            self.flush()

    def _write_hash(self, buf, bs, btype, zero, keys, n):
        zeros = zero.count(1)
        bloom = None if self.venti else self.bloom
        if bloom is None:
            # Blocks the index cache does not know, found with no Python per
            # known block; zero blocks are skipped by the lookup (which = -1).
            _, which = native.tables_lookup(self._tables(), keys, zero)
            if zeros:
                unknown = [i for i, w, z in zip(range(n), which, zero) if w < 0 and not z]
            else:
                unknown = [i for i, w in enumerate(which) if w < 0]
        else:
            # The filter holds every key the index cache holds (it is fed before the tables
            # are): the cache is asked about the filter's "maybe" keys only, not about every
            # fresh block (a probe of each loaded summary per key: ~35 ms of a later day's CPU).
            unknown = [i for i in range(n) if not zero[i]] if zeros else range(n)
        # The rest is decided a batch at a time, each step one C-level pass
        # over the batch: the first of each repeated key, then the Bloom
        # filter (the common fresh block: it says no, nothing to ask).
        ks = [keys[i * 32:i * 32 + 32] for i in unknown]
        first = dict(zip(reversed(ks), reversed(unknown)))  # the first block of each key
        if len(first) < len(ks):
            unknown = sorted(first.values())
            ks = [keys[i * 32:i * 32 + 32] for i in unknown]
        known = set()
        heads = []  # "maybe" keys that begin a run (_run_heads)
        young = bloom is not None and not self.index.h.entries
        if bloom is None:
            maybe = ks
        else:
            # Decided while the batch before is still packed (the append thread only packs and
            # writes: its records join the tables in this thread, at the settle below): the
            # filter holds that batch's keys already, the tables not yet, so they are asked of
            # a table of its keys (_flying) too, and the settle that follows is only a wait,
            # with nothing to ask again once the append thread is idle. In a first archive
            # (nothing on disk yet) the index cache holds every key stored: it is asked about
            # them all, and the filter, which could only answer false "maybe"s, not at all.
            maybe = ks if young else list(itertools.compress(ks, bloom.maybe(b"".join(ks), 32)))
            if maybe:  # duplicates of what the index cache holds: one C pass
                tables = self._tables() + [t for _, t in self._inflight if t is not None]
                _, which = native.tables_lookup(tables, b"".join(maybe), None)
                known = {k for k, w in zip(maybe, which) if w >= 0}
                if known:
                    maybe = [k for k in maybe if k not in known]
            heads = [] if young else self._run_heads(maybe, ks, unknown)
            if heads:  # their index buckets come from the disk while the append in flight ends
                self.index.willneed(heads)
            if young:
                maybe = []  # nothing older to find
        if maybe:  # a few fresh blocks the filter mistakes, and the duplicates of older data
            # The index and the summaries of older arenas are read while the append in flight
            # packs (the append thread would otherwise wait for these loads, ~1 ms each, a few
            # a batch): they are the caller's alone, and the arenas they name are sealed and
            # covered by the index, long written, so their trailers are read aside (_aside: own
            # descriptors, the log's write queue left to the append thread). Venti's appends
            # write the index itself: settled first.
            aside = self._pipe is not None and not self.venti and any(f is not None for f, _ in self._inflight)
            if not aside:
                self._settle_here()
            self._aside = aside
            try:
                if len(heads) > 1:  # their summaries and trailers asked for together, not one after another
                    left = set(maybe)
                    self.prefetch([k for k in heads if k in left])
                known.update(self._known_older(maybe))
            finally:
                self._aside = False
                self.forget_ahead()  # lookups kept by prefetch: none outlives this batch (a flush may follow)
        if known:
            kept = [(i, k) for i, k in zip(unknown, ks) if k not in known]
            unknown, ks = [i for i, _ in kept], [k for _, k in kept]
        fresh = unknown
        self._count(zeros, n - zeros - len(fresh))
        if self._pipe is not None:
            # This batch's append is queued behind the one packing (`ahead` at most in flight),
            # so the append thread goes from one pack to the next, never idle while this thread
            # settles the one before; its fresh blocks are gathered after that settle, so that no
            # more gathered batches than appends in flight are held.
            # A call that appends nothing counts as one all the same: the caller reuses its buffer
            # `ahead` calls later, whose append (maybe of that very buffer) must have ended.
            # Its fresh blocks are compressed first (native.fill) by a thread of their own while
            # the append thread still seals and writes the batch before and this one decides the
            # next: the append thread then only lays out, encrypts and tags (native.seal), a third
            # of a pack, and no step waits for another's whole batch.
            data = self._gather(buf, bs, fresh) if fresh else None
            filled = self._filler.submit(self._fill, data, bs, btype) if fresh else None
            self._settle_here(self.ahead - 1)
            if not fresh:
                self._inflight.append((None, None))
        if fresh:
            fkeys = keys if len(fresh) == n else b"".join(ks)
            if self._pipe is not None:
                f = self._pipe.submit(self._queued, data, bs, btype, None, fkeys, True, filled)
                # (its addresses are never read: the keys answer.) A settled batch's table is
                # reused: a fresh one per batch cost its mappings' mmap and munmap, ~0.6 ms of
                # waiting each on the address space's lock while the other threads fault pages in.
                t = self._spare_tables.pop() if self._spare_tables else native.Table(self.keylen, len(fresh))
                t.add(fkeys, array.array("Q", bytes(8 * len(fresh))))
                self._inflight.append((f, t))
                self._bloom_add(fkeys)
            else:
                self._append(buf, bs, btype, fresh, fkeys)
        return bytes(keys)  # a zero block's score is 32 zero bytes, its ref

    def _run_heads(self, maybe, ks, unknown):
        """The "maybe" keys that begin a run of "maybe" blocks next to each other in the batch (the
        batch holds the changed ranges back to back, so a run ends at a block the filter or the
        index cache answered, not at a range's end): a run copied from older data is answered by
        the summary its first key loads (_known_older), so only these are worth asking the disk
        for ahead (every key's bucket region, 16 KiB, was tried and mostly wasted)."""
        if not maybe or self.venti or self.index is None:
            return []
        if len(maybe) == len(ks):
            at = unknown
        else:
            where = dict(zip(ks, unknown))
            at = [where[k] for k in maybe]
        return [k for k, i, j in zip(maybe, at, [-2] + list(at)) if i != j + 1]

    def _bloom_add(self, fkeys):
        """The Bloom filter takes a batch's fresh keys (their 32-byte key fields, end to end) in the
        caller's thread while the append thread packs them (in C, the GIL released), and may hold
        a key early (a false "maybe" at worst, never a lost one).
        The write buffer is then flushed by the caller too (_write), so that no flush covers
        records whose keys the filter does not hold yet."""
        bf = self.bloom
        if bf is None:
            return
        if bf.count + len(fkeys) // 32 > bf.capacity:
            self._settle_append()  # it grows from the write buffer, which must hold the batch first
        bf.add_keys(fkeys, self.keylen, 32)

    def _known_older(self, keys):
        """Which of these keys, missed by the index cache and "maybe" to the filter, are stored: a key
        found through the index loads its arena's summary (_exists), which then answers the keys
        after it in one C pass (a copied extent: one lookup, not one per block)."""
        found, rest, i, last = [], keys, 0, None
        while i < len(rest):
            k, i = rest[i], i + 1
            if self._exists(k):
                found.append(k)
            if i < len(rest) and self._recent and self._recent[0] is not last:
                last = self._recent[0]  # a summary just loaded: it answers the keys after k
                tail = rest[i:]
                _, which = native.tables_lookup([last], b"".join(tail), None)
                if any(w >= 0 for w in which):
                    found += [x for x, w in zip(tail, which) if w >= 0]
                    rest, i = [x for x, w in zip(tail, which) if w < 0], 0
        return found

    def _exists(self, score):
        """A duplicate check for a key that missed the index cache and that the Bloom filter
        (tested by the caller, for the whole batch) says may be stored: recent summaries, then index."""
        for t in self._recent:
            if t.find(score):
                return True
        return self._locate(score) is not None

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
        # the filter asked about the whole batch in one call, not once a block
        held = self.bloom.maybe(weak, 8) if self.bloom is not None else None
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
                a = self._match_disk(block, btype, w, held is None or held[i])
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

    def _match_disk(self, block, btype, w, maybe=True):
        """An older copy of block on disk (its weak hash w), or None; maybe: the Bloom filter's
        answer for w (False: surely not in the index)."""
        for t in self._recent:
            a = self._match(block, btype, t.find(w))
            if a is not None:
                return a
        if not maybe:
            return None
        for a in self._index_lookup(w):
            if self._match(block, btype, [a]) is not None:
                if not self.venti:
                    self._recent = [self._load_summary(F.split(a)[0])] + self._recent[:3]
                else:
                    self._venti_cache(w, [a])
                return a
        return None

    def _gather(self, buf, bs, fresh):
        """The blocks `fresh` (ascending indexes) of buf, back to back: buf itself when they are all
        of it, else gathered a run of neighbouring blocks at a time. Inside pipelined() the buffer
        is the store's until the caller's next calls and never read again, so they move to its
        front, in place (each run to a place at or before its own); outside it, into one buffer
        reused batch after batch (one append runs at a time, packing copies out of it). A new
        bytes object a batch, freed by the append thread, left one or two batches of freed heap
        resident in that thread's malloc arena (glibc's mmap threshold rises to them)."""
        if len(fresh) * bs == len(buf) or len(fresh) == 1 and bs == len(buf):
            return buf
        need = len(fresh) * bs
        mv, o = memoryview(buf), 0
        cut = [k for k in range(1, len(fresh)) if fresh[k] != fresh[k - 1] + 1]
        runs = zip([0] + cut, cut + [len(fresh)])
        if self._pipe is not None:
            if mv.readonly:  # a caller's bytes, with appends maybe in flight: a batch of its own
                return b"".join(mv[fresh[a] * bs:(fresh[b - 1] + 1) * bs] for a, b in runs)
            out = mv
        else:
            if self._gathered is None or len(self._gathered) < need:
                self._gathered = mmap.mmap(-1, max(need, GATHER))
            out = memoryview(self._gathered)
        for a, b in runs:
            run, at = (fresh[b - 1] + 1 - fresh[a]) * bs, fresh[a] * bs
            if out is not mv or at != o:  # (a leading run in place stays)
                out[o:o + run] = mv[at:at + run]  # (memmove: a run may overlap its new place)
            o += run
        return out[:need]

    def _count(self, zeros, dups):
        self.counters["zero_blocks"] += zeros
        self.counters["dup_blocks"] += dups

    def _fill(self, data, bs, btype=DATA):
        """native.fill of a batch's fresh blocks: in place, each compressed block replaced by its
        payload (the caller's buffer is the store's until `ahead` more calls, never read again),
        so no buffer more than the batch itself; a read-only batch (a caller's bytes) into one
        of `ahead` + 1 payload buffers used in turn (the batches in flight hold the others)."""
        run = self.log.run if btype == DATA else 1  # runs of data blocks only (§5.2)
        if not memoryview(data).readonly:
            return native.fill(self.codec, data, bs, self.tuning.threads, data, run)
        ring = self._fills
        if len(ring) != self.ahead + 1:
            ring[:] = [None] * (self.ahead + 1)
        self._nfill = k = (self._nfill + 1) % len(ring)
        if ring[k] is None or len(ring[k]) < len(data):
            ring[k] = mmap.mmap(-1, max(len(data), GATHER))
        return native.fill(self.codec, data, bs, self.tuning.threads, ring[k], run)

    def _append(self, buf, bs, btype, fresh, fkeys, later=False, filled=None):
        """Append the fresh blocks (fkeys: their 32-byte key fields) to the log and index them;
        returns their addresses. fresh: the blocks of buf to append, None for all of them. The
        Bloom filter takes their keys too, unless `later`: the caller gives them (_bloom_add)
        and indexes the records when it settles (the append thread's returns are for that).
        filled: native.fill() of the blocks to append, made by the caller, or None."""
        data = buf if fresh is None else self._gather(buf, bs, fresh)
        threads = self.tuning.threads
        if isinstance(filled, concurrent.futures.Future):
            filled = filled.result()  # (the fill thread's: batches are filled in the order appended)
            # Sealing a batch (AES-CTR and a tag a record) takes a few ms; beside the fill thread
            # and the readers, helpers woken for it cost more hand-offs than they save.
            threads = 1
        addrs = self.log.append(btype, data, bs, fkeys, threads, filled=filled)
        packed = array.array("Q", addrs)  # the tables take it without a check per entry
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
            return () if later else addrs
        if later:  # the append thread: the caller's thread indexes them when it settles
            return ks, packed, self.log.open.n
        self._index_added(ks, packed, self.log.open.n)
        if self.bloom is not None:
            self.bloom.add_keys(ks, kl)
        self._flush_if_full()  # (a pipelined caller flushes once the filter holds these keys)
        return addrs

    def _index_added(self, ks=None, packed=None, open_n=0):
        """The write buffer and the open arena's table take appended records (keys, addresses)."""
        if ks is None:
            return  # (Venti: the index has them)
        self.wbuf.add(ks, packed)
        # Records sealed into an earlier arena by this append are already in
        # the index cache (_sealed); the rest belong to the open arena.
        first = bisect.bisect_left(packed, open_n << 32)  # addresses ascend
        # An arena sealed since (the append thread packs the next batch meanwhile) has no open
        # table: the write buffer answers for its records.
        if first < len(packed) and open_n == self.log.open.n:
            self.open_table.add(ks[first * self.keylen:], packed[first:])

    def _full(self):
        return len(self.wbuf) * (self.keylen + 8) >= self.tuning.write_buffer_bytes

    def _flush_if_full(self):
        if self._full():
            self.flush()
