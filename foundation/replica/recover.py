"""Rebuilding a whole store from a replica and the key alone.

Only primary data comes down — the config, every arena, the open arena's
segments and the head the manifest carries — and each arena is checked
(record tags, decoding, scores, arena MAC, chain) against the manifest
before it takes its final name. Nothing is written until the key has been
checked against the replica's config; `recovering.json` then marks the
directory as a partial recovery that the same command resumes, and the
config goes last, so a directory without it is never taken for a store
(docs/format.md §3). A writable open finally rebuilds summaries, index
and Bloom filter, and `verify` checks what was not checked on the way
down (the open arena, the chain up to the head): every record is
checked once. Arenas come down several at a time where the backend
allows it (S3), each checked as soon as it and those before it are down.
"""

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone

from foundation.errors import Error
from foundation.replica.backend import RemoteMissing
from foundation.replica.sync import (MANIFEST, STORE_JSON, ByteProgress, Local, Manifest, ReplicaTampered, digest,
                                    shared_sink)
from foundation.store import format as F
from foundation.store import layout as L
from foundation.store.disk import atomic_write, fsync_dir
from foundation.store.primary import write_config
from foundation.store.verify import verify_arena

PARTIAL = F.RECOVERING   # in the target directory while a recovery is under way


class RecoverRefused(Error):
    """Refusing to recover into {}: {}"""

    code = 53


@dataclass
class Recovered:
    path: str
    arenas: int = 0
    bytes: int = 0
    downloaded: int = 0
    seconds: float = 0.0
    resumed: bool = False
    damage: list = field(default_factory=list)     # [Damage] found by the final verify
    records: int = 0
    snapshots: int = 0


def recover(backend, dest, key_file=None, progress=None, passphrase=None):
    """Make the store `dest` (absent, empty, or a partial recovery of the same store) from the replica.
    `passphrase`: as for Store.open."""
    t0, got0 = time.monotonic(), backend.received
    dest = os.path.abspath(dest)
    res = Recovered(dest)
    res.resumed = _check_target(dest)
    try:
        conf_b = backend.get(STORE_JSON)
    except RemoteMissing:
        raise RecoverRefused(dest, f"replica {backend.url} has no store.json: nothing was ever replicated there, "
                                   "or the URL is wrong") from None
    local = Local(dest, key_file, config=conf_b, passphrase=passphrase)   # the key is checked here: WrongKey, KeyMissing
    try:
        if res.resumed:
            _check_partial(dest, local)
        try:
            m = Manifest.unpack(backend.get(MANIFEST), local.keys.mac, local.uuid, backend.url)
        except RemoteMissing:
            raise ReplicaTampered(backend.url, "it has a store.json but no manifest (a first replicate that "
                                               "never finished, or a deleted manifest)") from None
        if digest(conf_b) != m.config:
            raise ReplicaTampered(backend.url, "its store.json is not the config its manifest names (changed "
                                               "by someone without the key)")
        # From here on the directory is ours, marked as a partial recovery.
        if not res.resumed:
            os.makedirs(dest, exist_ok=True)
            atomic_write(os.path.join(dest, PARTIAL), json.dumps(
                {"store": local.uuid, "from": backend.url,
                 "started": datetime.now(timezone.utc).isoformat(timespec="seconds")}).encode())
        local.make_dirs()
        total = sum(a.size for a in m.arenas) + m.head.end
        sink = shared_sink(progress(total)) if progress else None
        chain = F.ZERO_CHAIN
        # Several arenas come down at once where the backend allows it, and each is checked, in
        # order, as soon as it is down; the final verify takes these checks as they are.
        known = {}
        with ThreadPoolExecutor(backend.concurrent, thread_name_prefix="recover") as ex:
            got = [ex.submit(_download, local, backend, a, sink) for a in m.arenas]
            try:
                for a, tmp in zip(m.arenas, got):
                    if tmp.result() is not None:
                        known[a.n] = _check_sealed(local, backend, a, tmp.result(), chain)
                    chain = F.chain_mac(local.keys.mac, chain, a.n, a.sealed)
                    res.arenas += 1
                    res.bytes += a.size
            finally:
                for f in got:
                    f.cancel()    # after a failure: no more downloads (those under way finish)
        if m.open.parts:
            _fetch_open(local, backend, m, sink)
            res.bytes += m.open.end
        res.arenas += 1
        local.sync_arenas()
        local.make_derived()
        local.write_head(m.head_bytes)
        write_config(dest, conf_b)   # now it is a store, still marked partial
        fsync_dir(dest)
    finally:
        local.close()
    res.downloaded = backend.received - got0
    _finish(dest, local.master, res, known)
    os.unlink(os.path.join(dest, PARTIAL))   # only once it opened: a failed finish is resumed
    fsync_dir(dest)
    res.seconds = time.monotonic() - t0
    return res


