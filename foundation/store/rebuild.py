"""Rebuilding everything that is not primary, from the arenas alone.

Summaries, the index and the Bloom filter are caches of what the arenas
hold (Venti: they "can be rebuilt if lost or damaged"). Each is rebuilt
into a new file and renamed into place, so a crash during a rebuild leaves
the old structure (or none), and the next open simply rebuilds again.
"""

import json
import logging
import os

import pybloomfilter

from foundation import native
from foundation.store import format as F
from foundation.store import primary
from foundation.store import layout as L
from foundation.store.disk import atomic_write
from foundation.store.index import Index, plan

log = logging.getLogger(__name__)

CHUNK_ENTRIES = 4 << 20  # entries sorted and merged per pass while rebuilding


def scan_arena(store, n):
    """Every record of arena n: (entries, end, error, header bytes, file size)."""
    lg = store.log
    fd = lg.fd(n)
    size = os.fstat(fd).st_size
    buf = store.disk.pread(fd, "arena", 0, size)
    header, hb = lg.header(n, buf)
    tr = None
    if n < lg.open.n:
        try:
            tr = F.Trailer.from_tail(memoryview(buf)[max(0, size - F.MAX_TRAILER):], store.keys.mac, n)
        except ValueError as e:
            from foundation.errors import DataCorrupt
            raise DataCorrupt(f"arena {n} offset {size}: sealed arena has no valid trailer ({e})") from None
    limit = size - tr.size if tr else size
    mv = memoryview(buf)
    entries, end, err = lg.scan(n, header.iv, mv[F.ARENA_HEADER_SIZE:limit], F.ARENA_HEADER_SIZE)
    while err is not None and err.kind in ("tag", "decompress") and L.stored_at(buf, end, limit) >= 0 \
            and L.is_record(buf, end):
        # Step over a damaged record whose header still gives its length, as the open arena's
        # scan does: its block is not served anyway, and the rest of the arena still is.
        skip = end + L.HEADER_SIZE + L.stored(buf, end)
        if not end < skip <= limit:
            break
        log.error("arena %d offset %d: record is damaged (%s); left out of its summary", n, end, err.kind)
        lg.damaged.append((n, end))
        store.remember_damaged([(n, end)])
        more, end, err = lg.scan(n, header.iv, mv[skip:limit], skip)
        entries += more
    return entries, end, err, hb, size, buf, tr


def rebuild_summary(store, n, write=True):
    """(keys, addrs, types) of sealed arena n, by scanning it; writes the summary file."""
    entries, end, err, hb, size, buf, tr = scan_arena(store, n)
    if err is not None or end + tr.size != size:
        from foundation.errors import DataCorrupt
        raise DataCorrupt(f"arena {n} offset {end}: sealed arena does not scan to its trailer "
                          f"({err.kind if err else 'extra bytes'})")
    keys = b"".join(e[2] for e in entries)
    addrs = [F.addr(n, e[0]) for e in entries]
    types = bytes(e[1] for e in entries)
    if write:
        b = F.pack_summary(n, store.keylen, tr.amac, keys, addrs, types)
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


def rebuild_index(store, min_entries=0):
    """Write a new index holding every record of the log, then rename it into place."""
    path = os.path.join(store.path, F.INDEX)
    kl = store.keylen
    records = sum(len(a) for _, a in _all_entries(store))
    want = max(primary.capacity(store.conf["max_log_size"], store.block_size), 2 * records, min_entries)
    home, nfile = plan(want, kl)
    idx = Index.create(path, store.disk, kl, home, nfile, store.log.uuid, covered=0)
    chunk = bytearray()
    covered = store.log.end_addr

    def merge():
        native.sort_entries(chunk, kl + 8, kl)
        idx.flush(bytes(chunk), 0)
        chunk.clear()

    for keys, addrs in _all_entries(store):
        for i, a in enumerate(addrs):
            chunk += keys[i * kl:(i + 1) * kl]
            chunk += a.to_bytes(8, "little")
        if len(chunk) >= CHUNK_ENTRIES * (kl + 8):
            merge()
    merge()
    idx.flush(b"", covered)
    idx.install(path)
    if store.index is not None:
        store.index.close()
    store.index = idx
    log.debug("index rebuilt: %d entries in %d buckets", records, nfile)


def grow_index(store, entries, covered):
    """The index overflowed: rebuild it twice as large (it then covers the whole log)."""
    log.warning("the index is full; rebuilding it twice as large")
    rebuild_index(store, min_entries=2 * store.index.h.nbuckets * store.index.cap)


def rebuild_bloom(store):
    """A new Bloom filter over every key in the index (one sequential index pass)."""
    path = os.path.join(store.path, F.BLOOM)
    tmp = path + ".new"
    if os.path.exists(tmp):
        os.unlink(tmp)
    bf = pybloomfilter.BloomFilter(primary.bloom_capacity(store.conf), primary.BLOOM_ERROR, tmp)
    kl, es = store.keylen, store.keylen + 8
    ents = store.index.entries()
    bf.update(bytes(ents[i:i + kl]) for i in range(0, len(ents), es))
    bf.sync()
    os.replace(tmp, path)
    atomic_write(os.path.join(store.path, F.BLOOM_STATE), json.dumps({"covered": store.index.h.covered}).encode())
    if store.bloom is not None:
        store.bloom.close()
    store.bloom = bf


def rebuild(store, progress=None):
    """`foundation rebuild`: summaries, index, Bloom filter and counters from the arenas."""
    records = 0
    for n in range(store.log.open.n):
        _, addrs, _ = rebuild_summary(store, n, write=True)
        records += len(addrs)
        if progress:
            progress(n)
    records += store.log.open.count
    store.rebuild_derived()
    store.counters["records"] = records
    return records
