"""Auditing a replica against the local store: is every object there, whole, authentic and current?

One listing answers presence and size of every object the manifest
names; the manifest's own MAC and chain, and the local trailers, answer
whether it is authentic and current; the sampled arenas are downloaded
and checked as `verify` checks the local log (record tags, decoding,
scores, arena MAC) and against the manifest (generation, arena MAC,
chain). Every problem has one of five kinds, worst first: foreign (another
store's replica), tampered (a MAC or the chain does not fit: changed by
someone without the key), corrupt (an object fails its own checks or has
the wrong size), missing (an object the manifest names is absent) and
stale (the replica is behind the local store, or ahead of it).
"""

import math
import os
import random
import tempfile
from dataclasses import dataclass

from foundation.replica import sync
from foundation.replica.errors import ForeignReplica, NotAReplica
from foundation.replica.sync import MANIFEST, STORE_JSON, read_remote, verify_bytes
from foundation.store import format as F
from foundation.store import layout as L

KINDS = ("foreign", "tampered", "corrupt", "missing", "stale")


@dataclass
class Problem:
    kind: str        # one of KINDS
    name: str        # the object (or "" for the replica as a whole)
    what: str

    def __str__(self):
        return f"{self.kind.upper()} {self.name or 'replica'}: {self.what}"


@dataclass
class Report:
    url: str
    problems: list
    arenas: int = 0            # arenas the manifest names (sealed + open)
    checked: int = 0           # arenas downloaded and checked
    bytes_checked: int = 0
    head: F.Head = None        # the replica's head (None without a usable manifest)
    written: str = ""

    def bad_objects(self):
        """Names of objects that fail their own checks (replicate(resend=...) sends them again)."""
        return sorted({p.name for p in self.problems if p.kind in ("corrupt", "tampered")
                       and p.name not in ("", STORE_JSON, MANIFEST)})


def audit(local, backend, sample=100.0, progress=None, rng=None):
    """-> Report. Reads the replica and the local head and trailers; writes nothing anywhere."""
    rep = Report(backend.url, [])
    local.share()
    try:
        _audit(local, backend, sample, progress, rng or random.Random(), rep)
    finally:
        local.release()
    return rep


def _audit(local, backend, sample, progress, rng, rep):
    add = rep.problems.append
    try:
        conf_b, m, why = read_remote(local, backend)
    except ForeignReplica as e:
        add(Problem("foreign", STORE_JSON, str(e)))
        return
    except NotAReplica as e:
        add(Problem("foreign", "", str(e)))
        return
    if conf_b is None:
        add(Problem("missing", STORE_JSON, "the copy of the store's config is absent"))
    elif conf_b != local.config:
        add(Problem("tampered", STORE_JSON, "differs from the local foundation.json"))
    elif m is not None and sync.digest(conf_b) != m.config:
        add(Problem("tampered", STORE_JSON, "is not the config the manifest names"))
    if why:
        add(Problem("tampered", MANIFEST, why))
        return
    if m is None:
        add(Problem("missing", MANIFEST, "no manifest: nothing was replicated yet, or it was deleted"))
        return
    rep.head, rep.written, rep.arenas = m.head, m.written, len(m.arenas) + 1
    listing = backend.list()
    present = []
    for name, size in m.objects().items():
        if name not in listing:
            add(Problem("missing", name, "named by the manifest but absent"))
        elif listing[name] != size:
            add(Problem("corrupt", name, f"{listing[name]} bytes, the manifest says {size}"))
        else:
            present.append(name)
    _staleness(local, m, add)
    _sample(local, backend, m, set(present), sample, progress, rng, rep)


