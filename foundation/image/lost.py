"""Which byte ranges of an archived image can no longer be read: salvage names them, never guesses.

A tree is walked a level at a time, from its root: an interior node that
cannot be read costs every leaf below it, and a leaf costs its own block.
The nodes of a level are read in one pass in log order, and the leaf refs
of the whole bottom level are checked in one call (Store.unreadable)
without reading a leaf. Trees are content-addressed, so a subtree's loss
is a function of its ref: `Losses` keeps what it found for each subtree
and walks only what changed since the days it has seen, which is why
naming the loss of many days costs little more than naming one.
"""

import bisect

from foundation.errors import DataCorrupt, NotFound
from foundation.image.shape import Shape, split_refs


class Losses:
    """Lost byte ranges of many trees of one store, each shared subtree looked at once."""

    def __init__(self, store):
        self.store = store
        self.seen = {}  # (level, ref, leaves under it) -> [(first, end)] of its lost leaves, relative

    def ranges(self, root):
        """[(start, end)] byte ranges of the image under root that no intact record holds, merged."""
        store, seen = self.store, self.seen
        sh = Shape(store, root.size)
        bs, rs, null = sh.bs, sh.rs, store.null_ref
        lost = []  # (first leaf, end leaf)
        if sh.depth == 0:
            if root.ref != null and store.unreadable(root.ref):
                lost.append((0, 1))
            return self._bytes(lost, bs, root.size)
        walked = []  # (key, b0, b1) of the nodes read: their losses are kept once the tree is done
        level = [(0, root.ref)]  # (node number in its level, ref)
        for k in range(sh.depth, 0, -1):
            span = sh.fanout ** k
            todo = []
            for j, ref in level:
                b0, b1 = j * span, min(sh.nleaves, (j + 1) * span)
                if ref == null or b0 >= b1:
                    continue
                key = (k, ref, b1 - b0)
                if key in seen:
                    lost += [(b0 + a, b0 + b) for a, b in seen[key]]
                else:
                    todo.append((j, ref, b0, b1))
                    walked.append((key, b0, b1))
            level, leaves, firsts, starts = [], [], [], []  # the bottom level: its leaf refs, joined
            at = 0   # leaf refs gathered so far
            for (j, ref, b0, b1), node in zip(todo, self._nodes([t[1] for t in todo], bs)):
                if node is None:
                    lost.append((b0, b1))
                    continue
                refs = node[:(sh.counts[k - 1] - j * sh.fanout) * rs]
                if k > 1:
                    level += [(j * sh.fanout + i, r) for i, r in enumerate(split_refs(refs, rs))]
                else:
                    firsts.append(at)
                    starts.append(b0)
                    leaves.append(refs)
                    at += len(refs) // rs
            for i in store.unreadable(b"".join(leaves)) if leaves else ():
                x = bisect.bisect_right(firsts, i) - 1   # the node whose refs hold position i
                b = starts[x] + i - firsts[x]
                lost.append((b, b + 1))
        lost = _merge(lost)
        ends = [b for _, b in lost]
        for key, b0, b1 in walked:
            x = bisect.bisect_right(ends, b0)
            mine = []
            while x < len(lost) and lost[x][0] < b1:
                mine.append((max(lost[x][0], b0) - b0, min(lost[x][1], b1) - b0))
                x += 1
            seen[key] = mine
        return self._bytes(lost, bs, root.size)

    def _nodes(self, refs, bs):
        """The tree nodes refs name, in one pass in log order; None for one that cannot be read."""
        store = self.store
        try:
            got = store.read_blocks(b"".join(refs)) if refs else []
        except (DataCorrupt, NotFound):
            got = []
            for ref in refs:   # a damaged one among them: each on its own, to name which
                try:
                    got.append(store.read(ref))
                except (DataCorrupt, NotFound):
                    got.append(None)
        return [bytes(d) if d is not None and len(d) == bs else None for d in got]

    @staticmethod
    def _bytes(leaves, bs, size):
        return [(a * bs, min(b * bs, size)) for a, b in _merge(leaves)]


def _merge(ranges):
    """Sorted ranges with touching and overlapping ones joined."""
    out = []
    for a, b in sorted(ranges):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def lost_ranges(store, root):
    """[(start, end)] byte ranges of the image under root that no intact record holds, merged."""
    return Losses(store).ranges(root)


def describe(ranges):
    """'bytes 0-4095, 8192-12287' for [(start, end)] (end exclusive)."""
    return ", ".join(f"{a}-{b - 1}" for a, b in ranges)
