"""A host that has no record of a store takes its first one from the replicas: they kept the newest commit too.

The host's record of the newest commit it saw (foundation.store.rollback)
guards writers only once it exists: on a new or reinstalled host, or after
the state directory was lost, a store put back older would be written on.
Every replica's manifest carries the head it committed to (MACed with the
store's key), so before a writer's first open on this host the replicas
are asked, with three small reads each (the manifest, the last record
of the open arena's last segment, the commit record that ends every
sync, and that arena's header, whose iv the record's tag is made under),
and the newest commit they hold becomes the host's record; the open that
follows then refuses an older store as usual (exit 26).

Only a replica whose commit number (the head's generation, which never
goes down in one store) is at least the store's own is taken: a replica
left behind, even one behind a compare-by-value gc that rewrote the log
shorter, says nothing about a rollback. A replica that cannot be read is
passed over with a warning: the archive goes on, guarded from then on by
the record its own open leaves. docs/format.md §6.2.
"""

import logging

from foundation.errors import Error
from foundation.replica.registry import open_backend
from foundation.replica.sync import read_remote
from foundation.store import format as F
from foundation.store import layout as L

log = logging.getLogger(__name__)

COMMIT_RECORD = L.HEADER_SIZE + F.COMMIT_SIZE   # 112 bytes: header and raw payload
ATTEMPTS = 2     # a quick look, not a nightly replicate's patience


def replica_commit(local, backend):
    """(Head, (offset, tag) of its last record or (0, b"")) of the newest commit the replica holds,
    None if it holds none; (None, why) for a manifest that fails its checks."""
    _, m, why = read_remote(local, backend)
    if m is None:
        return (None, why) if why else None
    return m.head, last_commit_record(local, backend, m)


def last_commit_record(local, backend, m):
    """(offset, tag) of the commit record that ends the manifest's open arena, read from its last
    segment and checked by its tag (under the iv of the arena's header, read from its first
    segment), or (0, b"") when the segment does not end in one (a store from before commit
    records)."""
    if not m.open.parts:
        return 0, b""
    parts = m.open.objects()
    name, start, end, _ = parts[-1]
    if end - start < COMMIT_RECORD or parts[0][1] != 0:
        return 0, b""
    off = end - COMMIT_RECORD
    b = backend.get(name, off - start, COMMIT_RECORD)
    if (len(b) != COMMIT_RECORD or not L.is_record(b, 0) or L.btype(b, 0) != F.COMMIT
            or L.stored(b, 0) != F.COMMIT_SIZE):
        return 0, b""
    try:
        h = F.ArenaHeader.unpack(bytes(backend.get(parts[0][0], 0, F.ARENA_HEADER_SIZE)), local.keys.mac)
    except ValueError:
        return 0, b""
    if h.arena != m.head.arena:
        return 0, b""
    entries, _, err = local.log.scan(h.arena, h.iv, b, off)
    return (off, L.tag(b, 0)) if err is None and len(entries) == 1 else (0, b"")


def seed(watch, local, specs, opener=open_backend):
    """Record in watch (rollback.Watch), for store `local` (a Primary) that it has no record of,
    the newest commit its replicas (ReplicaSpecs) hold that is not behind the store's own commit
    number. Returns the name of the replica it came from, or None (nothing recorded)."""
    try:
        own = local.read_head()[1].generation
    except Error:
        return None   # the open that follows says what is wrong with the store
    best = None
    for spec in specs:
        name = spec.name or spec.url
        try:
            with opener(spec, attempts=ATTEMPTS) as backend:
                got = replica_commit(local, backend)
        except (Error, OSError) as e:
            got = None, e
        if got is not None and got[0] is None:
            log.warning("replica %s was not read for this store's newest commit, going on without it "
                        "(a store put back older is caught only if another replica holds the newer "
                        "commit): %s", name, got[1])
            continue
        if got is None or got[0].generation < own:
            continue
        key = (got[0].generation, got[0].arena, got[0].end)
        if best is None or key > best[0]:
            best = key, got, name
    if best is None:
        return None
    _, (head, last), name = best
    watch.record(local.uuid, head, last, source=f"replica {name}")
    return name
