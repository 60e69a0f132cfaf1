"""Checking every byte of the log, and counting what the store holds.

verify reads each arena once, sequentially: every record's tag, its
decryption and decompression, and in compare-by-hash mode its score
recomputed from the data (the end-to-end check of paper §3.4); then each
sealed arena's MAC and the chain of arena MACs up to the head, which is
what catches a dropped, reordered, truncated or rolled-back arena. It
reports every damaged place by arena and offset and never stops early.
"""

import enum
import json
import os
from dataclasses import dataclass

from foundation import native
from foundation.store import format as F
from foundation.store import layout as L


class Kind(enum.Enum):
    """What a damaged place means for the arena around it (Venti's ECorrupt, native.RecordError.kind):
    repair, audit and replicate decide on this, never on the message."""

    RECORD = "record"          # one record fails (tag, decoding, score); the rest of the arena is fine
    UNPARSABLE = "unparsable"  # a record whose length is lost: nothing after it can be parsed
    SKIPPED = "skipped"        # bytes that hold no record that verifies; the scan found the next one after them
    SHORT = "short"            # the open arena ends before the head's committed end
    HEADER = "header"          # the arena header fails, or names another arena or log
    TRAILER = "trailer"        # a sealed arena's trailer is missing or fails its checks
    ARENA_MAC = "arena-mac"    # every record verifies, but the arena MAC does not cover them
    CHAIN = "chain"            # the arena's chain MAC does not follow the arena before it
    TAIL = "tail"              # bytes past the head's end: an unfinished write (kill -9, full disk), not damage
    PARAMETER = "parameter"    # foundation.json disagrees with the arenas (an edited block or arena size)
    HEAD_CHAIN = "head-chain"  # the sealed arenas' chain does not reach the head
    MISSING = "missing"        # the arena file is absent
    EXTRA = "extra"            # an arena file past the head's end
    HEAD_COPY = "head-copy"    # one copy of the head is missing or damaged; the log or the other copy holds it
    HEAD_BEHIND = "head-behind"  # a note, not damage: the head copies name an older commit than the log holds


_PROBLEMS = {"tag": "record is damaged (tag)", "decompress": "record does not decode (decompress)",
             "score": "block content does not match its score"}

SPANS = (Kind.SKIPPED, Kind.UNPARSABLE, Kind.SHORT, Kind.HEADER, Kind.MISSING)  # damage that costs a byte range


@dataclass
class Damage:
    arena: int
    offset: int
    kind: Kind
    what: str
    end: int | None = None  # where the damaged bytes end, when known (None: the damage reaches the arena's end)

    @property
    def record(self):
        """One record is damaged (the rest of the arena may be fine)."""
        return self.kind is Kind.RECORD

    def cuts(self):
        """Is everything from this offset on unusable (the record's length, or the bytes, are gone)?"""
        return self.kind in (Kind.UNPARSABLE, Kind.SHORT, Kind.MISSING, Kind.TRAILER)

    def __str__(self):
        if self.kind in (Kind.HEAD_COPY, Kind.HEAD_BEHIND):
            return self.what
        return f"arena {self.arena} offset {self.offset}: {self.what}"


