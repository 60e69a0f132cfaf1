"""Which byte ranges of an archived image can no longer be read: salvage names them, never guesses.

The tree is walked from its root; an interior node that cannot be read
costs every leaf below it, and a leaf costs its own block. Leaves are
checked against what the store holds (Store.unreadable) without reading
them, so naming the loss of a whole day costs one pass over its tree nodes.
"""

from foundation.errors import DataCorrupt, NotFound
from foundation.image.shape import Shape, split_refs

BATCH = 8192  # leaf refs checked per call


def lost_ranges(store, root):
    """[(start, end)] byte ranges of the image under root that no intact record holds, merged."""
    sh = Shape(store, root.size)
    bs, null = sh.bs, store.null_ref
    leaves = []  # (first leaf, last leaf + 1) that are lost

    def lose(b0, b1):
        if leaves and leaves[-1][1] == b0:
            leaves[-1] = (leaves[-1][0], b1)
        else:
            leaves.append((b0, b1))

    def check_leaves(b0, refs):
        for i in store.unreadable(b"".join(refs)):
            lose(b0 + i, b0 + i + 1)

    def walk(k, j, ref):
        span = sh.fanout ** k
        b0, b1 = j * span, min(sh.nleaves, (j + 1) * span)
        if ref == null or b0 >= b1:
            return
        try:
            node = store.read(ref)
            if len(node) != bs:
                raise DataCorrupt("tree node of the wrong size")
        except (DataCorrupt, NotFound):
            lose(b0, b1)
            return
        refs = split_refs(node, sh.rs)[:sh.counts[k - 1] - j * sh.fanout]
        if k == 1:
            for g in range(0, len(refs), BATCH):
                check_leaves(b0 + g, refs[g:g + BATCH])
            return
        for i, r in enumerate(refs):
            walk(k - 1, j * sh.fanout + i, r)

    if sh.depth == 0:
        if root.ref != null:
            check_leaves(0, [root.ref])
    else:
        walk(sh.depth, 0, root.ref)
    return [(a * bs, min(b * bs, root.size)) for a, b in leaves]


def describe(ranges):
    """'bytes 0-4095, 8192-12287' for [(start, end)] (end exclusive)."""
    return ", ".join(f"{a}-{b - 1}" for a, b in ranges)
