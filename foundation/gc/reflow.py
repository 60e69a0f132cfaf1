"""Rewriting the log from one arena on (compare-by-value mode).

In compare-by-value mode a block's name is its address, so a block that
moves changes name, and every node that points at it must change too —
and that node moves, and so on up to the catalog. Since every pointer
points backwards, one forward pass from the first arena with enough
garbage to the end of the log does it all: each live record is appended
to a new log, a tree node's refs are translated through the relocation
map of the records before it (always complete, as they lie behind it),
and a new catalog with translated roots is written last.

The new arenas are written beside the old ones (`NNNNNNNN.arena.gc`),
and the switch is one journal, `gc.json`, holding the new head: the store
owns it (foundation.store.switch), and rolls it forward at the next
writable open if gc is killed after writing it.
"""

import json
import os
from array import array

from foundation import native
from foundation.gc.compact import groups, key32
from foundation.gc.mark import LIVE
from foundation.store import format as F
from foundation.store import layout as L
from foundation.store import switch


class Relog:
    """A log being written from arena `first` on, into temporary files."""

    def __init__(self, store, first, chain, generations):
        self.s = store
        self.chain = chain
        self.gens = generations  # arena -> generation of the file it replaces
        self.files = []
        self.block_size = store.block_size
        self.ref_size = store.ref_size
        self.null_ref = store.null_ref
        self._start(first)

    def _start(self, n):
        self.n = n
        h = F.ArenaHeader(n, self.s.log.uuid, os.urandom(16), self.s.arena_size)
        self.iv = h.iv
        self.hb = h.pack(self.s.keys.mac)
        self.out = bytearray(self.hb)
        self.tags = bytearray()
        self.count = 0

    def append(self, btype, keyfields, data):
        """Append records (32-byte key fields, equal-size blocks) -> their new addresses."""
        k = len(keyfields) // 32
        bs = len(data) // k
        addrs = []
        i = 0
        while i < k:
            room = self.s.arena_size - F.MAX_TRAILER - len(self.out)
            m = k - i
            recs, offs = native.pack(self.s.codec, self.n, self.iv, len(self.out), btype,
                                     data[i * bs:(i + m) * bs], bs, keyfields[i * 32:(i + m) * 32],
                                     run=self.s.log.run if btype == F.DATA else 1)
            ends = offs[1:] + [len(self.out) + len(recs)]
            # a run is written whole or not at all (§5.2)
            fit = L.whole_runs(recs, len(self.out), offs, sum(1 for e in ends if e - len(self.out) <= room))
            if fit == 0:
                if self.count == 0:
                    raise ValueError("a record does not fit in an empty arena")
                self.seal()
                continue
            used = ends[fit - 1] - len(self.out)
            self.out += recs[:used]
            for o in offs[:fit]:
                self.tags += L.tag(self.out, o)
                addrs.append(F.addr(self.n, o))
            self.count += fit
            i += fit
        return addrs

    def seal(self):
        end = len(self.out)
        amac = F.arena_mac(self.s.keys.mac, self.hb, bytes(self.tags), self.count, end)
        self.chain = F.chain_mac(self.s.keys.mac, self.chain, self.n, amac)
        tr = F.Trailer(self.count, end, amac, self.chain, self.gens.get(self.n, 0) + 1, amac)
        self.out += tr.pack(self.s.keys.mac, self.n)
        self._flush()
        self._start(self.n + 1)

    def _flush(self):
        switch.write_arena(self.s, self.n, self.out)
        self.files.append(self.n)

    def finish(self, generation):
        """Write the last, open arena, ended by the commit record of `generation` -> the new head.
        The switch writes that head to both copies; the commit record is what still gives it if
        both are lost (docs/format.md §6.1: every commit ends in one)."""
        if self.s.arena_size - F.MAX_TRAILER - len(self.out) < L.HEADER_SIZE + F.COMMIT_SIZE + 16:
            self.seal()   # the record must lie in the arena it names, with the chain it names
        payload = F.pack_commit(generation, self.n, self.chain)
        if self.s.keylen == 32:  # named as the log names its own commit records (Log._append_commit)
            key = native.scores(payload, len(payload), F.COMMIT, key=self.s.keys.score)
        else:
            key = native.weak_hashes(payload, len(payload), F.COMMIT, self.s.keys.weak_seed)
        self.append(F.COMMIT, key32(key), payload)
        self._flush()
        return F.Head(self.n, len(self.out), self.count, self.chain, generation)

    # ---- the store interface the catalog writes through ----------------------

    def write_blocks(self, buf, btype=F.DATA):
        bs = self.block_size
        return self._write(bytes(buf), bs, btype)

    def write(self, data, btype=F.DATA):
        return self._write(bytes(data), len(data), btype)

    def _write(self, buf, bs, btype):
        n = len(buf) // bs
        zero = native.zero_flags(buf, bs) if btype == F.DATA and bs == self.block_size else bytes(n)
        weak = native.weak_hashes(buf, bs, btype, self.s.keys.weak_seed)
        refs = [self.null_ref] * n
        fresh = [i for i in range(n) if not zero[i]]
        if fresh:
            keys = b"".join(key32(weak[i * 8:(i + 1) * 8]) for i in fresh)
            addrs = self.append(btype, keys, b"".join(buf[i * bs:(i + 1) * bs] for i in fresh))
            for i, a in zip(fresh, addrs):
                refs[i] = a.to_bytes(8, "big")
        return b"".join(refs)

    def sync(self):
        pass