def verify(store, progress=None, notes=None, known=None):
    """-> (list of Damage, number of records checked). What is not damage but worth saying (an
    uncommitted tail, Kind.TAIL) goes into the list `notes`, if given. `known`: {n: what
    verify_arena returned} for sealed arenas whose very bytes the caller has just checked (recover,
    as each arena came down): taken as they are, not read and checked again."""
    lg = store.log
    damage = head_copies(lg)
    checked = 0
    chain = F.ZERO_CHAIN
    last = lg.open.n
    names = sorted(os.listdir(lg.dir))
    # While a gc switch is pending (lg.moved) the old arenas past the new log are the switch's to delete.
    extra = [x for x in names if x.endswith(".arena") and int(x.split(".")[0]) > last and not lg.moved]
    for x in extra:
        damage.append(Damage(int(x.split(".")[0]), 0, Kind.EXTRA, "arena file beyond the end of the log (not referenced by the head)"))
    for n in range(last + 1):
        if not os.path.exists(lg.path(n)):
            damage.append(Damage(n, 0, Kind.MISSING, "arena file is missing"))
            chain = None
            continue
        if known and n in known and n < last:
            found, count, _tr, chain = known[n]
        else:
            fd = lg.fd(n)
            size = os.fstat(fd).st_size
            if n == lg.torn:
                size = lg.open.end   # a torn tail, known to the writer: the arena is sealed there at its next write
            buf = memoryview(store.disk.pread(fd, "arena", 0, size))
            found, count, _tr, chain = verify_arena(store, n, buf, n < last, chain)
        damage += found
        checked += count
        if progress:
            progress(n)
    tail = lg.file_size(last) - lg.open.end if os.path.exists(lg.path(last)) else 0
    if tail > 0 and notes is not None:
        notes.append(Damage(last, lg.open.end, Kind.TAIL, f"{tail} bytes past the head's end: an unfinished write "
                             "(a crash or a full disk), not damage; the next archive cuts it"))
    behind = head_behind(lg)
    if behind and notes is not None:
        notes.append(behind)
    if chain is not None and chain != lg.head.chain:
        damage.append(Damage(last, 0, Kind.HEAD_CHAIN, "the head's chain MAC does not match the sealed arenas (log rolled back or truncated)"))
    _record(store, [d for d in damage if d.record])
    # What readers must no longer trust, for naming the days it costs (foundation.image.lost).
    lg.lost += [(d.arena, d.offset, d.end or 1 << 32) for d in damage if d.kind in SPANS]
    return damage, checked


def head_copies(lg):
    """Damage for each head copy the log's open found missing or damaged (a store from before head
    copies, with `head` alone, lacks nothing)."""
    best = max((s.head.generation for s in lg.slots if s.head), default=None)
    return [Damage(lg.head.arena, 0, Kind.HEAD_COPY,
                   f"head copy {s.name} is {s.problem}; the commit is read from "
                   f"{'the other copy' if best is not None else 'the log'}, and the next writable open "
                   "(e.g. `foundation rebuild`) rewrites it")
            for s in lg.slots if s.head is None and not (s.problem == "missing" and best == 0)]


def head_behind(lg):
    """A note if the newest valid head copy names an older commit than the log carries it to (a crash
    between a sync's log and its head write, or an older copy put back): nothing is lost."""
    best = max((s.head for s in lg.slots if s.head), key=lambda h: (h.generation, h.arena, h.end), default=None)
    cur = lg.head
    if best is None or lg.moved or (best.generation, best.arena, best.end) == (cur.generation, cur.arena, cur.end):
        return None   # (a pending gc switch is read under its journal's head: not the log's doing)
    return Damage(cur.arena, cur.end, Kind.HEAD_BEHIND,
                  f"the head copies name commit {best.generation} (arena {best.arena} offset {best.end}); the log "
                  f"holds commits up to {cur.generation} (arena {cur.arena} offset {cur.end}), which are read: "
                  "nothing is lost, and the next writable open rewrites the head copies")


