"""Byte and block ranges: validated once at the edge, then plain sorted runs.

Everything inside image/ works on *runs*: sorted, non-overlapping, half-open
(start, end) pairs. Work is proportional to the number of runs, never to the
number of blocks they cover, so a 1 TiB hole costs as little as one block.
The `--changed` file of `foundation import-image` is parsed and checked here,
with an error that names the bad entry, before a single byte is archived.
"""

import json

from foundation.errors import BadInput


class BadRanges(BadInput):
    """Changed-range list {}: {}"""

    code = 31


def merge(runs):
    """Sorted, merged copy of (start, end) runs; empty runs are dropped."""
    out = []
    for s, e in sorted(r for r in runs if r[1] > r[0]):
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out


def subtract(a, b):
    """Runs of `a` not covered by `b` (both merged)."""
    out = []
    j = 0
    for s, e in a:
        while j < len(b) and b[j][1] <= s:
            j += 1
        k = j
        cur = s
        while k < len(b) and b[k][0] < e:
            if b[k][0] > cur:
                out.append((cur, b[k][0]))
            cur = max(cur, b[k][1])
            k += 1
        if cur < e:
            out.append((cur, e))
    return out


def intersect(a, b):
    """Runs covered by both `a` and `b` (both merged)."""
    out = []
    i = j = 0
    while i < len(a) and j < len(b):
        s = max(a[i][0], b[j][0])
        e = min(a[i][1], b[j][1])
        if s < e:
            out.append((s, e))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def total(runs):
    return sum(e - s for s, e in runs)


def outer_blocks(byte_runs, bs, limit):
    """Block runs touching any byte of the byte runs, clipped to `limit` blocks."""
    return merge((s // bs, min(-(-e // bs), limit)) for s, e in byte_runs)


def inner_blocks(byte_runs, bs, limit):
    """Block runs lying wholly inside the byte runs, clipped to `limit` blocks."""
    return merge((-(-s // bs), min(e // bs, limit)) for s, e in merge(byte_runs))


def as_runs(pairs):
    """(offset, length) pairs -> merged (start, end) runs."""
    return merge((o, o + n) for o, n in pairs)


def check_pairs(pairs, size, what="ranges"):
    """Check (offset, length) pairs against an image of `size` bytes -> list of tuples."""
    if not isinstance(pairs, (list, tuple)):
        raise BadRanges(what, f"expected a list of [offset, length] pairs, got {type(pairs).__name__}")
    out = []
    for i, p in enumerate(pairs):
        if (not isinstance(p, (list, tuple)) or len(p) != 2
                or not all(isinstance(x, int) and not isinstance(x, bool) for x in p)):
            raise BadRanges(what, f"entry {i} is {json.dumps(p) if _jsonable(p) else repr(p)}, "
                                  "not an [offset, length] pair of integers")
        off, n = p
        if off < 0 or n < 0:
            raise BadRanges(what, f"entry {i} [{off}, {n}] has a negative offset or length")
        if off + n > size:
            raise BadRanges(what, f"entry {i} [{off}, {n}] ends at byte {off + n}, "
                                  f"beyond the end of the image ({size} bytes)")
        out.append((off, n))
    return out


def _jsonable(p):
    try:
        json.dumps(p)
        return True
    except (TypeError, ValueError):
        return False


def load_changed(path, size):
    """Read and check a `--changed` JSON file: a list of [offset, length] byte ranges."""
    try:
        if path == "-":
            import sys

            text = sys.stdin.read()
        else:
            with open(path, encoding="utf-8") as f:
                text = f.read()
    except OSError as e:
        raise BadRanges(path, f"cannot read it: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise BadRanges(path, "it is not UTF-8 text (expected JSON)") from None
    try:
        pairs = json.loads(text)
    except json.JSONDecodeError as e:
        raise BadRanges(path, f"not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    return check_pairs(pairs, size, path)
