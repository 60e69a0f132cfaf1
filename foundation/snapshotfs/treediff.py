"""The disk byte ranges where two archived days of a disk may differ, from their image trees.

Two image trees of the same disk share every subtree whose blocks did not
change, and a shared subtree has the same ref in both; so walking the two
trees together and descending only where refs differ reads a few hundred
tree nodes for a day that rewrote 60 MB of a 20 GB disk, not the disk.
Kept apart from changes.py so that the nightly listing update can ask
"did anything change where the file systems are?" without importing the
file-system readers.
"""

from foundation.errors import DataCorrupt
from foundation.image.tree import Shape

BATCH = 4096                       # tree nodes per read_blocks call


def changed_ranges(store, a, b):
    """[(offset, length)] of disk bytes where trees `a` and `b` (Roots) may differ, merged.

    Subtrees with equal refs are identical and never read. Trees of different
    depth (a resized disk) count as wholly changed.
    """
    size = max(a.size, b.size)
    if a.ref == b.ref and a.size == b.size:
        return []
    if a.depth != b.depth or a.depth == 0:
        return [(0, size)] if size else []
    sa, sb = Shape(store, a.size), Shape(store, b.size)
    sa.check(a)
    sb.check(b)
    F, rs, bs, null = sa.fanout, sa.rs, sa.bs, store.null_ref
    counts = [max(x, y) for x, y in zip(sa.counts, sb.counts)]
    zero = bytes(bs)
    level = [(0, a.ref, b.ref)]     # differing node pairs of one level: (index, ref a, ref b)
    runs = []                       # differing leaves, as [first, end) runs
    for k in range(a.depth, 0, -1):
        nxt = []
        for i in range(0, len(level), BATCH):
            part = level[i:i + BATCH]
            want = [r for _, ra, rb in part for r in (ra, rb) if r != null]
            got = dict(zip(want, store.read_blocks(b"".join(want)))) if want else {}
            for j, ra, rb in part:
                ca, cb = got.get(ra, zero), got.get(rb, zero)
                if len(ca) != bs or len(cb) != bs:
                    raise DataCorrupt(f"a tree node holds {len(ca)} or {len(cb)} bytes, not {bs}")
                for s in range(min(F, counts[k - 1] - j * F)):
                    if ca[s * rs:(s + 1) * rs] == cb[s * rs:(s + 1) * rs]:
                        continue
                    c = j * F + s
                    if k > 1:
                        nxt.append((c, ca[s * rs:(s + 1) * rs], cb[s * rs:(s + 1) * rs]))
                    elif runs and runs[-1][1] == c:
                        runs[-1][1] = c + 1     # leaves are kept as runs only: a whole new disk stays small
                    else:
                        runs.append([c, c + 1])
        level = nxt
    out = [(s * bs, min(e * bs, size) - s * bs) for s, e in runs]
    if a.size != b.size:
        lo = min(a.size, b.size)
        out = [(o, n) for o, n in out if o < lo] + [(lo, size - lo)]
        out = [(o, min(n, size - o)) for o, n in out]
    return _merge(out)


def _merge(ranges):
    out = []
    for o, n in sorted(ranges):
        if out and o <= out[-1][0] + out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][0] + out[-1][1], o + n) - out[-1][0])
        elif n > 0:
            out.append((o, n))
    return out
