"""Laying the log out again, the newest days first (compare-by-hash mode).

Each night appends only what changed, so after a year the newest day's
blocks lie scattered over a year of arenas: a restore of today reads a
little of every arena, and on a USB hard disk each of those reads is a
seek. In hash mode a block's name is its score, so a record may move
anywhere without a pointer changing. `gc --relayout` copies every live
record into a new log: first the newest snapshot of each VM, each disk's
data blocks in disk order and then its tree nodes level by level upwards
(children still lie before their parents, as the mark expects), then
every other live record in its old log order. A restore of the newest
day then reads a few arenas front to back. A plain gc lays out the tail
of the log it would rewrite for the most part anyway (the whole log after
a year pruned at once, a month's arenas after a monthly prune): there
only the newest days' records that lie in the tail come first, so each
such gc leaves them in one more stretch read front to back.

The new log is written beside the old one and switched in as one through
the journal compare-by-value gc uses (foundation.store.switch): killed
before the journal, the old log stands; after it, the next writer rolls
the switch forward.
"""

from foundation.errors import Error
from foundation.gc.compact import groups
from foundation.gc.mark import ValueLive
from foundation.image.reader import ImageReader
from foundation.image.shape import Shape, split_refs
from foundation.store import format as F

BATCH = 1024     # records read and appended per step (~4 MiB of 4 KiB blocks)
NODES = 512      # level-1 nodes read at once to find their leaves (64 Ki leaves)
SAMPLE = 64      # stretches of each newest disk that scatter() looks at


class Placed(ValueLive):
    """Which records of the old log the new one holds already: one byte per record, found by its
    position in its arena's summary, as compare-by-value gc's live set."""

    def take(self, addrs):
        """The addresses not placed yet, in order, each once; they count as placed from now on."""
        out = []
        for a in addrs:
            n, i = self.position(a)
            if not self.flags[n][i]:
                self.flags[n][i] = 1
                out.append(a)
        return out


def newest_roots(cat):
    """The disk roots of the newest snapshot of each name, in name and disk order."""
    out = []
    for name in cat.names():
        snap = cat.snapshots(name)[-1]
        out += [snap.disks[d].root for d in sorted(snap.disks)]
    return out


def image_order(store, root):
    """Batches of scores of one image's records, in the order the new log holds them: its data
    blocks in disk order, then its tree nodes level by level upwards. Level-1 nodes are read a
    batch at a time, so memory stays bounded by the nodes above the leaves."""
    null, rs = store.null_ref, store.ref_size
    if root.ref == null:
        return
    sh = Shape(store, root.size)
    sh.check(root)
    levels = [[root.ref]]  # from the root down to level 1
    for _ in range(sh.depth - 1):
        below = []
        for i in range(0, len(levels[-1]), NODES):
            for data in store.read_blocks(b"".join(levels[-1][i:i + NODES]), cache=False):
                below += [r for r in split_refs(data, rs) if r != null]
        levels.append(below)
    if sh.depth == 0:
        yield [root.ref]
        return
    ones = levels[-1]
    for i in range(0, len(ones), NODES):
        leaves = []
        for data in store.read_blocks(b"".join(ones[i:i + NODES]), cache=False):
            leaves += [r for r in split_refs(data, rs) if r != null]
        for j in range(0, len(leaves), BATCH):
            yield leaves[j:j + BATCH]
    for refs in reversed(levels):
        for j in range(0, len(refs), BATCH):
            yield refs[j:j + BATCH]


def scatter(store, cat):
    """How scattered the newest days lie -> (ratio, their disks' bytes). Over SAMPLE stretches of
    each newest disk spread evenly (the leaves of one level-1 node: 512 KiB of 4 KiB blocks), the
    mean number of arenas a stretch's blocks lie in, over what a stretch read in disk order
    would touch (1 + its bytes / the arena size): ~1 for a disk laid out in order, about the
    number of nights that wrote a stretch when they scattered it. Reads SAMPLE level-1 nodes and
    locates their blocks: cheap beside a gc."""
    null, rs = store.null_ref, store.ref_size
    seen, size = [], 0
    for root in newest_roots(cat):
        size += root.size
        if root.ref == null or root.depth == 0:
            continue
        r = ImageReader(store, root)
        fan, n1 = r.sh.fanout, r.sh.counts[1]
        for j in sorted({i * n1 // SAMPLE for i in range(min(SAMPLE, n1))}):
            try:
                refs = r.leaf_refs(j * fan, min((j + 1) * fan, r.sh.nleaves))
                live = b"".join(x for x in split_refs(refs, rs) if x != null)
                if live:
                    seen.append(len({a >> 32 for a in store.addresses(live)}))
            except Error:  # a damaged node or a missing block: gc's own business, not the sample's
                continue
    if not seen:
        return 1.0, size
    ideal = 1 + store.block_size * (store.block_size // rs) / store.arena_size
    return sum(seen) / len(seen) / ideal, size


def copy_live(store, arenas, live, cat, out, progress=None, first=0):
    """Copy every live record of arenas first..last into `out` (a Relog from arena `first`): those
    of the newest days first. progress(records copied so far) after each batch -> the records
    copied."""
    placed = Placed(arenas)
    done = 0

    def copy(addrs):  # a live record that fails to read stops gc here, before the switch
        nonlocal done
        if addrs:
            got = store.log.read_many(addrs)
            for btype, keyfield, data in groups([got[a] for a in addrs]):
                out.append(btype, keyfield, data)
            done += len(addrs)
            if progress:
                progress(done)

    tail = first << 32  # the first address the new log replaces
    for root in newest_roots(cat):
        for refs in image_order(store, root):
            copy(placed.take(a for a in store.addresses(b"".join(refs)) if a >= tail))
    for n in range(first, arenas.last + 1):
        keys, addrs, types, _ = arenas.records(n)
        rest = [a for i, a in enumerate(addrs)
                if types[i] != F.COMMIT and keys[i * 32:(i + 1) * 32] in live]  # a commit record names the old log
        rest = placed.take(rest)
        for j in range(0, len(rest), BATCH):
            copy(rest[j:j + BATCH])
    return done
