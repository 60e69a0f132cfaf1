"""Rebuilding everything that is not primary, from the arenas alone.

Summaries, the index and the Bloom filter are caches of what the arenas
hold (Venti: they "can be rebuilt if lost or damaged"). Each is rebuilt
into a new file and renamed into place, so a crash during a rebuild leaves
the old structure (or none), and the next open simply rebuilds again.
"""

import array
import logging
import os
import sys

from foundation.errors import DataCorrupt
from foundation.store import bloom
from foundation.store import format as F
from foundation.store.disk import atomic_write
from foundation.store.index import CHUNK, INITIAL, Index, IndexFull, plan

log = logging.getLogger(__name__)


def scan_arena(store, n):
    """Every record of arena n that verifies -> (entries, lost ranges, trailer or None).

    A damaged record, a zeroed page or a cut header costs the bytes it
    covers: the scan steps over them to the next record (Log.salvage), and
    the lost ranges go into damaged.json. A sealed arena whose trailer is
    gone is scanned to its file's end.
    """
    lg = store.log
    fd = lg.fd(n)
    size = os.fstat(fd).st_size
    buf = store.disk.pread(fd, "arena", 0, size)
    header, _ = lg.header(n, buf)
    tr = None
    if n < lg.open.n:
        try:
            tr = F.Trailer.from_tail(memoryview(buf)[max(0, size - F.MAX_TRAILER):], store.keys.mac, n)
        except ValueError as e:
            log.error("arena %d offset %d: sealed arena has no valid trailer (%s); scanning to its end", n, size, e)
    limit = size - tr.size if tr else size
    entries, lost = lg.salvage(n, header.iv, buf, F.ARENA_HEADER_SIZE, limit)
    if n < lg.open.n and tr is None:
        lost.append((size, 1 << 32))  # a sealed arena cut short or put back older: what followed is gone
    lost = [(a, b) for a, b in lost if (n, a, b) not in lg.lost]  # each loss is told once a session
    for a, b in lost:
        log.error("arena %d offset %d: %d bytes are damaged; left out of its summary", n, a, b - a)
    if lost:
        lg.damaged += [(n, a) for a, _ in lost]
        lg.lost += [(n, a, b) for a, b in lost]
        store.remember_damaged([(n, a) for a, _ in lost])
    return entries, lost, tr


def rebuild_summary(store, n, write=True):
    """(keys, addrs, types) of sealed arena n, by scanning it; writes the summary file. A missing
    arena, or one whose header is gone, holds nothing that can be read: no records."""
    if n in store.log.missing:
        return b"", [], b""
    try:
        entries, _, tr = scan_arena(store, n)
    except DataCorrupt as e:
        log.error("%s; none of its records can be read", e)
        if (n, 0) not in store.log.damaged:
            store.log.damaged.append((n, 0))
            store.log.lost.append((n, 0, store.arena_size))
        return b"", [], b""
    offs, btypes, ks = list(zip(*entries))[:3] if entries else ((), (), ())
    keys, types, base = b"".join(ks), bytes(btypes), F.addr(n, 0)
    addrs = [base + o for o in offs]
    store.scanned.add(n)
    if write:
        b = F.pack_summary(n, store.keylen, tr.amac if tr else F.ZERO_CHAIN, keys, addrs, types)
        atomic_write(os.path.join(store.path, F.SUMMARIES, F.summary_name(n)), b, sync=False)
        store.disk.count_write("summary", "sum%d" % n, 0, len(b))
    return keys, addrs, types


def _all_entries(store):
    """Yield (keys, addrs) per arena, oldest first, including the open arena."""
    for n in range(store.log.open.n):
        keys, addrs, _ = store._summary_arrays(n)
        yield keys, addrs
    oa = store.log.open
    yield bytes(oa.keys), list(oa.addrs)


def estimate_records(store):
    """Records in the log, from the summaries' sizes (an arena without one: a guess from its size),
    without reading them: what a rebuilt index is sized for."""
    per = store.keylen + 9
    total = store.log.open.count
    for n in range(store.log.open.n):
        try:
            total += (os.path.getsize(os.path.join(store.path, F.SUMMARIES, F.summary_name(n))) - 96) // per
        except OSError:
            try:
                total += os.path.getsize(os.path.join(store.path, F.ARENAS, F.arena_name(n))) // 1024
            except OSError:
                pass  # a lost arena: no records
    return total


def rebuild_index(store, min_entries=0):
    """Write a new index holding every record of the log, sized for twice the records, then
    rename it into place. Entries go in sorted chunks of CHUNK, one merge pass each."""
    path = os.path.join(store.path, F.INDEX)
    kl = store.keylen
    want = max(INITIAL, 2 * estimate_records(store), min_entries)
    while True:
        home, nfile = plan(want, kl)
        idx = Index.create(path, store.disk, kl, home, nfile, store.log.uuid, covered=0)
        try:
            _fill(store, idx)
            break
        except IndexFull:  # far more records than the summaries' sizes said
            idx.close()
            want *= 2
    idx.flush(b"", store.log.end_addr)
    idx.install(path)
    if store.index is not None:
        store.index.close()
    store.index = idx
    log.debug("index rebuilt: %d entries in %d buckets", idx.h.entries, nfile)


def _fill(store, idx):
    kl = store.keylen
    chunk = bytearray()
    for keys, addrs in _all_entries(store):
        ab = array.array("Q", addrs)
        if sys.byteorder != "little":
            ab.byteswap()
        ab = ab.tobytes()
        chunk += _entries(keys[:len(addrs) * kl], kl, ab)
        if len(chunk) >= CHUNK * (kl + 8):
            idx.merge_sorted(chunk)
            chunk = bytearray()
    idx.merge_sorted(chunk)


def _entries(keys, kl, ab):
    """Index entries (key, u64le address) from keys and the addresses' bytes: a strided copy per
    byte of an entry, not a Python step per record."""
    w = kl + 8
    out = bytearray(len(ab) // 8 * w)
    for b in range(kl):
        out[b::w] = keys[b::kl]
    for b in range(8):
        out[kl + b::w] = ab[b::8]
    return out


def grow_index(store, entries, covered):
    """The index overflowed its last bucket: rebuild it twice as large (it then covers the whole log)."""
    log.warning("the index is full; rebuilding it twice as large")
    rebuild_index(store, min_entries=2 * store.index.slots())


def rebuild_bloom(store):
    """A new Bloom filter over every key in the index (one sequential index pass), sized for them."""
    bf = bloom.build(store)
    if store.bloom is not None:
        store.bloom.close()
    store.adopt_bloom(bf)


def rebuild(store, progress=None):
    """`foundation rebuild`: summaries, index, Bloom filter and counters from the arenas."""
    records = 0
    for n in range(store.log.open.n):
        if n in store.scanned and store.writable:   # this very open scanned it (its summary was missing)
            _, _, types = store.summary_records(n)
        else:
            _, _, types = rebuild_summary(store, n, write=True)
        records += len(types) - types.count(F.COMMIT)  # a commit record holds no block
        if progress:
            progress(n)
    records += store.log.open.count - store.log.open.types.count(F.COMMIT)
    if not (any(r.startswith("rebuilt the index") for r in store.repaired) and "rebuilt the Bloom filter" in store.repaired):
        store.rebuild_derived()  # (else this very open rebuilt both from the summaries just scanned)
    store.counters["records"] = records
    return records
