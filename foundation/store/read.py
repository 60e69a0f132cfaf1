"""Reading blocks: by score through the index cache, or by address, always sorted by log address.

A batch of refs is answered from the block cache where it can, the rest is
located (compare-by-hash: index cache, then the on-disk index) and read in
one pass sorted by log address, merged into spans; every record is
verified by the C core, so a read returns exactly the bytes written or
raises DataCorrupt naming arena and offset. `Reads` is the part of Store
that does this. A whole image (restore, a long sequential read) goes
through `read_blocks_in_log_order` instead: every block it needs is located
first (for a large batch, by sweeping each arena the index names once),
then the log is read once, front to back, in large spans, so an arena is
visited once however the image's blocks are scattered over years.
"""

import array
import collections
import concurrent.futures
import errno
import itertools
import mmap
import operator
import os
import struct
import sys
import threading

from foundation import native
from foundation.errors import BadInput, DataCorrupt, DerivedCorrupt, NotFound
from foundation.store import format as F
from foundation.store import layout as L
from foundation.store.arena import MAX_FDS, Log, read_head

LOG_SPAN = 2 << 20  # largest single read of a log-order pass: a restore holds ~2 AHEAD spans' buffers
# (read and decoded); four 2 MiB spans in flight restore as fast as four of 4 MiB in 20 MB less, and
# 8 MiB cost 30 MB more for no gain (benchmarks/README.md)
SPAN_BLOCKS = 512  # most blocks a span decodes into one buffer (2 MiB of 4 KiB blocks)
LOG_GAP = 256 << 10  # records closer than this share a read: the bytes between cost less than a seek
RUN_MARGIN = 128 << 10  # most bytes a span's read reaches before its first record and past its last,
# for the runs its ends cut (runs of 16 compressed 4 KiB blocks: ~30 KiB; 64 of 16 KiB blocks more: mended)
AHEAD = 4  # spans read and decoded ahead of the consumer, in as many threads: with 2, both often
# waited on the disk at once (a cold 2 GiB restore 2.84 -> 2.43 s on a quiet machine, +17 MB peak)
READ_ALIGN = 4096  # what O_DIRECT asks of a read's offset, length and buffer
TASK_PIECES = 16  # most spans of one arena a worker reads and decodes as one task (each a piece of its buffer)
DIRECT_READS = True  # a large log-order pass reads sealed arenas with O_DIRECT
DIRECT_MIN = 64 << 20  # bytes of spans from which a pass reads around the page cache: a smaller one
# (an 8 MiB window of a vda.raw copy) is one of a stream that the kernel's read-ahead serves best
SWEPT_KEEP = 32  # summaries (keys and addresses, ~250 KB each) kept between a restore's windows
SWEEP_SAMPLE = 8  # misses whose index buckets, then arenas' summaries, a sweep's first round asks for
# at once (a 16 KiB read each); each later round twice as many, of the misses still left
SWEEP_PER = 256  # misses (1 MiB of 4 KiB blocks) a sample key stands for, at least
SWEEP_ROUNDS = 3  # rounds of such samples (8 + 16 + 32; 32 + 64 + 128 cost a newest day 165 index reads for
# its 89 arenas, most of them finding no new one) before the misses left are looked up one by one
SWEEP_MIN = 16384  # refs from which _locate_all sweeps whole arenas (a restore's window, 64 MiB of
# 4 KiB blocks); fewer (a vda.raw window) are asked of the summaries already loaded, then one by one


_FLIP = bytes([1, 0]) + bytes(254)  # bytes.translate table: a done flag (1) to 0, not done (0) to 1

_pool = None
_spare = []  # read buffers between passes (at most SPARE: what one pass has in flight)
_spare_lock = threading.Lock()
SPARE = AHEAD


def _workers():
    """The threads that read and decode spans ahead of the consumer: AHEAD for the process, not a
    pool a pass. Each span is one read and one C call with the GIL released, so AHEAD spans are
    read and decoded at once while the consumer (a restore's writer, a window's copy) runs."""
    global _pool
    if _pool is None:
        _pool = concurrent.futures.ThreadPoolExecutor(max_workers=AHEAD, thread_name_prefix="log-read")
    return _pool


