"""Marking: which records a kept snapshot still reaches (paper §7.1).

A node is written after its children and a catalog after its trees, so a
sweep from the newest arena to the oldest marks nearly the whole live set:
when it reaches a live tree node, what the node names mostly lies behind
it and is marked before the sweep gets there. Only TREE records are read;
leaves are judged from the summaries alone.

In compare-by-value mode a ref is an address, which exists only once its
record is written: every ref points backwards, so one sweep is exact. The
live set is exact too: one byte per record, found by its position in its
arena's summary.

In compare-by-hash mode a ref is a score, a name that may be stored again
later, so a node can name a record stored after it: an archive that
deduplicates onto an old node whose child a gc dropped (the node's arena
was not rewritten) stores the child again, after the node; a damaged node
stored again (archiving heals) lands after the nodes that name it. So hash
mode sweeps again until a sweep expands no new node: a node that became
live after a sweep passed its arena is expanded by the next one. Usually
that is one more pass over the summaries, reading no record. The live set
is a Bloom filter of scores (about 1.8 bytes per record of the log): a
false positive only keeps a little garbage.
"""

import bisect
import os
from array import array

import pybloomfilter

from foundation.errors import DataCorrupt
from foundation.store import format as F
from foundation.store import layout as L

LIVE_ERROR = 0.001  # Bloom false positives: the share of garbage a sweep may keep
LIVE_FILE = "gc.live"


class Arenas:
    """The records of every arena, from summaries (sealed) or memory (open)."""

    def __init__(self, store):
        self.store = store
        self.last = store.log.open.n

    def records(self, n):
        """(keys, addrs, types, end) of arena n, every record including damaged ones."""
        oa = self.store.log.open
        if n == oa.n:
            return bytes(oa.keys), list(oa.addrs), bytes(oa.types), oa.end
        keys, addrs, types = self.store.summary_records(n)
        tr = self.store.log.trailer(n)
        if tr is None:
            raise DataCorrupt(f"arena {n}: sealed arena has no valid trailer")
        return bytes(keys), list(addrs), bytes(types), tr.end

    def count(self):
        """Records in the log, from summary file sizes (no reads)."""
        k = self.store.keylen
        total = self.store.log.open.count
        for n in range(self.last):
            try:
                total += F.summary_count(os.path.getsize(os.path.join(self.store.path, F.SUMMARIES,
                                                                      F.summary_name(n))), k)
            except OSError:
                total += self.store.arena_size // (L.HEADER_SIZE + self.store.block_size) * 4
        return total


def _children(store, data):
    rs = store.ref_size
    null = store.null_ref
    return [r for r in (data[i:i + rs] for i in range(0, len(data), rs)) if r != null]


def _read_nodes(store, addrs):
    """{addr: data} of TREE records; damaged ones are left out."""
    return {a: v[2] for a, v in store.log.read_many(addrs, tolerant=True).items()}


class HashLive:
    """Live scores as a Bloom filter kept in a scratch file of the store."""

    def __init__(self, store, capacity):
        self.path = os.path.join(store.path, LIVE_FILE)
        if os.path.exists(self.path):
            os.unlink(self.path)
        self.bloom = pybloomfilter.BloomFilter(max(1024, capacity), LIVE_ERROR, self.path)

    def add(self, ref):
        self.bloom.add(ref)

    def __contains__(self, ref):
        return ref in self.bloom

    def close(self):
        self.bloom.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


def mark_hash(store, roots, progress=None):
    """Backward sweeps in compare-by-hash mode, until one expands nothing -> HashLive."""
    arenas = Arenas(store)
    live = HashLive(store, arenas.count())
    try:
        for r in roots:
            if r != store.null_ref:
                live.add(r)
        expanded = set()
        while _sweep(store, arenas, live, expanded, progress):
            progress = None  # the first sweep does nearly all the work: only it is reported
        return live
    except BaseException:
        live.close()
        raise


