"""Replicating the log (paper §4): sealed arenas once, the open arena's new committed part each time, the manifest last.

A replica holds only what cannot be rebuilt: the store's config, every
arena, and a manifest that is the replica's commit point, as the head is
the store's. Objects are named by what they hold (arena number,
generation and arena MAC; open-arena segments by the arena's header tag
and byte range), so an upload never replaces an object the committed
manifest names: the new objects go up first, then the manifest
(atomically), and only then are objects it no longer names deleted. An
interrupted replicate, or a gc that rewrote arenas meanwhile, therefore
never leaves a replica without an arena a snapshot it lists needs.
Objects go up several at a time where the backend allows it (S3), and the
manifest only once every one of them is up (the first failure stops the
rest and commits nothing). The manifest is MACed with the store's key: a
replica of another store, or one someone changed, is recognised.
docs/format.md §13 has every byte.

Replicate reads the store as a reader does, trusting only what the head
commits, so it runs beside an archive or the /snapshot tree; it holds the
readers' lock, so gc waits for it (and it for gc).
"""

import hashlib
import hmac
import json
import logging
import re
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import partial

from foundation.errors import DataCorrupt
from foundation.replica.errors import (ForeignReplica, NotAReplica, PlaintextRefused, RemoteMissing, ReplicaAhead,
                                       ReplicaBusy, ReplicaTampered)
from foundation.replica.pool import Pipeline, begun, gather
from foundation.store import format as F
from foundation.store import layout as L
from foundation.store.cache import Tuning
from foundation.store.primary import Primary

log = logging.getLogger(__name__)

STORE_JSON = "store.json"        # the store's foundation.json, byte for byte
MANIFEST = "manifest"            # the replica's commit point
MANIFEST_FORMAT = "foundation-replica"
MANIFEST_VERSION = 1
MANIFEST_MAC = b"foundation replica manifest"
MAX_PARTS = 16                   # more segments of one open arena are merged into one upload
ID_BYTES = 8                     # bytes of a MAC or tag (as hex) that name an object

_ARENA_OBJ = re.compile(r"arenas/(\d{8})\.(\d+)\.([0-9a-f]{16})\.arena")
_PART_OBJ = re.compile(r"open/(\d{8})\.([0-9a-f]{16})\.(\d{10})-(\d{10})\.([0-9a-f]{16})\.part")


# ---- object names ---------------------------------------------------------------------------

def arena_object(n, generation, amac):
    """The replica's name of sealed arena n in this generation, with this arena MAC."""
    return f"arenas/{n:08d}.{generation}.{amac[:ID_BYTES].hex()}.arena"


def part_object(n, ident, start, end, digest):
    """The replica's name of bytes [start, end) of open arena n, whose header tag begins with ident,
    whose SHA-256 is digest: a name never stands for two contents (a store rolled back to an older
    copy may write other bytes at the same offsets of the same arena)."""
    return f"open/{n:08d}.{ident.hex()}.{start:010d}-{end:010d}.{digest[:ID_BYTES].hex()}.part"


def digest(data):
    return hashlib.sha256(data).digest()


def is_replica_object(name):
    """True for the names replicate makes in arenas/ and open/ (and so may delete)."""
    return bool(_ARENA_OBJ.fullmatch(name) or _PART_OBJ.fullmatch(name))


# ---- the manifest ---------------------------------------------------------------------------

@dataclass
class Sealed:
    """A sealed arena as the replica holds it."""

    n: int
    generation: int
    size: int
    amac: bytes      # its arena MAC (trailer)
    sealed: bytes    # the arena MAC its chain covers (= amac in generation 0)

    @property
    def name(self):
        return arena_object(self.n, self.generation, self.amac)


@dataclass
class OpenParts:
    """The open arena as the replica holds it: segments [start, end) covering [0, head.end)."""

    n: int
    ident: bytes     # first ID_BYTES of the arena header's tag
    parts: list      # [(start, end, SHA-256 of those bytes)], contiguous from 0

    def objects(self):
        """[(name, start, end, digest)] of the segments, in order."""
        return [(part_object(self.n, self.ident, s, e, d), s, e, d) for s, e, d in self.parts]

    @property
    def end(self):
        return self.parts[-1][1] if self.parts else F.ARENA_HEADER_SIZE


