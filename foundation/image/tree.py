"""A disk image is a Merkle tree of block refs; a new day rewrites only its changed paths.

Leaves are the refs of the image's fixed-size blocks (the store's block
size), with the null ref for an all-zero block; interior nodes are TREE
blocks holding exactly `fanout = block_size // ref_size` refs, null refs for
children that are all zero or beyond the end, and the null ref stands for a
whole all-zero subtree. The shape depends only on the size, so two trees of
equal content are equal block for block and dedup completely.

`write_image` walks the leaves that must be (re)computed in increasing
order, 4 MiB of source at a time, one `write_blocks` call per batch of
leaves (the store pipelined: a batch is read while the one before is
hashed and the one before that appended) and one per level for the
interior nodes completed, a few hundred at a time; it keeps open only the
nodes on the frontier, so memory stays bounded by the batch size and
OPEN_NODES whatever the image size. With a previous root and a list of
changed byte ranges it opens just the nodes above changed leaves (one
batched read per level), patches them and writes back only the nodes whose
bytes changed: everything else is shared with the day before.

The byte layout is in docs/format.md (section "Image trees").
"""

import concurrent.futures
import contextlib
import mmap
from collections import OrderedDict

from foundation.errors import DataCorrupt, DerivedCorrupt, NotFound
from foundation.image import ranges as R
from foundation.image.shape import Root, Shape, split_refs
from foundation.store import BlockType

# Bytes of source per write_blocks call (2 + the store's `ahead` such buffers in use): 4 MiB
# batches cost the same CPU as 16 MiB ones (measured) and a quarter of the memory.
CHUNK = 4 << 20
SPLIT = 1 << 20  # a batch's two concurrent reads are cut at a multiple of this
HALVES = True  # a raw image's batch read as two concurrent halves (False: one read after the other)
OPEN_NODES = 512  # level-1 nodes kept open before the completed ones are written
# Appends in flight (the store's `ahead`) while a source that takes two reads at once is
# archived: its reads keep up, so the caller waits on the append before it, and one more batch
# queued behind it kept both cores busier (day 0 -3.6 %, 11 of 11 pairs, +5 MB at the peak); a
# source read one batch at a time gained nothing and stays at the store's own (benchmarks/README.md,
# wave 18). A domain's disk is read two at a time but archived with deep=False (vm/sink.py: memory).
DEEP = 2
# Batches read ahead of the one being written, for such a source (one otherwise): with the
# appends no longer the chain, the caller waited on the next batch's reads and hashes (day 0
# faster in 21 of 24 pairs, medians -1 to -5 %, +4 MB; benchmarks/README.md, wave 18).
DEEP_READS = 2
AHEAD_NODES = 512  # level-1 nodes of the batches ahead opened (read) together on a later day (~2 MiB
# of copies being patched): a day of the standard workload (~340 of them) opens all in one read per
# level before its first batch, not a second window mid-day that stalls the pipeline (settle, reads)