def _sweep(store, arenas, live, expanded, progress):
    """One sweep from the newest arena to the oldest: expand each live TREE
    key not expanded yet -> how many were."""
    count = 0
    for n in range(arenas.last, -1, -1):
        keys, addrs, types, _ = arenas.records(n)
        nodes = [i for i, t in enumerate(types) if t == F.TREE]
        # A parent and its children may share an arena: repeat until no
        # node of this arena becomes live (at most the depth of a tree).
        while nodes:
            todo = [i for i in nodes if keys[i * 32:(i + 1) * 32] not in expanded
                    and keys[i * 32:(i + 1) * 32] in live]
            if not todo:
                break
            got = _read_nodes(store, [addrs[i] for i in todo])
            for i in todo:
                key = keys[i * 32:(i + 1) * 32]
                expanded.add(key)
                # A record known damaged may still pass its tag (its content fails its score):
                # never expand it, only an intact copy.
                data = None if addrs[i] in store.bad else got.get(addrs[i])
                if data is None:
                    data = _other_copy(store, key, addrs[i])
                for c in _children(store, data):
                    live.add(c)
            count += len(todo)
            done = set(todo)
            nodes = [i for i in nodes if i not in done]
        if progress:
            progress(arenas.last - n + 1)
    return count


def _other_copy(store, key, a):
    """A live tree node whose record here is damaged: another intact copy
    (stored again by a later archive) serves, or gc must not go on."""
    try:
        return store.read(key)
    except Exception:
        n, off = F.split(a)
        raise DataCorrupt(f"arena {n} offset {off}: a tree node that kept snapshots need is damaged and no "
                          "other copy exists; gc stopped before changing anything. Run `foundation repair`") from None


LIVE, CATALOG = 1, 2  # flag bits: reached by a kept snapshot; part of the current catalog


class ValueLive:
    """Live records in compare-by-value mode: one byte of flags per record, by
    arena. The current catalog is marked apart: gc writes a new one, so its
    records are neither copied nor counted as garbage."""

    def __init__(self, arenas):
        self.addrs = {}
        self.flags = {}
        for n in range(arenas.last + 1):
            _, addrs, _, _ = arenas.records(n)
            self.addrs[n] = array("Q", addrs)
            self.flags[n] = bytearray(len(addrs))

    def position(self, a):
        n = a >> 32
        addrs = self.addrs.get(n)
        i = bisect.bisect_left(addrs, a) if addrs is not None else -1
        if addrs is None or i == len(addrs) or addrs[i] != a:
            raise DataCorrupt(f"arena {n} offset {a & 0xFFFFFFFF}: a kept snapshot points here, "
                              "but no record starts there; gc stopped before changing anything")
        return n, i

    def add(self, ref, bits=LIVE):
        n, i = self.position(int.from_bytes(ref, "big"))
        self.flags[n][i] |= bits

    def close(self):
        pass


def mark_value(store, roots, catalog_roots=(), progress=None):
    """One backward sweep in compare-by-value mode (every ref points backwards) -> ValueLive (exact)."""
    arenas = Arenas(store)
    live = ValueLive(arenas)
    for bits, refs in ((LIVE, roots), (CATALOG, catalog_roots)):
        for r in refs:
            if r != store.null_ref:
                live.add(r, bits)
    for n in range(arenas.last, -1, -1):
        _, addrs, types, _ = arenas.records(n)
        flags = live.flags[n]
        done = {}  # node -> flag bits already passed to its children
        while True:
            todo = [i for i, t in enumerate(types) if t == F.TREE and flags[i] & ~done.get(i, 0)]
            if not todo:
                break
            got = _read_nodes(store, [addrs[i] for i in todo])
            for i in todo:
                done[i] = flags[i]
                data = got.get(addrs[i])
                if data is None:
                    raise DataCorrupt(f"arena {n} offset {addrs[i] & 0xFFFFFFFF}: a tree node that kept snapshots "
                                      "need is damaged; gc stopped before changing anything. Run `foundation repair`")
                for c in _children(store, data):
                    live.add(c, flags[i])
        if progress:
            progress(arenas.last - n + 1)
    return live