@dataclass
class Manifest:
    store: str
    head_bytes: bytes
    head: F.Head
    arenas: list                  # [Sealed], arenas 0 .. head.arena - 1
    open: OpenParts
    config: bytes                 # SHA-256 of store.json: the config is authenticated through the manifest
    written: str = ""

    def objects(self):
        """{name: size} of every object this manifest names (store.json and itself aside)."""
        out = {a.name: a.size for a in self.arenas}
        out.update((name, e - s) for name, s, e, _ in self.open.objects())
        return out

    def pack(self, mac_key):
        body = {
            "format": MANIFEST_FORMAT, "version": MANIFEST_VERSION, "store": self.store,
            "written": self.written, "head": self.head_bytes.hex(), "config": self.config.hex(),
            "arenas": [[a.n, a.generation, a.size, a.amac.hex(), a.sealed.hex()] for a in self.arenas],
            "open": {"arena": self.open.n, "id": self.open.ident.hex(), "parts": [[s, e, d.hex()] for s, e, d in self.open.parts]},
        }
        line = json.dumps(body, separators=(",", ":"), sort_keys=True).encode() + b"\n"
        return line + b"mac " + F.mac(mac_key, MANIFEST_MAC, line).hex().encode() + b"\n"

    @classmethod
    def unpack(cls, b, mac_key, uuid, url):
        """The manifest in b; ForeignReplica if it is another store's, ReplicaTampered if it fails a check."""
        def bad(what):
            raise ReplicaTampered(url, f"its manifest {what}")

        line, sep, rest = bytes(b).partition(b"\n")
        line += sep
        try:
            body = json.loads(line)
            store = body["store"]
        except (ValueError, KeyError, TypeError):
            bad("is not readable")
        if store != uuid:
            raise ForeignReplica(url, store, uuid)
        if not (rest.startswith(b"mac ") and rest.endswith(b"\n")) or not hmac.compare_digest(
                rest[4:-1], F.mac(mac_key, MANIFEST_MAC, line).hex().encode()):
            bad("fails its MAC (changed by someone without the key, or damaged)")
        if body.get("format") != MANIFEST_FORMAT or body.get("version") != MANIFEST_VERSION:
            bad(f"has format {body.get('format')!r} version {body.get('version')!r}, "
                f"which this Foundation does not read")
        try:
            hb = bytes.fromhex(body["head"])
            head = F.Head.unpack(hb, mac_key)
            arenas = [Sealed(n, g, size, bytes.fromhex(am), bytes.fromhex(sm))
                      for n, g, size, am, sm in body["arenas"]]
            o = body["open"]
            op = OpenParts(o["arena"], bytes.fromhex(o["id"]), [(s, e, bytes.fromhex(d)) for s, e, d in o["parts"]])
            config = bytes.fromhex(body["config"])
        except (ValueError, KeyError, TypeError) as e:
            bad(f"is malformed ({e})")
        m = cls(store, hb, head, arenas, op, config, body.get("written", ""))
        problem = m.inconsistency(mac_key)
        if problem:
            bad(problem)
        return m

    def inconsistency(self, mac_key):
        """What makes this manifest impossible (arenas out of order, a chain that does not reach
        the head, segments with gaps), or None."""
        h = self.head
        if [a.n for a in self.arenas] != list(range(h.arena)):
            return f"does not list arenas 0 to {h.arena - 1} in order"
        chain = F.ZERO_CHAIN
        for a in self.arenas:
            chain = F.chain_mac(mac_key, chain, a.n, a.sealed)
        if chain != h.chain:
            return "lists arenas whose chain does not reach its head (an arena dropped, replaced or reordered)"
        if self.open.n != h.arena:
            return f"names open arena {self.open.n}, its head {h.arena}"
        pos = 0
        for s, e, _ in self.open.parts:
            if s != pos or e <= s:
                return f"has a gap or overlap in the segments of open arena {h.arena} at offset {pos}"
            pos = e
        if self.open.parts and pos != h.end or not self.open.parts and h.end != F.ARENA_HEADER_SIZE:
            return f"has segments of open arena {h.arena} ending at {pos}, its head at {h.end}"
        return None


