"""The geometry a tree's writer and reader share: its root, its shape, refs cut from a node.

Both sides of an image tree (tree.py writes, reader.py reads) need the
same arithmetic, so it lives below both and neither imports the other.
"""

import collections

from foundation.errors import DataCorrupt


class Root(collections.namedtuple("Root", "ref size depth")):
    """The root of one tree: the ref of its top block, the logical size, the depth.

    depth 0: `ref` is the single leaf (size <= block_size); depth d >= 1:
    `ref` is a TREE node whose children are trees of depth d - 1. A null
    `ref` is an all-zero image of `size` bytes.
    """

    __slots__ = ()  # a value, as a frozen dataclass is (foundation/fields.py says why not one)

    def to_json(self):
        return {"ref": self.ref.hex(), "size": self.size, "depth": self.depth}

    @classmethod
    def from_json(cls, d):
        try:
            ref = bytes.fromhex(d["ref"])
            size, depth = d["size"], d["depth"]
        except (KeyError, TypeError, ValueError) as e:
            raise DataCorrupt(f"tree root {d!r} is malformed ({e})") from None
        if not (isinstance(size, int) and isinstance(depth, int) and size >= 0 and 0 <= depth < 64):
            raise DataCorrupt(f"tree root {d!r} has a bad size or depth")
        return cls(ref, size, depth)


class Shape:
    """The geometry of a tree of `size` bytes in a store: fanout, depth, nodes per level."""

    def __init__(self, store, size):
        self.bs = store.block_size
        self.rs = store.ref_size
        self.fanout = self.bs // self.rs
        if self.fanout * self.rs != self.bs or self.fanout < 2:
            raise ValueError(f"block size {self.bs} is not a multiple of the ref size {self.rs}")
        self.size = size
        self.nleaves = -(-size // self.bs)
        d, cap = 0, 1
        while cap < self.nleaves:
            d += 1
            cap *= self.fanout
        self.depth = d
        # counts[k]: nodes at level k (level 0 = leaves, level depth = the root)
        self.counts = [-(-self.nleaves // self.fanout**k) for k in range(d + 1)]

    def check(self, root, what="image"):
        if root.depth != self.depth or len(root.ref) != self.rs:
            raise DataCorrupt(f"{what} tree root has depth {root.depth} and a {len(root.ref)}-byte ref; "
                              f"a {root.size}-byte tree in this store has depth {self.depth} "
                              f"and {self.rs}-byte refs")


def split_refs(buf, rs):
    """The refs in `buf`, `rs` bytes each."""
    return [buf[i:i + rs] for i in range(0, len(buf), rs)]