def _tasks(spans):
    """A pass's spans -> tasks (arena, start, size, i, j, pieces): consecutive spans of one arena
    whose bytes together stay within LOG_SPAN, and SPAN_BLOCKS records, are one task of
    TASK_PIECES spans at most, its spans its pieces (None: a task of one span). A newest day
    scattered over a year of arenas is ~730 spans of ~270 KB: a task each cost a hand-off
    between threads each (submit, wake, result, the GIL taken again); as tasks they are ~220."""
    out, run, size = [], [], 0

    def close():
        out.append((*run[0], None) if len(run) == 1 else
                   (run[0][0], run[0][1], size, run[0][3], run[-1][4], tuple(run)))

    for sp in spans:
        if run and (sp[0] != run[0][0] or size + sp[2] > LOG_SPAN or sp[4] - run[0][3] > SPAN_BLOCKS
                    or len(run) >= TASK_PIECES):
            close()
            run, size = [], 0
        run.append(sp)
        size += sp[2]
    if run:
        close()
    return out


def _offsets(addrs):
    """The arena offsets (low 32 bits) of log addresses, as u64s: the array copied and its high
    halves zeroed in place, no Python int per address (a restore's 16,384 a pass cost 1.8 ms)."""
    out = array.array("Q", addrs)
    halves = memoryview(out).cast("B").cast("I")
    high = 1 if sys.byteorder == "little" else 0  # which u32 of each u64 holds its high bits
    halves[high::2] = array.array("I", bytes(4 * len(out)))
    return out