# ---- the local store, without its caches ------------------------------------------------------

class Local(Primary):
    """The store's primary files (foundation.store.primary.Primary), as replicate, audit, repair and
    recover use them. Arenas are checked in the C core on every core (Tuning's threads)."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.log.threads = Tuning().threads

    def share(self, settle=False):
        """Hold the readers' lock (gc waits for us) and the one-replicate-at-a-time lock; `settle`:
        finish a pending gc switch first (Primary.share)."""
        super().share(lambda: ReplicaBusy(self.path), settle)


def verify_bytes(local, n, buf, sealed, chain=None, committed=None, full=True):
    """foundation.store.verify.verify_arena on a buffer -> (damage, trailer, chain)."""
    from foundation.store.verify import verify_arena

    damage, _count, tr, chain = verify_arena(local, n, memoryview(buf), sealed, chain, committed, full)
    return damage, tr, chain


def own_prefix(local, n, mine, theirs, base, damage):
    """How many leading bytes of `theirs` (a replica's bytes of arena n from offset `base`) are this
    store's own copy of `mine` (the local bytes of the same range): up to the first record that
    differs although the local one is not damaged, or whose local header (type, lengths, key) is
    not the replica's. A store restored from an older copy writes other records at the same
    offsets, each valid on its own: from there on the replica's bytes are another timeline's.
    Records of `theirs` must verify; the arena header may differ only if the local one is
    damaged."""
    at = {d.offset for d in damage}
    rest = min((d.offset for d in damage if d.cuts()), default=None)
    spans = [(d.offset, d.end) for d in damage if d.end is not None]  # bytes a salvaging scan stepped over

    def hurt(off):
        return off in at or rest is not None and off >= rest or any(a <= off < b for a, b in spans)

    h = F.ARENA_HEADER_SIZE
    if base < h and mine[:h - base] != theirs[:h - base] and not hurt(0):
        return 0
    start = max(base, h)
    # records are tagged under their arena's iv (§5.2): the replica's header when it holds one,
    # else the local one (a copy written under another iv then verifies nowhere: nothing is taken)
    try:
        iv = L.arena_iv(theirs) if base == 0 and len(theirs) >= h else local.log.iv(n)
    except DataCorrupt:  # no header to trust: nothing is shown to be ours
        return 0
    entries, end, err = local.log.scan(n, iv, memoryview(theirs)[start - base:], start)
    for off, _, _, stored, _, _ in entries:
        a, b = off - base, off - base + L.HEADER_SIZE + stored
        if mine[a:b] == theirs[a:b]:
            continue
        # A damaged local record is the replica's only if its header still names the same record
        # (type, lengths, key: the score in hash mode): the lost timeline's record at that offset
        # is valid too. A damaged or missing header says nothing: stop there.
        if not hurt(off) or mine[a:a + L.KEY_END] != theirs[a:a + L.KEY_END]:
            return a
    return end - base


# ---- the remote side ------------------------------------------------------------------------

def fetch_remote(backend, listing=False):
    """(store.json bytes or None, manifest bytes or None, {name: size} if `listing` else None),
    requested at once where the backend allows it: one round trip instead of three."""
    def get(name):
        try:
            return backend.get(name)
        except RemoteMissing:
            return None
    got = gather([partial(get, STORE_JSON), partial(get, MANIFEST)] + ([backend.list] if listing else []),
                 backend.concurrent)
    return got[0], got[1], got[2] if listing else None


def read_remote(local, backend, fetched=None):
    """(store.json bytes or None, Manifest or None, why the manifest was not usable or None).

    Raises ForeignReplica for another store's replica and NotAReplica for a
    prefix with other files; a manifest that fails its checks is returned as
    the reason, for the caller to report (audit) or replace (replicate).
    `fetched`: what fetch_remote returned, if the caller has it.
    """
    conf_b, mb, found = fetched or fetch_remote(backend)
    if conf_b is not None:
        try:
            other = F.unpack_config(conf_b)["uuid"]
        except (ValueError, KeyError, TypeError):
            other = "? (its store.json is unreadable)"
        if other != local.uuid:
            raise ForeignReplica(backend.url, other, local.uuid)
    if conf_b is None and mb is None:
        found = backend.list() if found is None else found
        if found:
            names = sorted(found)
            raise NotAReplica(backend.url, ", ".join(names[:3]) + (" …" if len(names) > 3 else ""))
        return None, None, None
    if mb is None:
        return conf_b, None, None
    try:
        return conf_b, Manifest.unpack(mb, local.keys.mac, local.uuid, backend.url), None
    except ReplicaTampered as e:
        return conf_b, None, str(e)


class ByteProgress:
    """Turns one put's `done` counts into byte counts for a running total (Progress)."""

    def __init__(self, sink):
        self.sink, self.last = sink, 0

    def __call__(self, done):
        if self.sink and done > self.last:
            self.sink(done - self.last)
        self.last = done  # a retried transfer starts again from 0


def shared_sink(sink):
    """sink, callable from several transfer threads at once."""
    lock = threading.Lock()

    def call(n):
        with lock:
            sink(n)
    return call


def put_bytes(backend, name, data):
    """Upload a small object made in memory (the manifest, store.json)."""
    with tempfile.NamedTemporaryFile(prefix="foundation-") as f:
        f.write(data)
        f.flush()
        backend.put(name, f.name, token="")


# ---- replicate ------------------------------------------------------------------------------

@dataclass
class Result:
    url: str
    head: F.Head = None
    arenas_sent: int = 0
    arenas_kept: int = 0
    parts_sent: int = 0
    bytes_sent: int = 0
    deleted: int = 0
    seconds: float = 0.0
    warnings: list = field(default_factory=list)   # local damage: needs the user's attention
    notes: list = field(default_factory=list)      # what replicate found and mended on the replica

    def summary(self):
        rate = self.bytes_sent / self.seconds / 1e6 if self.seconds > 0 else 0.0
        return (f"replica {self.url}: up to date at arena {self.head.arena} offset {self.head.end}; "
                f"sent {self.arenas_sent} sealed arena(s) and {self.parts_sent} open-arena segment(s), "
                f"{self.bytes_sent / 1e6:,.1f} MB in {self.seconds:.1f} s ({rate:,.1f} MB/s); "
                f"{self.arenas_kept} arena(s) already there; {self.deleted} old object(s) removed")


def replicate(local, backend, allow_plaintext=False, progress=None, resend=(), force=False):
    """Bring the replica up to the local head (module docstring) -> Result; writes nothing locally.

    progress(total bytes) -> a callable taking byte counts (cli.common.Progress). `resend`: names of
    objects found damaged on the server (audit --fix): sent again from the local store, replacing
    them in place, although they are present with the right size. A replica further along the
    same log than the local store is refused (ReplicaAhead) unless `force`.
    """
    if not local.conf["encrypted"] and not allow_plaintext:
        raise PlaintextRefused(local.path, backend.url)
    t0, sent0 = time.monotonic(), backend.sent
    res = Result(backend.url)
    local.share(settle=True)     # a gc switch left pending is finished first: the replica gets the new log
    res.notes += local.repaired
    try:
        fetched = fetch_remote(backend, listing=True)
        conf_b, old, why = read_remote(local, backend, fetched)
        if why:
            res.notes.append(f"{why}; every object was sent again")
        existing = fetched[2]
        head_b, head = local.read_head()
        res.head = head
        files = local.arena_files(head, ID_BYTES)
        have = {k: v for k, v in existing.items() if k not in set(resend)}
        plan = None
        if old and not force:
            # The guard needs the whole plan before any byte goes up: a nightly run checks only
            # the few new arenas, so it loses little by not overlapping checks and uploads.
            plan = _plan(local, backend, head, files, old, have, res, trust_names=old is None and not why)
            if _loses(local, backend, old, plan, files):
                raise ReplicaAhead(backend.url, old.head.arena, old.head.end, head.arena, head.end)
        # store.json claims the prefix before any arena goes up; where the backend allows it, on its
        # way while the first arena is checked.
        claimed = begun(put_bytes, backend, STORE_JSON, local.config, now=backend.concurrent > 1) \
            if conf_b != local.config else lambda: None
        sink = shared_sink(progress(_to_send(files, old, have, head))) if progress else None

        def put(name, path, offset, length, token):
            claimed()
            backend.put(name, path, offset, length, token=token, progress=ByteProgress(sink))
            return name
        # Each arena goes up as soon as it is checked, several at once where the backend allows
        # it; every one is up before the manifest.
        with Pipeline(put, backend.concurrent) as up:
            if plan is None:
                plan = _plan(local, backend, head, files, old, have, res, trust_names=old is None and not why,
                             send=lambda entry, p: up.add(entry.name, p.path, 0, p.size, entry.amac.hex()))
            else:
                for entry, p in plan.sealed_up:
                    up.add(entry.name, p.path, 0, p.size, entry.amac.hex())
            for name, s, e, _ in plan.parts_up:
                up.add(name, files[-1].path, s, e - s, _part_token(name))
            for name in up.results():
                if _PART_OBJ.fullmatch(name):
                    res.parts_sent += 1
                else:
                    res.arenas_sent += 1
        claimed()
        new = Manifest(local.uuid, head_b, head, plan.entries, plan.open, digest(local.config),
                       datetime.now(timezone.utc).isoformat(timespec="seconds"))
        if old is None or (old.head_bytes, old.arenas, old.open, old.config) != \
                (head_b, new.arenas, new.open, new.config):
            put_bytes(backend, MANIFEST, new.pack(local.keys.mac))   # the commit point
        # Only now may the objects the new manifest does not name go; with them the temporaries of
        # interrupted puts (we hold the one-replicate lock), all at once where the backend allows it.
        keep = new.objects()
        doomed = [name for name in sorted(existing) if name not in keep and is_replica_object(name)]
        gather([partial(backend.delete, name) for name in doomed] + [partial(backend.cleanup, "")],
               backend.concurrent)
        res.deleted = len(doomed)
    finally:
        local.release()
    res.bytes_sent = backend.sent - sent0
    res.seconds = time.monotonic() - t0
    return res


def _loses(local, backend, old, plan, files):
    """Would the new manifest (plan) give up data the replica holds and the local store lacks (the
    local store restored from an older copy, and perhaps written on since)? The manifest is the
    newest commit the replica has held, and it only ever moves on or to a log gc rewrote: an arena
    of a higher generation (a gc switch, compare-by-value or a compare-by-hash tail laid out again,
    rewrites every arena after it, each sealed anew: its sealed MAC is its arena MAC; a
    compare-by-hash compaction keeps the sealed MAC of the arena it replaces), or a fresh open arena where the replica has a sealed or open
    one. Anything else the replica holds must be in the new manifest or be the local store's own
    bytes."""
    value = local.mode == "value"
    ra, la = old.head.arena, len(plan.entries)
    for k in range(min(ra, la)):
        a, e = old.arenas[k], plan.entries[k]
        if (a.generation, a.amac) == (e.generation, e.amac):
            continue
        if e.generation > a.generation:
            if value or e.sealed == e.amac:
                return False    # gc rewrote the log from here on (a switch, §12)
            continue
        return True
    if la < ra:     # the replica sealed the arena that is open here
        if plan.open.ident != files[-1].ident or not files[-1].ident:
            return True
        try:
            hb = backend.get(old.arenas[la].name, 0, F.ARENA_HEADER_SIZE)
        except RemoteMissing:
            return False
        same = L.arena_tag(hb, ID_BYTES) == plan.open.ident
        return same or not value
    p = files[ra]
    ident = p.ident if ra == la else (L.arena_tag(p.view(0, F.ARENA_HEADER_SIZE), ID_BYTES) if p.size else b"")
    if ident != old.open.ident:
        return not value and old.open.end > F.ARENA_HEADER_SIZE
    limit = plan.open.end if ra == la else p.size
    kept = set(plan.open.parts) if ra == la else set()
    for s, e, d in old.open.parts:
        if (s, e, d) not in kept and (e > limit or digest(p.view(s, e)) != d):
            return True
    return False


def _part_token(name):
    return name.split("/", 1)[1][:-len(".part")]


@dataclass
class _Plan:
    entries: list = field(default_factory=list)     # [Sealed] of the new manifest
    sealed_up: list = field(default_factory=list)   # [(Sealed, ArenaFile)] to upload
    open: OpenParts = None
    parts_up: list = field(default_factory=list)    # [(name, start, end, digest)] to upload


def _to_send(files, old, existing, head):
    """About how many bytes replicate sends (for the progress bar, before the plan is made): the
    sealed arenas the replica lacks under their own names, and the open arena past its segments."""
    have = {a.n: a for a in old.arenas} if old else {}
    total = 0
    for p in files[:-1]:
        mine = have.get(p.n)
        if p.trailer is None or not mine or existing.get(mine.name) != mine.size \
                or (mine.generation, mine.amac) != (p.trailer.generation, p.trailer.amac):
            total += p.size
    start = old.open.end if old and (old.open.n, old.open.ident) == (head.arena, files[-1].ident) else 0
    return total + max(0, head.end - start)


def _plan(local, backend, head, files, old, existing, res, trust_names=False, send=None):
    """Which copy of each arena the new manifest names, and what must go up for it.

    send(Sealed, ArenaFile) is called for each sealed arena to upload as soon as it is decided
    (replicate starts its upload while the next arenas are checked).

    With `trust_names` (no manifest yet: a first replicate was cut), an arena object already complete
    under the very name the local arena would get is kept, so the first upload resumes too.
    """
    plan = _Plan()
    have = {a.n: a for a in old.arenas} if old else {}
    if trust_names:
        for p in files[:-1]:
            if p.trailer is not None:
                t = p.trailer
                have[p.n] = Sealed(p.n, t.generation, p.size, t.amac, t.sealed)
    chain = F.ZERO_CHAIN
    for p in files[:-1]:
        n, tr, mine = p.n, p.trailer, have.get(p.n)
        there = mine is not None and existing.get(mine.name) == mine.size
        if tr is not None and tr.chain == F.chain_mac(local.keys.mac, chain, n, tr.sealed):
            ours = Sealed(n, tr.generation, p.size, tr.amac, tr.sealed)
            if there and (mine.generation, mine.amac, mine.sealed) == (ours.generation, ours.amac, ours.sealed):
                plan.entries.append(mine)
                res.arenas_kept += 1
            elif _damaged(local, backend, p, chain, res, there and mine.sealed == ours.sealed, old, existing):
                plan.entries.append(mine)   # the replica keeps its good copy of this chain position
                res.arenas_kept += 1
            else:
                plan.entries.append(ours)
                plan.sealed_up.append((ours, p))
                if send:
                    send(ours, p)
        elif there:
            _warn(res, f"local arena {n} is damaged (missing, no valid trailer, or off the chain); "
                       "the replica keeps its copy: run `foundation repair`")
            plan.entries.append(mine)
            res.arenas_kept += 1
        else:
            raise DataCorrupt(f"arena {n} offset 0: the local arena is damaged (missing, no valid trailer, or off "
                              "the chain) and the replica has no copy of it; run `foundation verify`")
        chain = F.chain_mac(local.keys.mac, chain, n, plan.entries[-1].sealed)
    if chain != head.chain:
        raise DataCorrupt(f"arena {head.arena} offset 0: the sealed arenas do not chain up to the head "
                          "(log rolled back or an arena replaced); run `foundation verify`")
    _plan_open(local, backend, head, files[-1], old, existing, plan, res)
    return plan


def _damaged(local, backend, p, chain, res, keeps, old, existing):
    """Check a local sealed arena before it goes up. True if it is damaged and the replica's
    copy (`keeps`) is to stay; a damaged arena with no better copy goes up as it is. If the
    replica holds a good copy of damaged bytes as segments of the arena (it was open at the last
    replicate), nothing is sent: `repair` mends the arena from them first.

    Where the replica holds nothing of the arena to keep or mend from, what the check finds
    changes nothing that goes up, only the warning: the records' tags with the arena MAC and
    the chain then suffice (they prove every byte is the one written, and so name any damage
    since); decoding and scores, which catch a block written wrong, are checked where the
    replica has a copy that could stay."""
    segs = old.open if old and old.open.n == p.n and old.open.parts else None
    damage, _, _ = verify_bytes(local, p.n, p.view(), True, chain, full=keeps or segs is not None)
    if damage and not keeps and segs and any(d.offset < segs.end for d in damage) \
            and all(existing.get(name) == e - s for name, s, e, _ in segs.objects()) \
            and min(d.offset for d in damage) < _own_segments(local, backend, p.n, p.view(0, segs.end), segs,
                                                               damage):
        raise DataCorrupt(f"arena {p.n} offset {damage[0].offset}: the local arena is damaged, and the replica "
                          f"holds its first {segs.end} bytes as open-arena segments: run `foundation "
                          "repair` (it mends the arena from them), then replicate; the replica keeps its "
                          "last state (its manifest is unchanged)")
    if damage:
        where = "the replica keeps its copy" if keeps else "it is replicated as it is (no better copy exists)"
        _warn(res, f"local arena {p.n} is damaged ({damage[0]}{' …' if len(damage) > 1 else ''}); "
                   f"{where}: run `foundation repair`")
    return bool(damage) and keeps


def _own_segments(local, backend, n, mine, segs, damage):
    """Up to which offset the replica's segments `segs` hold this store's own bytes of arena n,
    `mine` being the local bytes of the same range (own_prefix). Downloaded only in the rare case
    where a damaged local arena might be mended from them."""
    theirs = bytearray()
    for name, _, _, d in segs.objects():
        data = backend.get(name)
        if digest(data) != d:
            break
        theirs += data
    base = segs.parts[0][0]
    return base + own_prefix(local, n, mine, bytes(theirs), base, damage)


def _warn(res, msg):
    log.warning("%s", msg)
    res.warnings.append(msg)


def _plan_open(local, backend, head, p, old, existing, plan, res):
    """The segments of the open arena the new manifest names: the replica's own as far as they hold
    the local bytes, then one new segment up to the head. Local bytes that differ from a segment
    because they are damaged never replace it (the replica keeps the good copy for `repair`)."""
    n, end = head.arena, head.end
    if not p.size or not p.ident:
        if end > F.ARENA_HEADER_SIZE:
            raise DataCorrupt(f"arena {n} is missing (the open arena, committed up to offset {end}); "
                              "run `foundation repair`")
        plan.open = OpenParts(n, b"\0" * ID_BYTES, [])
        return
    if p.size < end:
        raise DataCorrupt(f"arena {n} offset {p.size}: the open arena ends before the committed end {end}")
    view = p.view(0, end)
    damage = verify_bytes(local, n, view, False, None, end)[0]
    prev = old.open if old and (old.open.n, old.open.ident) == (n, p.ident) and old.open.end <= end else None
    parts = []
    for name, s, e, d in prev.objects() if prev else ():
        if existing.get(name) != e - s:
            break
        if digest(view[s:e]) != d:
            hurt = [x for x in damage if s <= x.offset < e]
            if not hurt or _own_segments(local, backend, n, view[s:e], OpenParts(n, p.ident, [(s, e, d)]),
                                         damage) < e:
                break    # another timeline's bytes (the store was rolled back): send anew from here
            _warn(res, f"local open arena {n} is damaged ({hurt[0]}); the replica keeps its copy of "
                       f"offsets {s} to {e}: run `foundation repair`")
        parts.append((s, e, d))
    start = parts[-1][1] if parts else 0
    if end > start:
        parts.append((start, end, digest(view[start:end])))
    if len(parts) > MAX_PARTS and not damage:
        parts, start = [(0, end, digest(view))], 0
    plan.open = OpenParts(n, p.ident, parts)
    new = [x for x in damage if x.offset >= start]
    if new:
        _warn(res, f"local open arena {n} has damaged committed records ({new[0]}); replicated as they are")
    plan.parts_up = [x for x in plan.open.objects() if x[1] >= start]