def verify_arena(store, n, buf, sealed, chain, committed=None, full=True):
    """Check the bytes of arena n (a whole file) -> (damage, records checked, trailer, chain).

    `store` needs only .log (its header and scan), .codec, .keys and .mode,
    so a file that is not in the store (a replica's copy) is checked the
    same way. `chain` is the chain of arena n - 1, or None to skip the chain
    check; the chain returned is this arena's (None if unknown). An open
    arena (not `sealed`) must hold records up to `committed` (default: the
    store's head). Not `full`: records are checked by their tags alone, which
    with the arena MAC and the chain still prove every byte is the one
    written, but not that what was written decodes to its score.
    """
    lg = store.log
    damage = []
    checked = 0
    size = len(buf)
    try:
        header, hb = lg.header(n, buf)
    except Exception as e:  # DataCorrupt naming the header
        return [Damage(n, 0, Kind.HEADER, str(e).split(": ", 2)[-1])], 0, None, None
    if header.size != lg.arena_size:
        damage.append(Damage(n, 0, Kind.PARAMETER, f"the arena was made {header.size} bytes long, but {F.CONFIG} "
                             f"says arena_size {lg.arena_size}: the config was edited; put the value back"))
    odd = []  # records no block of this store's block size can be (the config's block_size was edited)
    depth = native.TAGS if not full else native.SCORED if store.mode == "hash" else native.DECODED
    tags = bytearray()
    count, off, ok = 0, F.ARENA_HEADER_SIZE, True
    tr = None
    if sealed:
        try:
            tr = F.Trailer.from_tail(buf[max(0, size - F.MAX_TRAILER):], store.keys.mac, n)
        except ValueError as e:
            damage.append(Damage(n, max(0, size - F.TRAILER_SIZE), Kind.TRAILER, f"sealed arena {e} (truncated arena?)"))
    limit = size - tr.size if tr else size
    if not sealed:
        if committed is None:  # a writer keeps verified records past the head (Log._scan_open)
            committed = lg.open.end if lg.open is not None and lg.open.n == n else lg.head.end
        limit = min(size, committed)  # past the commit point lies an unfinished write, not damage
    while off < limit:
        # Every record's tag, decoding and score, in the C core on lg.threads cores.
        # (the span from the arena's start: a run slice past damage still finds its run's members)
        got, end, err = native.check_span(store.codec, n, header.iv, buf[:limit], 0, depth,
                                          store.keys.score, lg.threads, start=off)
        for i, problem in sorted(got.problems.items()):
            damage.append(Damage(n, got.offs[i], Kind.RECORD, _PROBLEMS[problem]))
            ok = False
        # A record whose tag fails is not one of the arena's (its length still led to the next).
        mine = [i for i in range(len(got.offs)) if got.problems.get(i) != "tag"] if got.problems else None
        if mine is None:
            tags += got.tags
            count += len(got.offs)
            checked += len(got.offs) - got.btypes.count(F.COMMIT)  # a commit record holds no block
        else:
            tags += b"".join(got.tags[i * L.TAG_SIZE:(i + 1) * L.TAG_SIZE] for i in mine)
            count += len(mine)
            checked += sum(got.btypes[i] != F.COMMIT for i in mine)
        if max(got.raws, default=0) > lg.block_size or F.TREE in got.btypes:
            odd += [(got.offs[i], got.raws[i]) for i in (range(len(got.offs)) if mine is None else mine)
                    if got.raws[i] > lg.block_size or (got.btypes[i] == F.TREE and got.raws[i] != lg.block_size)]
        off = end
        if off >= limit:
            break
        if not sealed and off >= (lg.head.end if committed is None else committed):
            break  # past the commit: an unfinished write, which the next writer cuts
        ok = False
        kind = err.kind if err else "zeroed"  # zeros where committed records should be (a zeroed page)
        stored = L.stored_at(buf, off, limit)
        if kind in ("tag", "decompress", "length") and L.is_record(buf, off) \
                and 0 <= stored and off + L.HEADER_SIZE + stored <= limit:
            damage.append(Damage(n, off, Kind.RECORD, f"record is damaged ({kind})"))
            off += L.HEADER_SIZE + stored
            continue
        # Find the next record by its header (Log.salvage): the damage costs only these bytes.
        nxt = _next_record(lg, n, header.iv, buf, off, limit)
        if nxt >= limit:
            damage.append(Damage(n, off, Kind.UNPARSABLE, f"record is damaged ({kind}); the rest of the arena ({limit - off} bytes) cannot be parsed"))
            break
        damage.append(Damage(n, off, Kind.SKIPPED, f"bytes {off}-{nxt} hold no record that verifies ({kind}); "
                                                   f"the next record is at offset {nxt}", nxt))
        off = nxt
    if odd:
        damage.append(Damage(n, odd[0][0], Kind.PARAMETER,
                             f"{len(odd)} records hold blocks of {odd[0][1]} bytes, which a store of block_size "
                             f"{lg.block_size} never writes: {F.CONFIG} was edited; put the block size back"))
    if tr:
        if ok:
            amac = F.arena_mac(store.keys.mac, hb, bytes(tags), count, tr.end)
            if tr.count != count or tr.end != off or tr.amac != amac:
                damage.append(Damage(n, tr.end, Kind.ARENA_MAC, "arena MAC does not match its records (records dropped or replaced)"))
        if chain is not None and tr.chain != F.chain_mac(store.keys.mac, chain, n, tr.sealed):
            damage.append(Damage(n, size - tr.size, Kind.CHAIN,
                                 "arena chain MAC mismatch: an arena before it was dropped, reordered or rolled back"))
        return damage, checked, tr, tr.chain
    if not sealed:
        if off < committed:
            damage.append(Damage(n, off, Kind.SHORT, f"open arena ends before the committed end {committed}"))
        return damage, checked, None, chain
    return damage, checked, None, None