class Relocation:
    """Old address -> new address for the records of the rewritten arenas."""

    def __init__(self, first, live):
        self.first = first
        self.live = live
        self.new = {}  # old arena -> array of new addresses by record position (0: dropped)

    def ref(self, ref):
        a = int.from_bytes(ref, "big")
        if a == 0 or a >> 32 < self.first:
            return ref
        n, i = self.live.position(a)
        b = self.new[n][i]
        if not b:
            raise ValueError(f"arena {n} offset {a & 0xFFFFFFFF}: a live node points at a record gc dropped")
        return b.to_bytes(8, "big")

    def node(self, data):
        return b"".join(self.ref(data[i:i + 8]) for i in range(0, len(data), 8))


def relog(store, arenas, first):
    """A new log that replaces arenas first..last: it goes on from the chain of the arena before,
    and each arena it writes has the generation after the one it replaces."""
    lg = store.log
    chain = lg.trailer(first - 1).chain if first else F.ZERO_CHAIN
    gens = {n: lg.trailer(n).generation for n in range(first, arenas.last)}
    return Relog(store, first, chain, gens)


def reflow(store, arenas, live, first, progress=None):
    """Copy the live records of arenas first..last into a new log -> (Relog, Relocation)."""
    lg = store.log
    out = relog(store, arenas, first)
    rel = Relocation(first, live)
    for n in range(first, arenas.last + 1):
        keys, addrs, types, _ = arenas.records(n)
        flags = live.flags[n]
        keep = [i for i in range(len(addrs)) if flags[i] & LIVE]
        got = lg.read_many([addrs[i] for i in keep])  # a damaged live record stops gc before the switch
        new = rel.new[n] = array("Q", bytes(8 * len(addrs)))
        run = []  # positions of consecutive plain records, appended in one go

        def flush():
            recs = [got[addrs[i]] for i in run]
            pos = iter(run)
            for btype, keyfield, data in groups(recs):
                for a in out.append(btype, keyfield, data):
                    new[next(pos)] = a
            run.clear()

        for i in keep:
            if types[i] != F.TREE:
                run.append(i)
                continue
            # A node's children lie behind it, maybe just before it: append them first.
            flush()
            data = rel.node(got[addrs[i]][2])
            weak = native.weak_hashes(data, len(data), F.TREE, store.keys.weak_seed)
            new[i] = out.append(F.TREE, key32(weak), data)[0]
        flush()
        if progress:
            progress(n - first + 1)
    return out, rel


def roots_map(obj, fn):
    """A copy of a JSON value with fn applied to the ref of every tree root in it."""
    if isinstance(obj, dict):
        if set(obj) == {"ref", "size", "depth"} and isinstance(obj["ref"], str):
            return {**obj, "ref": fn(bytes.fromhex(obj["ref"])).hex()}
        return {k: roots_map(v, fn) for k, v in obj.items()}
    if isinstance(obj, list):
        return [roots_map(v, fn) for v in obj]
    return obj


def translated_catalog(text, rel):
    """The catalog blob with every root's ref relocated (lines and header kept as they are)."""
    lines = text.decode("utf-8").splitlines(keepends=True)
    out = [lines[0]]
    for line in lines[1:]:
        obj = roots_map(json.loads(line), rel.ref)
        out.append(json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False) + "\n")
    return "".join(out).encode("utf-8")

