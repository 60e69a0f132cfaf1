"""Reading a tree back: random reads with a node cache, and whole-image restores in log order.

Reads are the paper's weak spot (§5.3, §7.2): a day's blocks lie wherever
dedup found them in the log, and after a year of nights the newest day's
blocks are spread over a year of arenas. So a restore never reads in image
order: it takes a window of the image (64 MiB, then 128, then 256) at a
time, gathers the leaf refs of the window and locates them (planned in a
thread while the window before is written), has
`store.read_blocks_in_log_order` read their
records front to back in large spans (each arena once per window, decoded
on every core into one buffer a span, no Python object per block) and
writes each run of consecutive blocks where it belongs with one pwrite.
Null refs are never read: a restore seeks over them and leaves a hole, so
the output is as sparse as the image. ImageReader serves the random reads
of the /snapshot tree and of booted clones: interior nodes stay in an LRU
cache, and a run of sequential reads grows a read-ahead window up to 8 MiB,
read in log order like a restore once it holds LOG_ORDER_MIN blocks;
`read_window` hands a whole window to a caller that keeps it (the tree's
stream of a sequentially read vda.raw): windows asked for one after the
other are one stream of spans (`store.log_order_stream`), the next
window planned and its first spans decoding while this one's last are,
every block decoded straight to its place in its window (no copy).
"""

import array
import collections
import concurrent.futures
import errno
import itertools
import mmap
import operator
import os
import stat
import threading
from collections import OrderedDict

from foundation import native
from foundation.errors import DataCorrupt, Error, NotFound
from foundation.image import qemuimg
from foundation.image.shape import Shape, split_refs
from foundation.store.cache import give_back
from foundation.store.read import DIRECT_MIN

BATCH = 8192  # leaves per read_blocks call
WINDOW = 256 << 20  # bytes of image whose blocks one restore pass reads in log order: its plan (a
# few Python lists of its 64 k blocks) is held twice (this window's, the next one's); 1 GiB cost 44 MB
FIRST_WINDOW_PART = 4  # a restore's first window is this part of WINDOW (the pipeline fills sooner),
# unless the whole image fits one window: then one pass, each arena read once, front to back (a newest
# day scattered over a year of arenas, cut 1/4 + 1/2 + 1/4, read them three times: 28 % more reads,
# 0.15 CPU s more for a 256 MiB disk)
NODE_CACHE = 1024  # interior nodes a reader keeps (4 MiB, the level above 512 MiB of image): a
# whole copy of a 2 GiB disk through the tree held all 4096 (16 MiB), and the store's block cache
# the same ones again; a sequential reader needs a few, a booting guest the few hundred it touches
LOG_ORDER_MIN = 256  # a random read below this many blocks goes through read_blocks and its cache
WRITES_AHEAD = 1  # spans decoded ahead of the writer thread (each one 8 MiB more peak memory)
DIRECT_WRITES = False  # O_DIRECT for a restore's file: up to 0.4 CPU s less a 2 GiB day, but the
# restore then waits for the disk, where through the page cache it ends as the last write is queued
# (wall 4.6-7.0 s against 3.3-3.7 s on the benchmark machine; benchmarks/README.md)
DIRECT_ALIGN = 4096  # what O_DIRECT asks of a write's offset, length and buffer (a page covers every disk)
SPAN_BYTES = 2 << 20  # the largest span the store decodes into one buffer (store.read.SPAN_BLOCKS of 4 KiB)
STREAM_DIRECT = True  # a stream's spans read sealed arenas with O_DIRECT, as a restore's do: its
# spans ahead run on across windows, so they keep the disk busy without the page cache's read-ahead
SPAN_BUFFERS = 5  # more than the spans the store decodes ahead of the one handed out (store.read.AHEAD)


class RestoreFailed(Error):
    """Could not write the restored image to {}: {}"""

    code = 32