def _check_target(dest):
    """True if dest holds a partial recovery to resume; RecoverRefused if it holds anything else."""
    if not os.path.exists(dest):
        return False
    if not os.path.isdir(dest):
        raise RecoverRefused(dest, "it is not a directory")
    names = os.listdir(dest)
    if F.CONFIG in names and PARTIAL not in names:
        raise RecoverRefused(dest, "it already holds a store; recover into a new, empty directory")
    if names and PARTIAL not in names:
        raise RecoverRefused(dest, "the directory is not empty; recover into a new, empty directory")
    return bool(names)


def _check_partial(dest, local):
    try:
        with open(os.path.join(dest, PARTIAL)) as f:
            store = json.load(f).get("store")
    except (OSError, ValueError, AttributeError):
        store = None
    if store != local.uuid:
        raise RecoverRefused(dest, f"it holds a partial recovery of store {store}, not of the replica's store "
                                   f"{local.uuid}; use another directory")


def _download(local, backend, a, sink):
    """Download sealed arena a -> the file it is in, or None if a resumed recovery already has it."""
    final = local.arena_path(a.n)
    if os.path.exists(final) and os.path.getsize(final) == a.size and _is(local.trailer(a.n), a):
        if sink:
            sink(a.size)
        return None  # checked before it took this name
    tmp = final + ".download"
    backend.get_file(a.name, tmp, progress=ByteProgress(sink))
    return tmp


def _check_sealed(local, backend, a, tmp, chain):
    """Check the download of sealed arena a and give it its name -> what verify_arena found."""
    with open(tmp, "rb") as f:
        buf = f.read()
    if len(buf) != a.size:
        raise ReplicaTampered(backend.url, f"object {a.name} holds {len(buf)} bytes, the manifest says {a.size}")
    found = verify_arena(local, a.n, memoryview(buf), True, chain)
    damage, _, tr, _ = found
    if tr is None or (tr.generation, tr.amac, tr.sealed) != (a.generation, a.amac, a.sealed):
        raise ReplicaTampered(backend.url, f"object {a.name} is not the arena the manifest names"
                                           f"{' (' + str(damage[0]) + ')' if damage else ''}")
    # Damaged records in an authentic arena: still the best copy there is; the final verify names them.
    local.install_arena_file(a.n, tmp)
    return found


def _is(tr, a):
    """Is tr (the trailer of a resumed recovery's arena file, or None) that of manifest entry a?"""
    return tr is not None and (tr.generation, tr.amac, tr.sealed) == (a.generation, a.amac, a.sealed)


def _fetch_open(local, backend, m, sink):
    """Download the open arena's segments into one file and check its committed records."""
    final = local.arena_path(m.open.n)
    tmp = final + ".download"
    with open(tmp, "wb") as f:
        for name, s, e, d in m.open.objects():
            data = backend.get(name)
            if len(data) != e - s or digest(data) != d:
                raise ReplicaTampered(backend.url, f"object {name} (open arena {m.open.n}, offsets {s} to {e}) "
                                                   "does not hold the bytes its manifest names: damaged on the "
                                                   "server. `foundation audit --fix` from a store that still has "
                                                   "them sends them again; or recover from another replica")
            f.write(data)
            if sink:
                sink(len(data))
        f.flush()
        os.fsync(f.fileno())
    with open(tmp, "rb") as f:
        tag = L.arena_tag(f.read(F.ARENA_HEADER_SIZE))
    if not tag.startswith(m.open.ident):
        raise ReplicaTampered(backend.url, f"the segments of open arena {m.open.n} are not of the arena the "
                                           "manifest names")
    local.install_arena_file(m.open.n, tmp)   # its records are checked by the writable open and the final verify


def _finish(dest, master, res, known):
    """Open writable once (summaries, index, Bloom filter are rebuilt), then verify every record: those
    of the arenas checked as they came down (`known`) are not checked again."""
    from foundation.catalog import Catalog
    from foundation.store import Store
    from foundation.store.verify import verify

    with Store.open(dest, master=master, writable=True, recovering=True):
        pass   # summaries are written as the records are taken in
    with Store.open(dest, master=master, recovering=True) as s:
        res.damage, res.records = verify(s, known=known)
        try:
            res.snapshots = len(Catalog.load(s).snapshots())
        except Error as e:
            res.damage.append(f"the catalog cannot be read: {e}")