class _Builder:
    """The frontier of one write_image call: open nodes per level, patched, then written."""

    def __init__(self, store, shape, base):
        self.s = store
        self.sh = shape
        self.rs, self.F = shape.rs, shape.fanout
        self.null = store.null_ref
        self.zero_node = bytes(shape.bs)
        self.base = base  # previous Root (same disk) or None: the old content to patch
        self.open = [None] + [OrderedDict() for _ in range(shape.depth)]
        self.root_ref = None
        self.written_nodes = 0
        if shape.depth >= 1:
            self.open[shape.depth][0] = self._old_root()

    # ---- old content --------------------------------------------------------
    def _entry(self, old_ref, old_content):
        """An open node: [content being patched, old ref (None: must be written), changed]. Whether
        a patch changed it is noted as it is made (_patch), so the old bytes need not be kept
        beside the copy being patched: a later day opens ~340 nodes at once, 4 KiB each."""
        return [bytearray(self.zero_node if old_content is None else old_content), old_ref, False]

    def _old_root(self):
        b, sh = self.base, self.sh
        if b is None:
            return self._entry(self.null, None)
        if b.depth == sh.depth:
            return self._entry(b.ref, self._read_node(b.ref))
        if b.depth > sh.depth:  # shrunk: the new tree is the leftmost subtree of the old one
            r = b.ref
            for _ in range(b.depth - sh.depth):
                r = self._read_node(r)[: self.rs]
            return self._entry(r, self._read_node(r))
        return self._grown(sh.depth)

    def _grown(self, level):
        """Old content of node 0 at a level above the old root (the image grew)."""
        if level == self.base.depth + 1:
            return self._entry(None, self.base.ref + self.null * (self.F - 1))
        return self._entry(None, None)  # slot 0 is filled when its child is written

    def _read_node(self, ref):
        if ref == self.null:
            return self.zero_node
        _settle(self.s)
        return self.s.read(ref)

    def ensure(self, js1):
        """Open the level-1 nodes `js1` (sorted) and every node above them, one read per level."""
        depth, F, rs = self.sh.depth, self.F, self.rs
        need = {1: js1}
        for k in range(2, depth):
            need[k] = sorted({j // F for j in need[k - 1]})
        for k in range(depth - 1, 0, -1):
            od = self.open[k]
            todo = [j for j in need[k] if j not in od]
            if not todo:
                continue
            if self.base is None:
                for j in todo:
                    od[j] = self._entry(self.null, None)
                continue
            parents = self.open[k + 1]
            want, refs = [], []
            for j in todo:
                if self.base.depth < k and j == 0:
                    od[j] = self._grown(k)
                    continue
                p = parents[j // F][0]
                slot = (j % F) * rs
                r = bytes(p[slot:slot + rs])
                if r == self.null:
                    od[j] = self._entry(self.null, None)
                else:
                    od[j] = None  # keep insertion order; filled below
                    want.append(j)
                    refs.append(r)
            if refs:
                _settle(self.s)
                for j, r, data in zip(want, refs, _read_nodes(self.s, b"".join(refs))):
                    if len(data) != self.sh.bs:
                        raise DataCorrupt(f"tree node {r.hex()} holds {len(data)} bytes, not {self.sh.bs}")
                    od[j] = self._entry(r, data)

    # ---- patching and writing ---------------------------------------------------
    def put_leaves(self, b0, refs):
        """Set leaves b0.. to the concatenated `refs` in their level-1 nodes (already open)."""
        F, rs = self.F, self.rs
        n = len(refs) // rs
        od = self.open[1]
        i = 0
        while i < n:
            b = b0 + i
            j, slot = divmod(b, F)
            m = min(F - slot, n - i)
            _patch(od[j], slot * rs, refs[i * rs:(i + m) * rs])
            i += m

    def finish(self, next_leaf):
        """Write every open node wholly before leaf `next_leaf` (None: all of them)."""
        depth, F, rs = self.sh.depth, self.F, self.rs
        for k in range(1, depth + 1):
            od = self.open[k]
            span = F**k
            done = []
            while od:
                j = next(iter(od))
                if next_leaf is not None and (j + 1) * span > next_leaf:
                    break
                done.append((j, od.pop(j)))
            if not done:
                continue
            writes, slots = [], []
            below = self.sh.counts[k - 1]
            for j, node in done:
                content, old_ref = node[0], node[1]
                valid = below - j * F
                if valid < F:  # the right edge: children beyond the end are null
                    _patch(node, valid * rs, bytes((F - valid) * rs))
                if old_ref is not None and not node[2]:
                    ref = old_ref
                elif content == self.zero_node:
                    ref = self.null
                else:
                    ref = None
                    writes.append(content)
                slots.append([j, ref])
            if writes:
                new = split_refs(self.s.write_blocks(b"".join(writes), btype=BlockType.TREE), rs)
                self.written_nodes += len(new)
                it = iter(new)
                for sl in slots:
                    if sl[1] is None:
                        sl[1] = next(it)
            for j, ref in slots:
                if k == depth:
                    self.root_ref = ref
                else:
                    _patch(self.open[k + 1][j // F], (j % F) * rs, ref)


def _patch(node, at, refs):
    """Put refs into an open node's content at byte `at`, noting whether that changed its bytes (a
    node with no old ref is written whatever changed: no compare, as on every node of a day 0)."""
    content = node[0]
    end = at + len(refs)
    if node[1] is None:
        content[at:end] = refs
    elif content[at:end] != refs:
        content[at:end] = refs
        node[2] = True


def _todo(shape, base, changed):
    """Leaf runs to compute again: every leaf, or those the changes touch."""
    bs, n = shape.bs, shape.nleaves
    if base is None or changed is None:
        return [(0, n)] if n else []
    todo = R.outer_blocks(R.as_runs(changed), bs, n)
    if base.size != shape.size:  # re-read both last leaves: tails must be zero
        extra = [(n - 1, n)] if n else []
        old_last = -(-base.size // bs) - 1
        if 0 <= old_last < n:
            extra.append((old_last, old_last + 1))
        todo = R.merge(todo + extra)
    return todo


def _holes(src, shape, base, changed, zeros):
    """The source's holes, asked about the leaves the plan may read only (a later day: its changes
    and the zero ranges' edges), when the source takes that; None if it has no holes()."""
    if not hasattr(src, "holes"):
        return None
    if base is None or changed is None or not getattr(src, "holes_within", False):
        return src.holes()
    bs, n = shape.bs, shape.nleaves
    blocks = R.merge(_todo(shape, base, changed) + R.outer_blocks(R.as_runs(zeros), bs, n))
    return src.holes(within=[(s * bs, e * bs) for s, e in blocks])


def _plan(shape, base, changed, zeros, holes):
    """-> (read runs, null runs) of leaves, both merged and disjoint. Only the holes inside the
    leaves of todo and of the zero ranges' edges count (_holes asks about those alone)."""
    bs, n = shape.bs, shape.nleaves
    todo = _todo(shape, base, changed)
    zrun = R.as_runs(zeros)
    zero_full = R.inner_blocks(zrun, bs, n)
    zero_part = R.subtract(R.outer_blocks(zrun, bs, n), zero_full)
    hole_full = R.inner_blocks(R.as_runs(holes), bs, n) if holes else []
    if base is None or changed is None:
        nulls = []  # the old content is all zero anyway: nothing to clear
    else:
        nulls = R.merge(zero_full + R.intersect(todo, hole_full))
    skip = R.merge(zero_full + hole_full)
    reads = R.subtract(R.merge(todo + zero_part), skip)
    return reads, nulls


def _chunks(reads, nulls, per):
    """Batches of at most `per` leaves: lists of (b0, b1, is_read), in leaf order."""
    events = sorted([(s, e, True) for s, e in reads] + [(s, e, False) for s, e in nulls])
    batch, used = [], 0
    for s, e, rd in events:
        while s < e:
            m = min(e - s, per - used)
            batch.append((s, s + m, rd))
            used += m
            s += m
            if used == per:
                yield batch
                batch, used = [], 0
    if batch:
        yield batch


def write_image(store, src, size, prev=None, changed=None, zeros=(), progress=None, batch=None, deep=True):
    """Archive `size` bytes of `src` as a tree; -> Root.

    src.read(offset, length) -> bytes-like gives the image as it is now (a
    short read at the end means zeros), or src.readinto(offset, view) ->
    count, which is used when present: batches are read into a few reused
    buffers (2 + the store's `ahead`), so the store must not keep a reference
    to the buffer it is given past `ahead` more write_blocks calls (a source that takes two
    reads at once, `parallel_reads`, unless deep is False: DEEP appends in flight and
    DEEP_READS batches read ahead, 1 + DEEP_READS + DEEP buffers); src.holes() -> [(offset, length)],
    when present, names ranges known to read as zero, which are never read.
    prev: the Root of the previous snapshot of this disk, or None.
    changed: (offset, length) ranges that differ from prev; bytes beyond
    prev.size count as zero in prev. None reads everything.
    zeros: ranges archived as zeros whatever they hold (swap).
    progress: called with the number of bytes processed; its `total`
    attribute, if it has one, is set first to the bytes to be processed.
    batch: bytes read and handed to the store at a time (default CHUNK; 2 +
    the store's `ahead` such buffers are in use at once, and the store packs
    each into one of its own).
    """
    batch = batch or CHUNK
    sh = Shape(store, size)
    if prev is not None:
        Shape(store, prev.size).check(prev, "previous")
    if changed is not None:
        changed = R.check_pairs(list(changed), size)
    zeros = R.check_pairs(list(zeros), size, "zero ranges")
    if changed == [] and not zeros and prev is not None and prev.size == size:
        return prev  # nothing changed: not even the source's holes are looked up
    base = prev if changed is not None else None
    holes = _holes(src, sh, base, changed, zeros)
    reads, nulls = _plan(sh, base, changed, zeros, holes)
    if progress is not None and hasattr(progress, "total"):
        progress.total = max(1, min(size, (R.total(reads) + R.total(nulls)) * sh.bs))

    if not reads and not nulls and base is not None and base.size == size:
        return prev  # nothing changed
    bs, rs = sh.bs, sh.rs
    zrun = R.as_runs(zeros)
    builder = _Builder(store, sh, base) if sh.depth >= 1 else None
    leaf0 = None  # depth 0: the only leaf
    if sh.depth == 0 and base is not None and sh.nleaves:
        leaf0 = base.ref

    # A compare-by-hash store's blocks are hashed by the thread that read them, as soon as they
    # are read: batch i+1 is hashed beside the decision of batch i (the caller, in Python) and
    # the pack of batch i-1 (the append thread), not after the decision on the caller's thread.
    prehash = getattr(store, "hash_blocks", None) if getattr(store, "mode", None) == "hash" else None
    threads = getattr(getattr(store, "tuning", None), "threads", 1)  # (a batch read in one piece)

    def read_pieces(mv, pieces, lo=0, hi=0, threads=1):
        """Read (image offset, buffer position, length) pieces into mv; -> the hashes of
        mv[lo:hi] (prehash), or None."""
        for off, pos, n in pieces:
            want = max(0, min(n, size - off))
            got = _readinto(src, off, mv[pos:pos + want]) if want else 0
            if got < n:  # the end of the image: zeros
                mv[pos + got:pos + n] = bytes(n - got)
            for zs, ze in R.intersect([(off, off + n)], zrun):
                mv[pos + zs - off:pos + ze - off] = bytes(ze - zs)
        return prehash(mv[lo:hi], threads) if prehash is not None and hi > lo else None

    def read_batch(batch, buf):
        """Start reading the batch's leaves into `buf`, back to back -> (futures, memoryview of them).
        A source that takes concurrent reads gets two at a time, each half the batch: the disk
        then works on the next read while the one before completes (measured on this machine's
        disk: 4 MiB reads one at a time 2.17 s for a day 0's 1.36 GB, two of 2 MiB 1.78 s; 10 s
        against 4.6 s while other work kept the disk busy)."""
        mv = memoryview(buf)
        pieces, pos = [], 0
        for s, e, rd in batch:
            if rd:
                pieces.append((s * bs, pos, (e - s) * bs))
                pos += (e - s) * bs
        half = pos // 2 & -SPLIT  # a multiple of every block size (and of O_DIRECT's alignment)
        if not HALVES or not getattr(src, "parallel_reads", False) or not half:
            return [pool.submit(read_pieces, mv, pieces, 0, pos, threads)], mv[:pos]
        first, second = [], []
        for off, p, n in pieces:
            if p + n <= half:
                first.append((off, p, n))
            elif p >= half:
                second.append((off, p, n))
            else:
                first.append((off, p, half - p))
                second.append((off + half - p, half, n - (half - p)))
        # each half hashed on its own reader thread alone: the two halves already keep two cores
        # busy, and helpers woken for each would only add hand-offs (benchmarks/README.md, wave 12)
        return [pool.submit(read_pieces, mv, first, 0, half, 1),
                pool.submit(read_pieces, mv, second, half, pos, 1)], mv[:pos]

    batches = list(_chunks(reads, nulls, max(1, batch // bs)))
    per = max(1, batch // bs) * bs
    # Batches i+1 .. i+ahead_reads are read while batch i is hashed and the batches before it
    # appended (a pipelined store keeps a batch's buffer for `ahead` more calls).
    # Anonymous maps, not bytearrays: their pages are zero until the first read fills them.
    pipelined = getattr(store, "pipelined", None)
    ahead = getattr(store, "ahead", 1)
    deep = (max(ahead, DEEP) if deep and prehash is not None and HALVES and getattr(src, "parallel_reads", False)
            else None)
    ahead_reads = DEEP_READS if deep else 1
    # (a scope already open keeps its own `ahead`, at most deep: enough buffers for either)
    keep = 1 + ahead_reads + ((deep or ahead) if pipelined else 0)
    free = [mmap.mmap(-1, min(per, max(bs, R.total(reads) * bs))) for _ in range(min(keep, len(batches)))]
    opened = 0  # batches[:opened] have their level-1 nodes open
    with concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="read-image") as pool, \
            (pipelined(R.total(reads), ahead=deep) if pipelined else contextlib.nullcontext()):
        pending = [read_batch(batches[j], free[j]) for j in range(min(ahead_reads, len(batches)))]
        for i, batch in enumerate(batches):
            futures, buf = pending.pop(0)
            j = i + ahead_reads
            if j < len(batches):  # (its buffer's batch, `keep` calls back, has been appended)
                pending.append(read_batch(batches[j], free[j % len(free)]))
            if builder is not None and opened <= i:
                # The old nodes of this batch and the next ones, up to AHEAD_NODES, in one read per
                # level, before the batch's append is in flight: one wait for the append before
                # and for the disk, not one per batch (cold, each costs a disk latency or more).
                js, opened = set(_level1(batch, sh.fanout)), i + 1
                while opened < len(batches):
                    more = _level1(batches[opened], sh.fanout)
                    if len(js) + len(more) > AHEAD_NODES:
                        break
                    js.update(more)
                    opened += 1
                builder.ensure(sorted(js))  # (the batch is read and hashed meanwhile)
            hashed = [f.result() for f in futures]
            hashed = None if None in hashed or not len(buf) else (
                b"".join(h[0] for h in hashed), b"".join(h[1] for h in hashed))
            if not len(buf):
                refs = b""
            elif hashed is not None:
                refs = store.write_blocks(buf, btype=BlockType.DATA, hashed=hashed)
            else:
                refs = store.write_blocks(buf, btype=BlockType.DATA)
            if len(refs) != len(buf) // bs * rs:
                raise RuntimeError("store returned the wrong number of refs")
            pos = 0
            for s, e, rd in batch:
                if rd:
                    part = refs[pos:pos + (e - s) * rs]
                    pos += (e - s) * rs
                else:
                    part = store.null_ref * (e - s)
                if builder is not None:
                    builder.put_leaves(s, part)
                else:
                    leaf0 = part
            if builder is not None:
                # Completed nodes are written a few hundred at a time: each
                # write of them waits for the data append in flight.
                nxt = batches[i + 1][0][0] if i + 1 < len(batches) else None
                if nxt is None or _done(builder.open[1], nxt // sh.fanout) >= OPEN_NODES:
                    builder.finish(nxt)
            if progress is not None:
                progress(min(size, sum(e - s for s, e, _ in batch) * bs))
    if builder is None:
        return Root(leaf0 if leaf0 is not None else store.null_ref, size, 0)
    if builder.root_ref is None:
        builder.finish(None)
    return Root(builder.root_ref, size, sh.depth)


def _level1(batch, fanout):
    """The level-1 nodes above a batch's leaves, in order."""
    return sorted({j for s, e, _ in batch for j in range(s // fanout, (e - 1) // fanout + 1)})


def _done(od, j1):
    """How many open nodes (in increasing order) lie before node j1: those finish() may write."""
    k = 0
    for j in od:
        if j >= j1:
            break
        k += 1
    return k


def _read_nodes(store, refs):
    """Old tree nodes, located by the index lookups the read makes together (no arena summary loaded
    to confirm each: ~30 of them a later day); read again the careful way if anything is amiss."""
    trusting = getattr(store, "trusting_index", None)
    if trusting is None:
        return store.read_blocks(refs)
    try:
        with trusting():
            return store.read_blocks(refs)
    except (DataCorrupt, DerivedCorrupt, NotFound):
        return store.read_blocks(refs)


def _settle(store):
    """Before a store call but write_blocks: the append in flight ends first."""
    f = getattr(store, "settle", None)
    if f is not None:
        f()


def _readinto(src, offset, view):
    """Fill `view` from the source at `offset` -> bytes read (fewer only at the end)."""
    f = getattr(src, "readinto", None)
    if f is not None:
        return f(offset, view)
    data = src.read(offset, len(view))
    n = min(len(data), len(view))
    view[:n] = memoryview(data)[:n]
    return n


class BytesSource:
    """An in-memory image: what blobs and tests archive."""

    def __init__(self, data):
        self.data = memoryview(data)

    def read(self, offset, length):
        return self.data[offset:offset + length]

    def readinto(self, offset, view):
        part = self.data[offset:offset + len(view)]
        view[:len(part)] = part
        return len(part)


def write_blob(store, data, prev=None, prev_data=None):
    """Store arbitrary bytes as a tree -> Root.

    Given the previous version (`prev` and its bytes `prev_data`), only the
    blocks from the first differing byte on are written again.
    """
    data = bytes(data)
    changed = None
    if prev is not None and prev_data is not None:
        n = min(len(data), len(prev_data))
        i = 0
        for step in (1 << 16, 1 << 12, 1 << 8, 1 << 4, 1):  # the common prefix, in ever shorter steps
            while i + step <= n and data[i:i + step] == prev_data[i:i + step]:
                i += step
        changed = [(i, len(data) - i)] if i < len(data) else []
    return write_image(store, BytesSource(data), len(data),
                       prev=prev if changed is not None else None, changed=changed)