class ImageReader:
    """Read any byte range of an archived image; cheap to create, safe across threads."""

    def __init__(self, store, root, node_cache=NODE_CACHE, readahead=8 << 20):
        self.s = store
        self.root = root
        self.sh = Shape(store, root.size)
        self.sh.check(root)
        self.size = root.size
        self.block_size = self.sh.bs
        self._null = store.null_ref
        self._zero = bytes(self.sh.bs)
        self._nodes = OrderedDict()
        self._node_cap = node_cache
        self._ra_max = max(1, readahead // self.sh.bs)
        self._ra = 0
        self._seq = None  # offset where the last read ended
        self._win = (0, b"")  # read-ahead window: first leaf, its blocks' data (never mutated)
        self._ring = [bytearray() for _ in range(SPAN_BUFFERS)]  # spans decoded for a window, reused
        self._stream = None  # _Stream: the windows read one after the other
        self._lock = threading.Lock()

    # ---- interior nodes -------------------------------------------------------
    def _get_nodes(self, k, js):
        """{j: content} of the nodes (k, j), reading the missing ones one batch per level."""
        if k == self.sh.depth:
            return {0: self._root_node()}
        F, rs = self.sh.fanout, self.sh.rs
        out, missing = {}, []
        for j in js:
            c = self._nodes.get((k, j))
            if c is None:
                missing.append(j)
            else:
                self._nodes.move_to_end((k, j))
                out[j] = c
        if missing:
            parents = self._get_nodes(k + 1, sorted({j // F for j in missing}))
            want, refs = [], []
            for j in missing:
                p = parents[j // F]
                r = p[(j % F) * rs:(j % F + 1) * rs]
                if r == self._null:
                    out[j] = self._zero
                else:
                    want.append(j)
                    refs.append(r)
            if refs:
                for j, data in zip(want, self.s.read_blocks(b"".join(refs), cache=False)):
                    self._check_node(data)
                    out[j] = data
                    self._nodes[(k, j)] = data
                while len(self._nodes) > self._node_cap:
                    self._nodes.popitem(last=False)
        return out

    def _root_node(self):
        c = self._nodes.get("root")
        if c is None:
            c = self._zero if self.root.ref == self._null else self.s.read(self.root.ref)
            self._check_node(c)
            self._nodes["root"] = c
        return c

    def _check_node(self, data):
        if len(data) != self.sh.bs:
            raise DataCorrupt(f"a tree node of the image holds {len(data)} bytes, not {self.sh.bs}")

    def leaf_refs(self, b0, b1):
        """Concatenated refs of leaves b0..b1-1 (which must lie inside the image)."""
        if self.sh.depth == 0:
            return self.root.ref if b0 < b1 else b""
        F, rs = self.sh.fanout, self.sh.rs
        nodes = self._get_nodes(1, range(b0 // F, (b1 - 1) // F + 1))
        parts = []
        b = b0
        while b < b1:
            j, slot = divmod(b, F)
            m = min(F - slot, b1 - b)
            parts.append(nodes[j][slot * rs:(slot + m) * rs])
            b += m
        return b"".join(parts)

    # ---- data -----------------------------------------------------------------------
    def _fetch(self, b0, b1):
        """Data of leaves b0..b1-1, one buffer of (b1 - b0) blocks."""
        refs = self.leaf_refs(b0, b1)
        bs, rs = self.sh.bs, self.sh.rs
        n = len(refs) // rs
        out = bytearray(n * bs)  # null blocks stay zeros
        view = memoryview(out)
        flags = native.zero_flags(refs, rs)  # the null ref is all zeros
        if n - flags.count(1) < LOG_ORDER_MIN:  # a few blocks: through read_blocks and its cache
            live = [i for i in range(n) if not flags[i]]
            datas = self.s.read_blocks(b"".join(refs[i * rs:(i + 1) * rs] for i in live))
            if any(len(d) != bs for d in datas):  # not the image's block size (an edited config): as they are
                got = iter(datas)
                return b"".join(self._zero if flags[i] else next(got) for i in range(n))
            for i, data in zip(live, datas):
                view[i * bs:(i + 1) * bs] = data
            return out
        # a read-ahead window: the log read front to back in large spans, as a restore does
        for positions, data in self.s.read_blocks_in_log_order(refs, _ring_alloc(self._ring)):
            _put(view, bs, positions, data)
        return out

    def read(self, offset, length):
        """`length` bytes from `offset`, fewer at the end of the image."""
        if offset < 0 or length < 0:
            raise ValueError("negative offset or length")
        end = min(offset + length, self.size)
        if offset >= end:
            return b""
        bs = self.sh.bs
        b0, b1 = offset // bs, -(-end // bs)
        with self._lock:
            w0, wdata = self._win
            if not (w0 <= b0 and b1 * bs <= w0 * bs + len(wdata)):
                if offset == self._seq:
                    self._ra = min(max(2 * self._ra, 16), self._ra_max)
                else:
                    self._ra = 0
                stop = min(self.sh.nleaves, b1 + self._ra)
                try:
                    wdata = self._fetch(b0, stop)
                except (DataCorrupt, NotFound):
                    if stop == b1:
                        raise
                    # A lost block in the read-ahead must not fail a read of intact blocks before it.
                    self._ra, stop = 0, b1
                    wdata = self._fetch(b0, stop)
                w0 = b0
                self._win = (w0, wdata) if stop > b1 or b1 - b0 <= self._ra_max else (0, b"")
            self._seq = end
        lo = offset - w0 * bs
        return bytes(memoryview(wdata)[lo:lo + end - offset])

    def read_window(self, offset, length, alloc=None):
        """`length` bytes from a block-aligned `offset` as one buffer, read in log order; kept by
        the caller, not by this reader's own window. Windows of one size asked for one after the
        other are one stream (_Stream). alloc(nbytes), when given, supplies the window buffers
        (a caller that recycles them; their old bytes are overwritten)."""
        bs = self.sh.bs
        end = min(offset + length, self.size)
        if offset % bs or offset >= end:
            return self.read(offset, length)
        with self._lock:  # the stream's buffers are the reader's own
            b0, b1 = offset // bs, -(-end // bs)
            st = self._stream
            if st is None or not st.follows(b0, b1):
                self._end_stream()
                st = self._stream = _Stream(self, b0, b1 - b0, alloc)
            try:
                return memoryview(st.take(b0))[:end - offset]
            except BaseException:
                self._end_stream()
                raise

    def _end_stream(self):
        """Drop the stream: its spans in flight finish first (they write into its buffers)."""
        st, self._stream = self._stream, None
        if st is not None:
            st.gen.close()

    # ---- whole-tree walk ----------------------------------------------------------
    def iter_leaves(self, b0=0, b1=None, batch=BATCH):
        """Yield (first leaf, count, refs) in order; refs is None for a run of null leaves."""
        sh, rs, null = self.sh, self.sh.rs, self._null
        b1 = sh.nleaves if b1 is None else min(b1, sh.nleaves)
        if b0 >= b1:
            return
        if sh.depth == 0:
            yield (0, 1, None if self.root.ref == null else self.root.ref)
            return
        F = sh.fanout
        per1 = max(1, batch // F)

        def walk(k, j0, refs):
            span = F**k
            n = len(refs) // rs
            lo = max(0, b0 // span - j0)
            hi = min(n, (b1 - 1) // span - j0 + 1, sh.counts[k] - j0)
            group = per1 if k == 1 else 16
            for g in range(lo, hi, group):
                gr = split_refs(refs[g * rs:min(hi, g + group) * rs], rs)
                live = [r for r in gr if r != null]
                got = iter(self.s.read_blocks(b"".join(live)) if live else ())
                run_start, run = None, []
                for i, r in enumerate(gr):
                    j = j0 + g + i
                    s, e = max(b0, j * span), min(b1, (j + 1) * span)
                    if r == null:
                        if run:
                            yield (run_start, sum(len(x) for x in run) // rs, b"".join(run))
                            run = []
                        yield (s, e - s, None)
                        continue
                    content = next(got)
                    self._check_node(content)
                    if k == 1:
                        if not run:
                            run_start = s
                        run.append(content[(s - j * span) * rs:(e - j * span) * rs])
                    else:
                        yield from walk(k - 1, j * F, content)
                if run:
                    yield (run_start, sum(len(x) for x in run) // rs, b"".join(run))

        yield from walk(sh.depth, 0, self.root.ref)


class _Stream:
    """An ImageReader's windows of `per` leaves read one after the other from leaf b0: one
    log_order_stream whose passes are the windows, each planned (tree walk, blocks located) when
    the spans ahead reach it, so the decoders go on with the next window while the caller copies
    this one out. A window that cannot be planned fails at its own turn, not the one before."""

    def __init__(self, r, b0, per, alloc):
        self.r, self.next, self.per, self.log = r, b0, per, r.s.log
        self.alloc = alloc or bytearray
        self.outs = {}  # first leaf of a window planned -> (its buffer, a view of it)
        self.gen = r.s.log_order_stream(self._plans(b0), None, STREAM_DIRECT)

    def follows(self, b0, b1):
        """Is [b0, b1) the window this stream reads next (of its size, or the image's last)?"""
        r = self.r
        return (b0 == self.next and b1 == min(r.sh.nleaves, b0 + self.per) and self.log is r.s.log)

    def _plans(self, b0):
        r, bs, rs = self.r, self.r.sh.bs, self.r.sh.rs
        for w0 in range(b0, r.sh.nleaves, self.per):
            w1 = min(r.sh.nleaves, w0 + self.per)
            try:
                refs = r.leaf_refs(w0, w1)
                plan = r.s.log_order_plan(refs)
            except (Error, OSError) as e:  # named at this window's turn
                yield w0, None, None, e
                return
            n = w1 - w0
            out = self.alloc(n * bs)
            view = memoryview(out)
            flags = native.zero_flags(refs, rs)
            if flags.count(1):  # a recycled buffer holds old bytes: the null blocks' runs are zeroed
                nulls = list(itertools.compress(range(n), flags))
                starts = _run_starts(nulls)
                for i, j in zip(starts, starts[1:]):
                    # from one small zero buffer (a fresh one the size of the longest run, every
                    # window, cost its pages' faults and zeroing: ~0.1 CPU s a 2 GiB copy)
                    for p in range(nulls[i] * bs, (nulls[i] + j - i) * bs, len(_ZEROS)):
                        q = min((nulls[i] + j - i) * bs, p + len(_ZEROS))
                        view[p:q] = _ZEROS[:q - p]
            self.outs[w0] = (out, view)
            yield w0, plan, view, None

    def take(self, b0):
        """The buffer of the window at leaf b0 (the next one), its spans all in place."""
        bs = self.r.sh.bs
        for tag, pos, data in self.gen:
            if pos is None:
                if data is not None:
                    raise data
                out = self.outs.pop(tag)[0]
                if tag != b0:  # never: the windows end in the order they were planned
                    raise RuntimeError(f"a stream's window {tag} ended before {b0}")
                self.next = b0 + self.per
                return out
            view = self.outs[tag][1]
            if data is not view:  # read again after damage: copied to its place
                _put(view, bs, pos, data)
        raise RuntimeError(f"a stream ended before its window at leaf {b0}")


_ZEROS = bytes(64 << 10)  # what a stream's window's null runs are zeroed from


def _ring_alloc(ring):
    def alloc(size):  # a span's buffer is free again once it is copied out: a few serve them all
        ring.append(ring.pop(0))
        if len(ring[-1]) < size:  # mapped, so its pages leave with it; at least a whole span
            ring[-1] = mmap.mmap(-1, max(size, SPAN_BYTES))
        return ring[-1]
    return alloc


def _put(view, bs, positions, data):
    """Copy a span's blocks (data, in log order) to their positions in view, a run with one copy."""
    src = memoryview(data)
    starts = _run_starts(positions)
    for i, j in zip(starts, starts[1:]):  # a run of blocks that follow each other in the image is one copy
        p = positions[i]
        view[p * bs:(p + j - i) * bs] = src[i * bs:j * bs]


def write_raw(store, root, fd, sparse=True, progress=None, window=None, direct=None):
    """Write the image to an open file descriptor; holes stay holes when `sparse`.

    A window of the image (`window` bytes) at a time: its leaf refs are
    gathered, its blocks read in log order (`store.read_blocks_in_log_order`:
    each arena once, front to back, decoded in the C core into one buffer a
    span) and each run of consecutive blocks written where it belongs with
    one pwrite by a writer thread, so memory holds the window's refs and a
    few spans, not its data. `direct`, a second descriptor of the same file
    opened with O_DIRECT, takes the runs that are whole pages: they go from
    the decode buffers (page-aligned, recycled) to the disk without a copy
    into the page cache, which cost more CPU than any other step of a restore.
    """
    r = ImageReader(store, root)
    bs, size, rs = r.block_size, root.size, store.ref_size
    per = max(1, (window or WINDOW) // bs)
    zero = bytes(min(size, 8 << 20)) if not sparse else b""
    free = []  # decode buffers whose blocks are written: reused, their pages already mapped
    if direct is not None and bs % DIRECT_ALIGN:
        direct = None  # a run of such blocks need not start on a page
    out = _Out(fd, direct)

    def alloc(n):
        for i, b in enumerate(free):
            if len(b) >= n:
                return free.pop(i)
        # page-aligned, and one size, so every one is reused: the restore holds as many as the
        # pipeline has spans in it (a buffer of each span's own size left the smaller ones unused
        # in the free list, and their heap fragmented)
        return mmap.mmap(-1, max(n, SPAN_BYTES))

    with concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="restore-write") as pool:
        pending = collections.deque()

        def submit(jobs, buf=None):
            while len(pending) >= WRITES_AHEAD:
                done = pending.popleft()
                if done.result() is not None:
                    free.append(done.result())
            if jobs:
                pending.append(pool.submit(out.write, jobs, buf))

        grow = [per if -(-size // bs) <= per else max(1, per // FIRST_WINDOW_PART)]
        leaves = r.iter_leaves(batch=grow[0])

        def plan():  # the planner thread: the next window's leaf runs, its blocks located
            # The first window is small, so the disk and both cores are busy sooner; each later
            # one is planned while the one before it is read and written, and twice its size at
            # most (planning costs about half what decoding does, so the pipeline never waits).
            want = grow[0]
            grow[0] = min(per, 2 * want)
            runs, n = [], 0
            for run in leaves:
                runs.append(run)
                n += run[1]
                if n >= want:
                    break
            return _plan(store, runs) if runs else None

        with concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="restore-plan") as planner:
            ahead = [planner.submit(plan)]
            wins = {}

            def plans():  # the windows, each as the stream's spans reach it
                k = 0
                while True:
                    w = ahead[0].result()
                    if w is None:
                        return
                    # The next window is planned (tree read, blocks located: Python and small reads)
                    # while this one's spans are read and decoded (C, the GIL released).
                    ahead[0] = planner.submit(plan)
                    k += 1
                    wins[k] = w
                    _zeros(w, bs, size, rs, zero, submit)
                    yield k, w[3], None, None

            try:
                # One stream over the windows: the next window's first spans are read and decoded
                # while this one's last are, so the decoders never wait at a window's end.
                for k, positions, data in store.log_order_stream(plans(), alloc, None if size < DIRECT_MIN else True):
                    w = wins[k]
                    if positions is None:  # the window's end
                        if data is not None:
                            raise data
                        del wins[k]
                        if progress is not None:
                            progress(min(size, sum(c for _, c, _ in w[0]) * bs))
                        del w
                        # the window's plan and the spans' keys were freed in every thread's heap,
                        # which glibc keeps for reuse (a restore peaked ~60 MB higher): hand the
                        # pages back
                        give_back()
                        continue
                    submit(_runs(w[1], positions, memoryview(data), bs, size),
                           data if isinstance(data, (bytearray, mmap.mmap)) else None)
            finally:
                ahead[0].cancel()
        while pending:
            pending.popleft().result()


def _plan(store, runs):
    """One window of leaf runs [(first leaf, count, refs or None)] -> (runs, leaf of each ref, runs of
    null leaves, the store's log-order plan of its refs)."""
    leaf, parts, nulls = array.array("q"), [], []  # 8 bytes a leaf, not a Python int (36)
    for start, count, refs in runs:
        if refs is None:
            nulls.append((start, count))
        else:
            leaf.extend(range(start, start + count))
            parts.append(refs)
    refs = b"".join(parts)
    return runs, leaf, nulls, store.log_order_plan(refs) if refs else None


def _zeros(w, bs, size, rs, zero, submit):
    """A planned window's (_plan) null blocks written as zeros when zero is given (a device keeps
    whatever it held); a file leaves them holes."""
    if not zero:
        return
    runs, leaf, nulls, plan = w
    refs = plan[0] if plan else b""
    flags = native.zero_flags(refs, rs) if refs else b""  # the null ref is all zeros
    nulls += [(leaf[i], 1) for i in range(len(flags)) if flags[i]]
    jobs = []
    for start, count in nulls:
        off, end = start * bs, min(size, (start + count) * bs)
        while off < end:
            m = min(len(zero), end - off)
            jobs.append((zero[:m], off))
            off += m
    submit(jobs)


def _runs(leaf, positions, data, bs, size):
    """Blocks in data, block k that of leaf[positions[k]] -> pwrite jobs [(buffer, offset)], one per
    run of consecutive leaves, found in one C call (plan_runs: no Python per block)."""
    jobs = []
    if not isinstance(positions, array.array):
        positions = array.array("q", positions)
    starts = native.plan_runs(leaf, positions)
    for i, j in zip(starts, starts[1:]):
        off = leaf[positions[i]] * bs
        end = min(size, off + (j - i) * bs)  # the last block of an image whose size is not a multiple of it
        jobs.append((data[i * bs:i * bs + end - off], off))
    return jobs


def _run_starts(leaves):
    """Where each run of consecutive numbers in leaves starts, and len(leaves) last: found by
    C-level iterators (no Python frame per block, which cost more than the run's pwrite)."""
    n = len(leaves)
    if not n:
        return [0]
    return [0, *itertools.compress(range(1, n), map(operator.ne, leaves[1:], map((1).__add__, leaves))), n]


class _Out:
    """The writer thread's end of a restore: pwrite each (buffer, offset) job, through the O_DIRECT
    descriptor when it has one and the run is whole pages of a page-aligned buffer (an mmap);
    the rest (a short last block, a block re-read after damage) and everything after a
    file system refuses O_DIRECT go through the page cache."""

    def __init__(self, fd, direct):
        self.fd, self.direct = fd, direct

    def write(self, jobs, done=None):
        """Write [(buffer, offset)]; -> done, the buffer they were cut from, now free."""
        dfd = self.direct if isinstance(done, mmap.mmap) else None
        for buf, off in jobs:
            if dfd is not None and not (off | len(buf)) % DIRECT_ALIGN:
                try:
                    _pwrite(dfd, buf, off)
                    continue
                except OSError as e:
                    if e.errno != errno.EINVAL:
                        raise
                    self.direct = dfd = None  # not for this file system: the page cache for the rest
            _pwrite(self.fd, buf, off)
        jobs.clear()  # drop the views of done
        return done


def _pwrite(fd, buf, off):
    n = os.pwrite(fd, buf, off)
    while n < len(buf):  # rare: a short write
        n += os.pwrite(fd, buf[n:], off + n)


def open_direct(path):
    """A second descriptor of `path` for O_DIRECT writes, or None where there is no such thing."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return None
    try:
        return os.open(path, os.O_WRONLY | flag)
    except OSError:
        return None  # tmpfs and a few others refuse it


def restore_image(store, root, path, fmt="raw", progress=None):
    """Write the image to `path` as a sparse raw file or a qcow2, atomically.

    The image goes to a temporary file next to `path` and is renamed over it
    only when complete, so a failed restore leaves nothing half written. A
    block device is written in place, zeros included.
    """
    if fmt not in ("raw", "qcow2"):
        raise ValueError(f"unknown output format {fmt!r}")
    path = os.fspath(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise RestoreFailed(path, e.strerror) from None
    if st is not None and stat.S_ISBLK(st.st_mode):
        if fmt != "raw":
            raise RestoreFailed(path, "a block device can only receive a raw image")
        fd = _open(path, os.O_WRONLY)
        try:
            if _device_size(fd) < root.size:
                raise RestoreFailed(path, f"the device is smaller than the image ({root.size} bytes)")
            write_raw(store, root, fd, sparse=False, progress=progress)
            os.fsync(fd)
        finally:
            os.close(fd)
        return
    d, base = os.path.split(os.path.abspath(path))
    tmp = os.path.join(d, f".{base}.{os.getpid()}.restore")
    tmpq = tmp + ".qcow2"
    try:
        fd = _open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        # qemu-img reads the raw file back: keep that one in the cache
        direct = open_direct(tmp) if DIRECT_WRITES and fmt == "raw" else None
        try:
            write_raw(store, root, fd, progress=progress, direct=direct)
            os.ftruncate(fd, root.size)
        except OSError as e:
            raise RestoreFailed(path, e.strerror) from None
        finally:
            os.close(fd)
            if direct is not None:
                os.close(direct)
        if fmt == "qcow2":
            try:
                qemuimg.run(["convert", "-q", "-f", "raw", "-O", "qcow2", tmp, tmpq], f"convert to {tmpq}")
            except qemuimg.QemuImgFailed as e:
                raise RestoreFailed(path, f"qemu-img convert failed: {e.args[1]}") from None
            os.replace(tmpq, path)
        else:
            os.chmod(tmp, 0o644 & ~_umask())
            os.replace(tmp, path)
    except OSError as e:
        raise RestoreFailed(path, e.strerror or str(e)) from None
    finally:
        for t in (tmp, tmpq):
            try:
                os.unlink(t)
            except FileNotFoundError:
                pass


def _umask():
    m = os.umask(0)
    os.umask(m)
    return m


def _open(path, flags, mode=0o666):
    try:
        return os.open(path, flags | os.O_CLOEXEC, mode)
    except OSError as e:
        raise RestoreFailed(path, e.strerror) from None


def _device_size(fd):
    return os.lseek(fd, 0, os.SEEK_END)


def read_blob(store, root):
    """The bytes of a blob written by tree.write_blob."""
    return ImageReader(store, root).read(0, root.size)