def _staleness(local, m, add):
    """Compare the replica's head and arena generations with the local store's."""
    _, head = local.read_head()
    files = local.arena_files(head, sync.ID_BYTES)
    for a in m.arenas[:head.arena]:
        tr = files[a.n].trailer
        if tr is None or (tr.generation, tr.amac) == (a.generation, a.amac):
            continue  # (a local arena without a trailer is verify's business)
        if a.generation < tr.generation:
            add(Problem("stale", a.name, f"generation {a.generation}; the local arena {a.n} is generation "
                                         f"{tr.generation} (gc rewrote it): run `foundation replicate`"))
        elif a.generation > tr.generation:
            add(Problem("stale", a.name, f"generation {a.generation} is newer than the local arena {a.n} "
                                         f"(generation {tr.generation}): was the local store rolled back?"))
        else:   # the manifest's MAC holds: written with the key, for another version of the log
            add(Problem("stale", a.name, f"another version of arena {a.n} than the local one (the local log was "
                                         "rewritten by a compare-by-value gc, or rolled back): run "
                                         "`foundation replicate`"))
    r = m.head
    if r.arena < head.arena:
        add(Problem("stale", "", f"arenas {r.arena} to {head.arena - 1} are sealed locally but not on the "
                                 f"replica: run `foundation replicate`"))
    elif r.arena > head.arena:
        add(Problem("stale", "", f"the replica names arenas up to {r.arena}, beyond the local log's open arena "
                                 f"{head.arena} (gc shortened the log, or the local store was rolled back)"))
    elif files[-1].ident and m.open.parts and files[-1].ident != m.open.ident:
        add(Problem("stale", "", f"the replica's open arena {r.arena} is not the local one (gc rewrote it): "
                                 "run `foundation replicate`"))
    elif r.end < head.end:
        add(Problem("stale", "", f"replicated up to arena {r.arena} offset {r.end}; the local head is at "
                                 f"offset {head.end}: run `foundation replicate`"))
    elif r.end > head.end:
        add(Problem("stale", "", f"the replica's head (arena {r.arena} offset {r.end}) is ahead of the local "
                                 f"head (offset {head.end}): was the local store rolled back?"))


def _sample(local, backend, m, present, sample, progress, rng, rep):
    """Download the sampled arenas (those whose objects are all present) and check them."""
    chains, chain = [], F.ZERO_CHAIN
    for a in m.arenas:
        chain = F.chain_mac(local.keys.mac, chain, a.n, a.sealed)
        chains.append(chain)
    whole = [a for a in m.arenas if a.name in present]
    opened = m.open.parts and all(x[0] in present for x in m.open.objects())
    units = whole + ([m.open] if opened else [])
    k = min(len(units), math.ceil(len(units) * max(0.0, min(sample, 100.0)) / 100))
    chosen = sorted(rng.sample(range(len(units)), k))
    total = sum(units[i].size if i < len(whole) else m.open.end for i in chosen)
    sink = progress(total) if progress else None
    with tempfile.TemporaryDirectory(prefix="foundation-audit-") as tmp:
        for i in chosen:
            if i < len(whole):
                a = whole[i]
                path = os.path.join(tmp, "arena")
                backend.get_file(a.name, path)
                with open(path, "rb") as f:
                    buf = f.read()
                os.unlink(path)
                _check_sealed(local, a, buf, chains[a.n - 1] if a.n else F.ZERO_CHAIN, chains[a.n], rep)
            else:
                segs = [(x, backend.get(x[0])) for x in m.open.objects()]
                buf = b"".join(data for _, data in segs)
                _check_open(local, m, segs, buf, rep)
            rep.checked += 1
            rep.bytes_checked += len(buf)
            if sink:
                sink(len(buf))


def _check_sealed(local, a, buf, prev, chain, rep):
    damage, tr, _ = verify_bytes(local, a.n, buf, True, None)
    for d in damage:
        rep.problems.append(Problem("corrupt", a.name, str(d)))
    if tr is None:
        return
    if (tr.generation, tr.amac, tr.sealed) != (a.generation, a.amac, a.sealed):
        rep.problems.append(Problem("tampered", a.name, f"its trailer (generation {tr.generation}) is not the "
                                                        "arena the manifest names"))
    elif tr.chain != chain or tr.chain != F.chain_mac(local.keys.mac, prev, a.n, tr.sealed):
        rep.problems.append(Problem("tampered", a.name, "its chain MAC does not fit the arenas before it"))


def _check_open(local, m, segs, buf, rep):
    """Each segment against its digest in the manifest, then the records they hold together; every
    problem names the segment it is in (audit --fix sends that one again)."""
    def where(offset):
        return next((x[0] for x, _ in segs if x[1] <= offset < x[2]), segs[-1][0][0])

    for (name, _, _, d), data in segs:
        if sync.digest(data) != d:
            rep.problems.append(Problem("corrupt", name, "does not hold the bytes the manifest names"))
    damage, _, _ = verify_bytes(local, m.open.n, buf, False, None, m.head.end)
    for d in damage:
        rep.problems.append(Problem("corrupt", where(d.offset), str(d)))
    if not damage and L.arena_tag(buf, len(m.open.ident)) != m.open.ident:
        rep.problems.append(Problem("tampered", segs[0][0][0], f"the segments are not of the open arena "
                                                               f"{m.open.n} the manifest names"))