def _next_record(lg, n, iv, buf, off, limit):
    """Offset of the first record after off that verifies, or limit."""
    _, lost = lg.salvage(n, iv, buf, off, limit, first=True)
    return lost[0][1] if lost else limit


def _record(store, damage):
    """Write damaged.json: the store then stops deduplicating against them."""
    from foundation.store.disk import atomic_write
    recs = sorted({(d.arena, d.offset) for d in damage})
    path = os.path.join(store.path, F.DAMAGED)
    if not recs and not os.path.exists(path):
        return
    try:
        atomic_write(path, json.dumps({"records": recs}).encode())
    except OSError:
        pass  # a read-only disk: verify's report is what matters
    store.bad |= {F.addr(n, o) for n, o in recs}


def _size(path):
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _disk_usage(path):
    try:
        return os.stat(path).st_blocks * 512
    except OSError:
        return 0


def stats(store):
    """Sizes, counts, dedup and compression ratios."""
    p = store.path
    sumdir = os.path.join(p, F.SUMMARIES)
    c = store.counters
    log_bytes = store.log_bytes()
    offered = c["offered_bytes"]
    nonzero = max(offered - c["zero_blocks"] * store.block_size, 0)
    return {
        "store": p,
        "uuid": store.uuid,
        "mode": store.mode,
        "encrypted": store.conf["encrypted"],
        "block_size": store.block_size,
        "arena_size": store.arena_size,
        "arenas": store.log.open.n + 1,
        "sealed_arenas": store.log.open.n,
        "records": c["records"],
        "log_bytes": log_bytes,
        "raw_bytes": c["raw_bytes"],
        "index_bytes": _disk_usage(os.path.join(p, F.INDEX)),
        "index_file_bytes": _size(os.path.join(p, F.INDEX)),
        "index_entries": store.index.h.entries + len(store.wbuf),
        "index_load": (store.index.h.entries / (store.index.h.nbuckets * store.index.cap)),
        "summary_bytes": sum(_size(os.path.join(sumdir, x)) for x in os.listdir(sumdir)),
        "bloom_bytes": _size(os.path.join(p, F.BLOOM)),
        "offered_bytes": offered,
        "zero_blocks": c["zero_blocks"],
        "dup_blocks": c["dup_blocks"],
        "dedup_ratio": (nonzero / c["raw_bytes"]) if c["raw_bytes"] else None,
        "compression_ratio": (c["raw_bytes"] / log_bytes) if log_bytes and c["raw_bytes"] else None,
    }
