"""Rewriting one sealed arena without its garbage (compare-by-hash mode).

A block's name is its score, so a live record may move inside its arena
without any pointer changing. The arena keeps its number and its place in
the chain: the new file has a fresh IV (a position is never encrypted
twice under one keystream with different bytes), the surviving records in
their old order, and a compacted trailer that carries the chain of the
arena as first sealed, bound to the new arena MAC by a compaction MAC.
It is written beside the old file and renamed over it, so a crash leaves
one whole version or the other; the summary is removed first and written
after, and the index is marked dirty before the first swap, so neither can
name a record that moved.
"""

import os
from dataclasses import dataclass, field

from foundation import native
from foundation.store import format as F
from foundation.store import layout as L
from foundation.store import switch

@dataclass
class Plan:
    arena: int
    total: int          # bytes of records
    garbage: int        # bytes of records nothing kept reaches
    keep: list = field(default_factory=list)  # indexes (in summary order) of the records kept
    blocked: str = ""   # why the arena cannot be rewritten now
    healed: set = field(default_factory=set)  # damaged records another copy replaces

    @property
    def share(self):
        return self.garbage / self.total if self.total else 0.0


def record_sizes(addrs, end):
    offs = [a & 0xFFFFFFFF for a in addrs] + [end]
    return [offs[i + 1] - offs[i] for i in range(len(addrs))]


def plan_hash(store, arenas, live, n, healed=None):
    """What arena n keeps: live scores, minus damaged records that another copy has
    healed (found through the index while it is current, or given as `healed`)."""
    keys, addrs, types, end = arenas.records(n)
    sizes = record_sizes(addrs, end)
    p = Plan(n, sum(sizes), 0)
    for i, a in enumerate(addrs):
        key = keys[i * 32:(i + 1) * 32]
        if key not in live:
            p.garbage += sizes[i]
        elif a in store.bad:
            if a in healed if healed is not None else _healed(store, key):
                p.garbage += sizes[i]
                p.healed.add(a)
            else:
                p.keep.append(i)
                p.blocked = (f"offset {a & 0xFFFFFFFF} is damaged and still needed; "
                             "`foundation repair` can restore it")
        else:
            p.keep.append(i)
    return p


def _healed(store, key):
    try:
        store.read(key)
        return True
    except Exception:
        return False


def rewrite(store, n, keep_addrs, generation, chain, sealed):
    """Write arena n's kept records into arenas/NNNNNNNN.arena.gc -> (path, trailer, summary arrays)."""
    lg = store.log
    got = lg.read_many(keep_addrs)  # a live record that fails to read stops gc here, before any swap
    h = F.ArenaHeader(n, lg.uuid, os.urandom(16), store.arena_size)
    hb = h.pack(store.keys.mac)
    out = bytearray(hb)
    keys, addrs, types = bytearray(), [], bytearray()
    for btype, keyfield, data in groups([got[a] for a in keep_addrs]):
        # data blocks packed in runs again (§5.2): a run some of whose records died is cut to the
        # live ones, which may form runs of their own with their new neighbours
        recs, offs = native.pack(store.codec, n, h.iv, len(out), btype, data, len(data) * 32 // len(keyfield),
                                 keyfield, store.tuning.threads, run=store.log.run if btype == F.DATA else 1)
        out += recs
        for j, o in enumerate(offs):
            keys += keyfield[j * 32:j * 32 + store.keylen]
            addrs.append(F.addr(n, o))
            types.append(btype)
    tags = b"".join(L.tag(out, a & 0xFFFFFFFF) for a in addrs)
    end = len(out)
    amac = F.arena_mac(store.keys.mac, hb, tags, len(addrs), end)
    tr = F.Trailer(len(addrs), end, amac, chain, generation, sealed)
    out += tr.pack(store.keys.mac, n)
    if len(out) > store.arena_size:
        raise ValueError(f"arena {n} would grow past its capacity while being rewritten")
    path = switch.write_arena(store, n, out)
    return path, tr, (bytes(keys), addrs, bytes(types))


def groups(records):
    """Consecutive records of one type and raw length -> (btype, key fields, data) for one pack call."""
    i = 0
    while i < len(records):
        btype, _, data = records[i]
        j = i + 1
        while j < len(records) and records[j][0] == btype and len(records[j][2]) == len(data) and j - i < 1024:
            j += 1
        keyfield = b"".join(key32(r[1]) for r in records[i:j])
        yield btype, keyfield, b"".join(r[2] for r in records[i:j])
        i = j


def key32(k):
    return bytes(k[:32]).ljust(32, b"\0")


def swap(store, n, path, tr, arrays):
    """Put the rewritten arena n in place of the old one, with its summary."""
    keys, addrs, types = arrays
    switch.swap(store, n, path, F.pack_summary(n, store.keylen, tr.amac, keys, addrs, types))