def _piece_room(size):
    """Bytes of a task's read buffer that a piece of size bytes takes (an O_DIRECT read's alignment)."""
    return -(-(size + 2 * READ_ALIGN) // READ_ALIGN) * READ_ALIGN


def _mib(n):
    """n rounded up to whole MiB."""
    return -(-n // (1 << 20)) << 20


class _SpanReads:
    """The reads of one log-order pass: each span read into one of a few page-aligned buffers
    that the pass recycles (no fresh pages to fault in a span), a sealed arena through an O_DIRECT
    descriptor opened for the pass (the disk's data lands in the buffer without a copy through the
    page cache, which a restore would only evict again). The open arena, whose newest records may
    still be in the page cache only, and a file system that refuses O_DIRECT are read through the
    cache."""

    def __init__(self, store, nbytes, most, direct=None):
        self.store, self.direct, self.free = store, {}, []
        self.need = _mib(most + 2 * READ_ALIGN)  # a buffer for the largest span
        self.big = nbytes >= DIRECT_MIN if direct is None else direct
        self.ok = DIRECT_READS and self.big and bool(getattr(os, "O_DIRECT", 0))

    def open(self, arena):
        """The pass's O_DIRECT descriptor of a sealed arena, opened by the consumer thread."""
        lg = self.store.log
        if self.ok and arena not in self.direct and arena < lg.open.n:
            try:  # the very file lg.fd reads (a gc may have renamed another over its path since)
                self.direct[arena] = os.open(f"/proc/self/fd/{lg.fd(arena)}", os.O_RDONLY | os.O_DIRECT)
            except OSError:
                self.direct[arena] = None

    def buffer(self, size):
        """A read buffer for size bytes: one the pass is done with, one of the process's spares or a
        new one. Spares outlive a pass, so a stream of small passes (a vda.raw copy's windows) faults
        no fresh pages; its spans read as bytes instead left tens of MB of freed heap in the worker
        threads' arenas. Every buffer of a pass has one size, the largest any of its tasks needs
        (a task of several spans may need more than its largest span), so each serves any task."""
        self.need = max(self.need, _mib(size + 2 * READ_ALIGN))
        while self.free:
            b = self.free.pop()
            if len(b) >= self.need:
                return b
        with _spare_lock:
            for k, b in enumerate(_spare):
                if len(b) >= self.need:
                    return _spare.pop(k)
        return mmap.mmap(-1, self.need)

    def read(self, arena, start, size, rb):
        """The span's bytes, a view of rb (fewer at the end of the arena's file)."""
        disk = self.store.disk
        mv = memoryview(rb)
        fd = self.direct.get(arena) if self.ok else None
        if fd is not None:
            lo = start - start % READ_ALIGN
            hi = -(-(start + size) // READ_ALIGN) * READ_ALIGN
            try:
                got = disk.pread_into(fd, "arena", lo, mv[:hi - lo])
                return mv[start - lo:max(start - lo, min(got, start - lo + size))]
            except OSError as e:
                if e.errno != errno.EINVAL:
                    raise
                self.ok = False  # accepted at open, refused at read: the page cache for the rest
        got = disk.pread_into(self.store.log.fd(arena), "arena", start, mv[:size])
        return mv[:got]

    def retire(self, keep):
        """Close the O_DIRECT descriptors of the arenas not in keep (those spans still to come read):
        a stream over a whole image must not hold one for every arena it passed."""
        for arena in [a for a in self.direct if a not in keep]:
            fd = self.direct.pop(arena)
            if fd is not None:
                os.close(fd)

    def close(self):
        with _spare_lock:
            _spare.extend(self.free)
            _spare.sort(key=len, reverse=True)  # the largest kept: they serve any pass
            del _spare[SPARE:]
        self.free.clear()
        for fd in self.direct.values():
            if fd is not None:
                os.close(fd)
        self.direct.clear()


class Reads:
    """Store's read path (mixed into foundation.store.store.Store)."""

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

    def read_blocks(self, refs, cache=True):
        """The blocks named by the concatenated refs, read sorted by log address. cache=False: a
        caller with a cache of its own (an image reader's tree nodes) does not hold them twice."""
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
            try:  # inside: a lookup prefetch kept must not outlive this call, even if one fails
                self.prefetch([keys[j * 32:(j + 1) * 32] for j in range(len(todo)) if which[j] < 0])
                for j, i in enumerate(todo):
                    a = addrs[j] if which[j] >= 0 else self._locate(keys[j * 32:(j + 1) * 32])
                    if a is None:
                        self._missing(keys[j * 32:(j + 1) * 32])
                    need.setdefault(a, []).append(i)
            finally:
                self.forget_ahead()
        else:
            for i in todo:
                need.setdefault(int.from_bytes(refs[i * 8:(i + 1) * 8], "big"), []).append(i)
        if len(need) == 1:
            a = next(iter(need))
            got = {a: self.log.read(a)}
        else:
            got = self.log.read_many(need)
        cache = cache and len(need) <= 64  # a streaming batch would only flush the cache
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

    # ---- whole images: the log read once, in order ---------------------------------

    def log_order_plan(self, refs):
        """What read_blocks_in_log_order does before it reads: every block located, sorted by log
        address, cut into spans. Made apart (a restore plans its next window while the spans of
        this one are read) and handed back as `plan`."""
        rs = self.ref_size
        n = len(refs) // rs
        if len(refs) != n * rs:
            raise BadInput(f"refs must be a multiple of {rs} bytes")
        refs = bytes(refs)
        addrs, positions, keys = self._log_order(refs, n)
        return refs, addrs, positions, self._log_spans(addrs), keys

    def read_blocks_in_log_order(self, refs, alloc=None, plan=None):
        """Yield (positions, data) for the blocks named by the concatenated refs, in log order.

        data holds len(positions) blocks of block_size bytes: block k is the
        block refs[positions[k]] names. A block named several times comes
        once for each of its positions. Null refs are skipped. Each span of
        the log is read once with one large read, spans front to back, and
        decoded on `tuning.threads` cores in the C core straight into data (no
        Python object per block), AHEAD spans at once in worker threads while
        the consumer handles the one before. A damaged record is
        read again block by block (read_blocks), which names its arena and
        offset in DataCorrupt or takes an intact copy the store holds.
        alloc(nbytes), when given, supplies the writable buffers to decode
        into (a reader that recycles them saves fresh memory's page faults);
        data may then be longer than its blocks. plan, when given, is
        log_order_plan(refs), made before.
        """
        plan = plan if plan is not None else self.log_order_plan(refs)
        if not plan[3]:
            return
        for _, pos, data in self.log_order_stream(iter([(None, plan, None, None)]), alloc, None):
            if pos is not None:
                yield pos, data

    def log_order_stream(self, plans, alloc=None, direct=True):
        """Like read_blocks_in_log_order over a series of passes that run on without a pause:
        plans yields (tag, plan, target, error), a pass's plan (log_order_plan) or the error that
        kept it from being made, asked for only when the spans ahead reach it, so the next
        pass's first spans are read and decoded while the consumer is still in this one's last
        (a vda.raw stream's windows: each alone left the decoders idle at its end). Yields
        (tag, positions, data) for each span and (tag, None, error or None) at each pass's end.
        A pass's target, when given, is a writable buffer of the blocks of its refs in their
        order (a window of the image): each span decodes straight into it, block k to
        positions[k] (native.unpack_blocks's slots), and data is then target itself (a span
        read again after damage is not: the caller copies it). direct: sealed arenas read with
        O_DIRECT (None: a pass from DIRECT_MIN bytes)."""
        rs, bs = self.ref_size, self.block_size
        lg = self.log
        pool = _workers()
        reads = None
        queue = collections.deque()  # (pass, span) not yet submitted; a pass: (tag, plan, target, low)
        pending = collections.deque()  # (pass, span, future) submitted, in log order
        ends = 0  # passes planned and not yet ended: a window's buffer each, so at most two

        def more():  # the next pass's spans into the queue (False: no pass left)
            nonlocal reads, ends
            if ends >= 2:  # this pass and the next: passes without spans (zeros) must not pile up
                return False
            got = next(plans, None)
            if got is None:
                return False
            tag, plan, target, err = got
            ends += 1
            if err is not None or plan is None or not plan[3]:
                queue.append(((tag, None, None, err), None))
                return True
            spans = plan[3]
            if reads is None:
                most = max(sp[2] for sp in spans) if direct is None else max(LOG_SPAN, max(sp[2] for sp in spans))
                reads = _SpanReads(self, sum(sp[2] for sp in spans), most, direct)
            low = _offsets(plan[1])  # arena offsets, for every span at once
            ps = (tag, plan, target, low)
            # a pass into a target (a vda.raw window) keeps a task a span: its buffers stay the size
            # of its largest span
            queue.extend((ps, sp) for sp in (_tasks(spans) if target is None else ((*x, None) for x in spans)))
            queue.append((ps, None))  # the pass's end
            return True

        def decode(ps, sp, out, rb):  # a worker: read the task's span(s), decode them (the GIL released in both)
            if sp[5] is None:
                return piece(ps, sp, out, rb)
            # the pieces of one arena read one after the other into rb, each decoded where its
            # blocks belong in out: one task, not a hand-off between threads for every small span
            i, mv, at, keys, bad = sp[3], memoryview(rb), 0, [], {}
            for p in sp[5]:
                got = piece(ps, p, None if out is None else memoryview(out)[(p[3] - i) * bs:], mv[at:])
                if got[2] is True:  # cut short: the whole task is read again, block by block
                    return got
                keys.append(got[1])
                bad.update((x + p[3] - i, e) for x, e in got[2].items())
                at += _piece_room(p[2])
            return ps[2] if ps[2] is not None else out, b"".join(keys), bad

        def piece(ps, sp, out, rb):  # one span: read into rb, decoded into out (or the pass's target)
            arena, start, size, i, j = sp[:5]
            addrs = ps[1][1]
            b = reads.read(arena, start, size, rb)
            if len(b) <= (addrs[j - 1] & 0xFFFFFFFF) - start:
                return None, None, True
            # A read short of the span's end is the end of the arena's file (a span reaches a
            # record's largest size past its last one): unpack_blocks finds a record cut short.
            if ps[2] is not None:  # straight into the pass's target, each block where it belongs
                got = native.unpack_blocks(self.codec, arena, lg.iv(arena), b, start, ps[3][i:j], bs, ps[2],
                                           lg.threads, ps[1][2][i:j])
            else:
                got = native.unpack_blocks(self.codec, arena, lg.iv(arena), b, start, ps[3][i:j], bs, out,
                                           lg.threads)
            if got[2]:  # runs the span's ends cut: each read whole and decoded where it belongs
                got = self._mend_runs(arena, b, start, ps[3][i:j], got, ps[1][2][i:j] if ps[2] is not None else None)
            return got

        def fill():  # keep AHEAD spans (tasks) in flight, across passes
            while sum(1 for x in pending if x[1] is not None) < AHEAD:
                if not queue and not more():
                    return
                ps, sp = queue.popleft()
                if sp is None:
                    pending.append((ps, None, None))
                    continue
                reads.open(sp[0])
                rb = reads.buffer(sp[2] if sp[5] is None else sum(map(_piece_room, (p[2] for p in sp[5]))))
                out = None
                if ps[2] is None and alloc is not None:
                    out = alloc((sp[4] - sp[3]) * bs)
                f = pool.submit(decode, ps, sp, out, rb)
                f.rb = rb
                pending.append((ps, sp, f))

        try:
            fill()
            while pending:
                ps, sp, f = pending.popleft()
                tag, plan = ps[0], ps[1]
                if sp is None:  # a pass's end (or the error that kept it from being planned)
                    ends -= 1
                    fill()
                    if reads is not None:
                        reads.retire({x[1][0] for x in pending if x[1] is not None} |
                                     {x[1][0] for x in queue if x[1] is not None})
                    yield tag, None, ps[3] if plan is None else None
                    continue
                data, keys, bad = f.result()
                reads.free.append(f.rb)  # decoded: its read buffer serves the next span
                fill()
                arena, _, _, i, j = sp[:5]
                pos = plan[2][i:j]
                want = plan[4][i * rs:j * rs]
                if bad:
                    # Damage (a record that fails, an arena cut short): the block-by-block path
                    # names it as every other read does, and takes an intact copy where the
                    # store holds one.
                    datas = self.read_blocks(want)
                    for d in datas:
                        if len(d) != bs:
                            raise DataCorrupt(f"arena {arena}: a block of an image holds {len(d)} bytes, "
                                              f"not {bs}")
                    yield tag, pos, b"".join(datas)
                    continue
                if self.mode == "hash" and keys != want:
                    x = next(x for x in range(len(pos)) if keys[x * rs:(x + 1) * rs] != want[x * rs:(x + 1) * rs])
                    raise DerivedCorrupt(f"the index names arena {arena} offset {plan[1][i + x] & 0xFFFFFFFF} "
                                         "for a block it does not hold")
                yield tag, pos, data
        finally:
            for x in pending:
                if x[2] is not None:
                    x[2].cancel()
            for x in pending:  # a span under way still writes into its buffer: let it finish first
                if x[2] is not None and not x[2].cancelled():
                    concurrent.futures.wait([x[2]])
            if reads is not None:
                reads.close()

    def _log_order(self, refs, n):
        """(log addresses, positions in refs, their refs joined) of the non-null refs, sorted by
        address; a repeated block has one entry per position. Arrays and one bytes object, not
        lists of Python ints and bytes: a restore holds two windows' plans (~20 MB less a pair)."""
        rs = self.ref_size
        flags = native.zero_flags(refs, rs)  # the null ref is all zeros
        if flags.count(0) == n:
            live, keys = range(n), refs
        else:  # C-level iterators: no Python frame per ref
            live = array.array("q", itertools.compress(range(n), map(operator.not_, flags)))
            # the live refs side by side: plan_order of positions already sorted is a gather (no
            # bytes object per ref)
            keys = native.plan_order(array.array("Q", live), live, refs, rs)[2]
        if self.mode != "hash":
            found = array.array("Q", struct.unpack(f">{len(live)}Q", keys))
        else:
            found = self._locate_all(keys)
            if not isinstance(found, array.array):
                found = array.array("Q", found)
        del keys
        # the sort by address and the refs side by side in one C call (plan_order): no Python per block
        return native.plan_order(found, None if isinstance(live, range) else live, refs, rs)

    def _locate_all(self, keys):
        """The log address of each 32-byte score in keys (NotFound/DataCorrupt for one nothing holds)."""
        self._recent = []
        sweep = len(keys) >= SWEEP_MIN * 32 and not self.venti
        # a sweep asks only the tables the index does not cover: every key asked of every loaded
        # summary in turn costs more than the sweep
        tables = self._tables()[:2] if sweep else self._tables()
        found, which = native.tables_lookup(tables, keys, None)
        miss = array.array("q", itertools.compress(range(len(which)), map((0).__gt__, which)))  # C-level: no frame per key
        if sweep:
            found = array.array("Q", found)
            self._sweep(keys, found, miss)
            return found
        self._promote(which)
        checked = []  # summaries already asked
        i = 0
        while i < len(miss):
            # One index lookup names an arena; its summary then answers every other miss it holds,
            # so the index is read once per arena, not once per scattered block.
            j = miss[i]
            i += 1
            key = keys[j * 32:(j + 1) * 32]
            a = self._locate(key)
            if a is None:
                self._missing(key)
            found[j] = a
            t = self._recent[0] if self._recent else None
            if t is not None and i < len(miss) and not any(t is c for c in checked):
                checked.append(t)
                rest = miss[i:]
                # the misses' keys gathered and the answers spread back by C-level iterators: a
                # newest day scattered over a year of arenas asks every arena's summary in turn,
                # and a Python frame per key and arena cost more CPU than the restore's decode
                sub = native.plan_order(array.array("Q", rest), rest, keys, 32)[2]  # positions ascending: a gather
                got, hit = native.tables_lookup([t], sub, None)
                held = list(map((0).__le__, hit))
                for k, a in zip(itertools.compress(rest, held), itertools.compress(got, held)):
                    found[k] = a
                miss, i = array.array("q", itertools.compress(rest, map(operator.not_, held))), 0
        return found

    def _promote(self, which):
        """Move the summaries that answered to the front of the tables asked next (the LRU's newest
        end): a lookup stops at the first table that holds a key, so the next window of a
        sequential read, whose blocks lie in the same few arenas, costs a probe or two a block,
        not one for every summary loaded before them."""
        names = list(reversed(self.summaries))  # _tables() order, after the open table and write buffer
        hits = collections.Counter(w for w in which if w >= 2)
        for w, _ in sorted(hits.items(), key=lambda h: h[1]):  # the one with most hits ends newest
            n = names[w - 2]
            if n in self.summaries:
                self.summaries.move_to_end(n)

    def _sweep(self, keys, found, miss):
        """Fill found[j] for the many misses j (a whole image): every key goes into one table, and
        each arena the index names for a miss is swept once, its summary's records looked up in
        that table. The work is one probe per record of the arenas touched, not one per miss and
        arena (a whole day's refs asked of every arena in turn cost more than the decode)."""
        kl = 32
        t = native.Table(kl, len(found))
        t.add(keys, array.array("Q", range(len(found))))
        done = bytearray(b"\1") * len(found)  # done[j]: found[j] holds its address
        for j in miss:
            done[j] = 0
        swept = set()
        try:
            self._sweep_ahead(keys, t, found, done, swept)
            self._sweep_rest(keys, t, found, done, miss, swept)
        finally:
            self.forget_ahead()

    def _sweep_ahead(self, keys, t, found, done, swept):
        """Sweep, a few rounds, the arenas that a sample of the misses spread over the image names,
        each round's reads asked for together: SWEEP_SAMPLE keys' index buckets at once, then
        their arenas' summaries and trailers at once (prefetch), the arenas then swept in
        ascending order. One miss at a time, each arena cost an index read, then a summary
        read, then a trailer read, each waiting for the one before: ~90 arenas of a newest day
        0.08-0.13 s cold. A sample spread over the image finds nearly every arena, as an
        image's neighbouring blocks were mostly written on the same night."""
        kl = 32
        for r in range(SWEEP_ROUNDS):
            # the positions not done (only misses are): selected by C-level iterators, no frame per ref
            undone = array.array("q", itertools.compress(range(len(done)), done.translate(_FLIP)))
            # small samples first, and no more than one a SWEEP_PER misses: an image in a few arenas
            # costs few index reads
            want = min(SWEEP_SAMPLE << r, len(undone) // SWEEP_PER)
            if want < 2:
                return
            sample = []
            for j in undone[::len(undone) // want][:want]:
                key = keys[j * kl:(j + 1) * kl]
                same = [p for p in t.find(key) if done[p]]  # a block the image holds twice
                if same:
                    found[j] = found[same[0]]
                    done[j] = 1
                else:
                    sample.append(key)
            self.prefetch(sample)
            arenas = sorted({a >> 32 for k in sample for a in self._ahead.get(k, ())} - swept)
            if not arenas:
                return
            for n in arenas:
                swept.add(n)
                self._sweep_arena(n, t, found, done)

    def _sweep_rest(self, keys, t, found, done, miss, swept):
        """The misses no sweep found yet, one at a time: an index lookup names an arena to sweep."""
        kl = 32
        for j in miss:
            if done[j]:
                continue
            key = keys[j * kl:(j + 1) * kl]
            same = [p for p in t.find(key) if done[p]]  # a block the image holds twice
            if same:
                found[j] = found[same[0]]
                done[j] = 1
                continue
            for a in self._index_lookup(key):
                n = a >> 32
                if n not in swept:
                    swept.add(n)
                    self._sweep_arena(n, t, found, done)
                if done[j]:
                    break
            else:  # not where the index says: the slow path finds it or names it lost
                a = self._locate(key)
                if a is None:
                    self._missing(key)
                found[j] = a
                done[j] = 1

    def _sweep_arena(self, n, t, found, done):
        """Take from arena n's summary the address of every key of t not yet done."""
        oa, bad = self.log.open, self.bad
        if n > oa.n:
            return
        if n == oa.n:
            akeys, aaddrs = bytes(oa.keys), list(oa.addrs)
        else:
            akeys, aaddrs = self._swept_arrays(n)
        if not aaddrs:
            return
        if not bad:  # the records in one C call (plan_sweep): no Python per record
            native.plan_sweep(t, akeys, aaddrs if isinstance(aaddrs, array.array) else array.array("Q", aaddrs),
                              found, done)
            return
        js, hit = native.tables_lookup([t], bytes(akeys), None)
        ys = list(itertools.compress(range(len(hit)), map(operator.not_, hit)))  # a hit is table 0, a miss -1
        for j, a in zip(map(js.__getitem__, ys), map(aaddrs.__getitem__, ys)):
            if not done[j] and a not in bad:
                found[j] = a
                done[j] = 1
                # a block the image holds twice is found by its first position; the loop over
                # the misses copies it to the others

    def _swept_arrays(self, n):
        """(keys, addrs) of sealed arena n's summary for a sweep, the last SWEPT_KEEP kept: the
        later days' arenas hold blocks of every window of a restore and are swept by each, and
        loading a summary (read, checksum, trailer) cost as much as sweeping it."""
        kept = self.__dict__.setdefault("_swept", collections.OrderedDict())
        state = (self.log, len(self.bad))  # a refresh makes a new log; damage found drops records
        got = kept.get(n)
        if got is not None and got[0][0] is state[0] and got[0][1] == state[1]:
            kept.move_to_end(n)
            return got[1], got[2]
        keys, addrs = self._summary_arrays(n)[:2]
        if not isinstance(addrs, array.array):
            addrs = array.array("Q", addrs)
        kept[n] = (state, bytes(keys), addrs)
        while len(kept) > SWEPT_KEEP:
            kept.popitem(last=False)
        return kept[n][1], addrs

    def _mend_runs(self, arena, b, start, offs, got, slots):
        """unpack_blocks's answer (out, keys, bad) for the span b (from arena offset start) with its
        run slices whose runs the span did not hold (RecordError "span": the first and last
        records of a span may be members of runs that begin before it or end after it) decoded
        from each run read whole, once: into out where slots say (None: block x at x)."""
        out, keys, bad = got
        lg, bs = self.log, self.block_size
        runs = L.runs_to_read(b, start, ((x, offs[x]) for x, e in bad.items() if e.kind == "span"))
        if not runs:
            return got
        keys, bad = bytearray(keys), dict(bad)
        for (first, end), xs in runs.items():
            rb = lg.disk.pread(lg.fd(arena), "arena", first, end - first)
            at = array.array("q", (slots[x] if slots is not None else x for x in xs))
            _, k2, bad2 = native.unpack_blocks(self.codec, arena, lg.iv(arena), rb, first,
                                               [offs[x] for x in xs], bs, out, 1, at)
            for y, x in enumerate(xs):
                if y in bad2:
                    bad[x] = bad2[y]
                else:
                    del bad[x]
                    keys[x * 32:(x + 1) * 32] = k2[y * 32:(y + 1) * 32]
        return out, bytes(keys), bad

    def _log_spans(self, addrs):
        """Sorted addresses -> [(arena, start, size, i, j)]: large reads, each in one arena, of addrs[i:j].

        A span ends at the first gap wider than LOG_GAP, before LOG_SPAN bytes or SPAN_BLOCKS
        records, or at the arena's end (a vda.raw window's spans alike); every end is
        found in one C call (plan_cuts), so there is Python per span, not per block.

        A span's ends often fall inside runs (codec 2), whose members decode only with the whole
        run in the buffer; each such run was read again alone (_mend_runs: ~660 more reads in a
        2 GiB restore, each waited for by its worker). So where the two records at an end lie
        `step` apart and step is below a record's largest size, as a run's members do (they are
        all one size), the read reaches (run - 1) x step beyond that end (at most RUN_MARGIN);
        blocks stored raw, 64 + B apart, form no run and get no margin. A run this guess misses
        is still read again alone."""
        spans = []
        most = L.HEADER_SIZE + self.block_size  # a record's largest size
        run = self.log.run - 1

        def reach(step):  # bytes beyond an end whose two records lie step apart
            return min(run * step, RUN_MARGIN) if 0 < step < most else 0

        if not isinstance(addrs, array.array):
            addrs = array.array("Q", addrs)
        i = 0
        for j in native.plan_cuts(addrs, LOG_GAP, LOG_SPAN, SPAN_BLOCKS, most):  # one C call finds every span's end
            arena, start = F.split(addrs[i])
            limit = self.log._limit(arena)
            base = arena << 32
            if start >= limit:
                raise DataCorrupt(f"arena {arena} offset {start}: no record there (beyond the end of the log)")
            lo, end = start, addrs[j - 1] - base + most
            if run > 0 and j - i > 1:
                lo = max(lo - reach(addrs[i + 1] - addrs[i]), F.ARENA_HEADER_SIZE)
                end += reach(addrs[j - 1] - addrs[j - 2])
            spans.append((arena, lo, min(end, limit) - lo, i, j))
            i = j
        return spans

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

    def address(self, ref):
        """The log address of the record a ref names, or None if no record is known for it."""
        if self.mode != "hash":
            return int.from_bytes(ref, "big")
        addrs, which = native.tables_lookup(self._tables(), bytes(ref), None)
        return addrs[0] if which[0] >= 0 else self._locate(bytes(ref))

    def addresses(self, keys):
        """The log address of each of the concatenated 32-byte scores (hash mode), as an array of
        one unsigned 64-bit integer per score; NotFound or DataCorrupt for one no record holds."""
        found = self._locate_all(bytes(keys))
        return found if isinstance(found, array.array) else array.array("Q", found)

    def unreadable(self, refs):
        """Positions of the (concatenated) refs whose block no intact record holds: not located, in a
        missing arena or a lost byte range, or known damaged. Reads no block (salvage names what is
        lost before anything is read): one C call tests them all against a table of every intact
        record's ref, made once a session (a salvage asks for every day in turn)."""
        rs = self.ref_size
        if len(refs) % rs:
            raise BadInput(f"refs must be a multiple of {rs} bytes")
        return native.tables_absent([self._intact()], refs)

    def _intact(self):
        """A table of the ref of every record that can be read, made again when damage is found or
        the log grows: the summaries' records (which leave out what a scan stepped over) and the open
        arena's, less those known damaged, in a lost byte range or past the log's end."""
        oa, lg = self.log.open, self.log
        state = (oa.n, oa.count, len(self.bad), len(lg.lost), len(lg.missing))
        if self.holding is not None and self.holding[0] == state:
            return self.holding[1]
        dam = {a >> 32 for a in self.bad} | {m for m, _, _ in lg.lost} | set(lg.missing)

        def holds(a):
            n, off = F.split(a)
            return not (a in self.bad or n > oa.n or n in lg.missing or
                        any(m == n and lo <= off < hi for m, lo, hi in lg.lost))

        t = native.Table(self.ref_size, min(self.index.h.entries + oa.count + 1, 1 << 30))  # grows if short
        kl = self.keylen
        for n in range(oa.n + 1):   # an arena at a time: only the table stays in memory
            keys, addrs = self._summary_arrays(n)[:2] if n < oa.n else (bytes(oa.keys), list(oa.addrs))
            if n in dam and addrs:
                keep = [i for i, a in enumerate(addrs) if holds(a)]
                keys, addrs = b"".join(keys[i * kl:(i + 1) * kl] for i in keep), [addrs[i] for i in keep]
            if self.mode == "hash":
                t.add(bytes(keys), array.array("Q", addrs))
            else:   # a ref is the record's address, big-endian
                t.add(struct.pack(f">{len(addrs)}Q", *addrs), array.array("Q", addrs))
        self.holding = (state, t)
        return t

    def _ref(self, keys, i, a):
        if self.mode == "hash":
            return bytes(keys[i * 32:(i + 1) * 32])
        return a.to_bytes(8, "big")

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

    def refresh(self):
        """For a reader: see what a writer committed since we opened. True if anything changed."""
        if self.writable:
            return False
        try:
            got = read_head(self.path, self.keys.mac)
        except OSError:
            return False
        if got is None:
            return False
        old = self.log.head
        h = got[1]
        if (h.generation, h.position) <= (old.generation, old.position):
            return False
        self.log.close()
        self.log = Log(self.path, self.disk, self.codec, self.keys, self.conf, False)
        self.log.threads = self.tuning.threads
        self.log.load()
        self.index.reread_header()
        self._reset_buffer()
        self._catch_up(self.index.h.covered)
        return True
