"""The system catalog: every snapshot ever taken, kept in the log itself (paper §7.1).

After each snapshot the whole list is archived again: the list is a blob of
JSON lines, oldest addition first, so a new snapshot changes only the last
block or two of the blob (the rest dedups, and is not even re-sent to the
store), and a CATALOG record naming the blob's root is appended last. The
newest catalog is therefore the newest CATALOG record in the log, which
`store.latest` finds after a crash and after `foundation rebuild`, since it
needs nothing but the arenas. `commit` ends with `store.sync()`: that is
the commit point of a snapshot. Lookup by time follows TimeLine: the
snapshot for time t is the latest one whose time is not after t.

Forgetting (`forget`, for `foundation forget` and `prune`) writes a new
generation of the list without the forgotten lines, in one commit like a
snapshot: a crash leaves the old list or the new one. Ids are never
reused: while the greatest id ever given is no longer listed, the header
line carries the next one. `live_roots` names every tree the list keeps
alive, which is what `foundation gc` marks from.

The byte layout is in docs/format.md (section "System catalog").
"""

import hashlib
import json
import re
import struct
from datetime import date, datetime, time, timedelta, timezone

from foundation.errors import BadInput, DataCorrupt, NotFound
from foundation.fields import Fields
from foundation.image import Root, read_blob, write_blob

CATALOG = 3  # foundation.store.BlockType.CATALOG

MAGIC = b"FDNcatlg"
VERSION = 1
RECORD = struct.Struct("<8sHHIQQQq")  # magic version ref_size depth size generation count written_us
HASH_SIZE = 32
HEADER_LINE = {"format": "foundation-catalog", "version": VERSION}
TIME_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"
# A snapshot name (docs/operation.md, "Names and times"): 1 to 200 characters,
# no '/', '@' or control character; not first a space, '-' (an option), '#'
# (an id, as `forget #5` takes it) or '.'; no trailing space. Names are
# directories of the /snapshot tree, and arguments on a command line.
NAME_RE = re.compile(r"^[^\s/@#.\-\x00-\x1f\x7f][^/@\x00-\x1f\x7f]{0,199}$")
NAME_RULE = ("use 1 to 200 characters without '/', '@' or control characters, "
             "not starting with a space, '-', '#' or '.', and without trailing spaces")
# Snapshot times a catalog accepts: none before the Unix epoch, none more than
# a day ahead of this clock (a day for time zones and a skewed clock): a day
# from the far future would be "the latest" of its VM for ever.
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
FUTURE_SLACK = timedelta(days=1)


class UnknownName(NotFound):
    """No snapshots of {!r} in the catalog. {}"""

    code = 30


class TooEarly(NotFound):
    """{!r} has no snapshot at or before {}; its first snapshot is from {}."""

    code = 30


class DuplicateSnapshot(BadInput):
    """{!r} already has a snapshot at {} (snapshot {}); choose another time."""

    code = 34


class BadName(BadInput):
    """{!r} is not a valid snapshot name: {}"""

    code = 31


class BadTime(BadInput):
    """Cannot read {!r} as a date or time: write it in ISO 8601, e.g. 2024-05-01, 2024-05-01T13:30 or 2024-05-01T13:30:00Z."""

    code = 31


class TimeOutOfRange(BadInput):
    """A snapshot cannot be dated {}: {}."""

    code = 31


class CatalogCorrupt(DataCorrupt):
    """The system catalog is damaged: {}. Every snapshot is still in the log; run `foundation verify`, and restore the arena from a replica."""

    code = 20


class CatalogTooNew(DataCorrupt):
    """The system catalog has format version {}, newer than this Foundation understands ({}): upgrade Foundation."""

    code = 23


def check_name(name):
    if not isinstance(name, str) or not NAME_RE.match(name) or name != name.strip():
        raise BadName(name, NAME_RULE)
    return name


def check_time(when, now=None):
    """The time of a new snapshot, if it lies in the range a catalog accepts."""
    now = now or datetime.now(timezone.utc)
    if when < EPOCH:
        raise TimeOutOfRange(format_time(when), "it is before 1970-01-01")
    if when > now + FUTURE_SLACK:
        raise TimeOutOfRange(format_time(when), f"it is more than a day after now ({format_time(now)}); "
                                                "check the --at value and the clock")
    return when


# ---- time ---------------------------------------------------------------------
def utc(dt):
    """An aware datetime in UTC; a naive one is taken as local time."""
    if dt.tzinfo is None:
        dt = dt.astimezone()
    return dt.astimezone(timezone.utc)


def format_time(dt):
    return utc(dt).strftime(TIME_FORMAT)


def format_size(n):
    """Bytes for people: 512 B, 1.5 KiB, 20.0 GiB (list, gc, diff, the tree's `changes`)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def parse_time(text, end_of_day=False):
    """ISO 8601 date or time -> aware UTC datetime.

    A time without an offset is local time. A bare date means the start of
    that (local) day, or with end_of_day its last microsecond: `restore
    vm@2024-05-01` is the latest snapshot taken on or before that day.
    """
    s = text.strip() if isinstance(text, str) else ""
    if re.fullmatch(r"\d{4}-\d{2}-\d{2}", s):
        try:
            d = date.fromisoformat(s)
            return utc(datetime.combine(d, time.max if end_of_day else time.min))
        except (ValueError, OverflowError):  # no such day, or outside what datetime holds
            raise BadTime(text) from None
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}.*", s):
        raise BadTime(text)
    try:
        return utc(datetime.fromisoformat(s[:-1] + "+00:00" if s.endswith(("Z", "z")) else s))
    except (ValueError, OverflowError):
        raise BadTime(text) from None


# ---- records ------------------------------------------------------------------------
class DiskEntry(Fields):
    def __init__(self, root, size):
        self.root, self.size = root, size   # the disk's tree (Root) and its size in bytes

    def to_json(self):
        return {"root": self.root.to_json(), "size": self.size}

    @classmethod
    def from_json(cls, d):
        return cls(Root.from_json(d["root"]), int(d["size"]))


class Snapshot(Fields):
    """One archived state of one VM (or imported image): its disks at one time."""

    def __init__(self, id, name, uuid, time, disks=None, meta=None, added_bytes=0):
        self.id = id                  # None until the catalog adds it
        self.name, self.uuid = name, uuid
        self.time = time              # datetime
        self.disks = {} if disks is None else disks   # disk name -> DiskEntry
        self.meta = {} if meta is None else meta
        self.added_bytes = added_bytes

    @property
    def size(self):
        return sum(d.size for d in self.disks.values())

    def to_json(self):
        return {
            "id": self.id,
            "name": self.name,
            "uuid": self.uuid,
            "time": format_time(self.time),
            "disks": {k: v.to_json() for k, v in sorted(self.disks.items())},
            "meta": self.meta,
            "added_bytes": self.added_bytes,
        }

    @classmethod
    def from_json(cls, d):
        return cls(
            id=int(d["id"]),
            name=d["name"],
            uuid=d["uuid"],
            time=parse_time(d["time"]),
            disks={k: DiskEntry.from_json(v) for k, v in d["disks"].items()},
            meta=d.get("meta", {}),
            added_bytes=int(d.get("added_bytes", 0)),
        )


def _line(obj):
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False) + "\n"


class Catalog:
    """Every snapshot in the store; load the newest, add, commit."""

    def __init__(self):
        self._snaps = []  # in order of addition (the order of the lines)
        self._head = dict(HEADER_LINE)  # the header line's object, next_id aside
        self._lines = [_line(HEADER_LINE)]  # [0] is rewritten by serialize()
        self.next_id = 1  # the id the next add() gives; never lower than the greatest id + 1
        self._text = None  # bytes of the committed blob
        self._blob = None  # its Root
        self.generation = 0
        self.ref = None  # ref of the CATALOG record this was loaded from / committed as

    # ---- loading ---------------------------------------------------------------
    @classmethod
    def load(cls, store):
        """The newest catalog in the store's log, or an empty one."""
        cat = cls()
        ref = store.latest(CATALOG)
        if ref is None:
            return cat
        rec = store.read(ref)
        blob, generation, count, digest = _unpack_record(rec, store.ref_size)
        text = read_blob(store, blob)
        if hashlib.sha256(text).digest() != digest:
            raise CatalogCorrupt(f"the catalog blob of record {ref.hex()} does not match its SHA-256")
        cat._parse(text)
        if len(cat._snaps) != count:
            raise CatalogCorrupt(f"the catalog lists {len(cat._snaps)} snapshots, its record says {count}")
        cat._text, cat._blob, cat.generation, cat.ref = text, blob, generation, ref
        return cat

    def _parse(self, text):
        try:
            lines = text.decode("utf-8").splitlines(keepends=True)
        except UnicodeDecodeError:
            raise CatalogCorrupt("the catalog blob is not UTF-8") from None
        if not lines:
            raise CatalogCorrupt("the catalog blob is empty")
        try:
            head = json.loads(lines[0])
        except json.JSONDecodeError:
            raise CatalogCorrupt("the catalog header line is not JSON") from None
        if not isinstance(head, dict) or head.get("format") != HEADER_LINE["format"]:
            raise CatalogCorrupt("the catalog header line is not a Foundation catalog header")
        if head.get("version") != VERSION:
            raise CatalogTooNew(head.get("version"), VERSION)
        next_id = head.pop("next_id", 1)
        if type(next_id) is not int or next_id < 1:
            raise CatalogCorrupt(f"the catalog header's next_id {next_id!r} is not a positive integer")
        self._head = head
        self._lines = [lines[0]]
        for n, line in enumerate(lines[1:], 2):
            try:
                obj = json.loads(line)
                op = obj["op"]
            except (json.JSONDecodeError, KeyError, TypeError):
                raise CatalogCorrupt(f"catalog line {n} is not a catalog entry") from None
            if op != "add":
                raise CatalogTooNew(f"{VERSION} with operation {op!r}", VERSION)
            try:
                snap = Snapshot.from_json(obj)
            except (KeyError, TypeError, ValueError, BadInput, DataCorrupt) as e:
                raise CatalogCorrupt(f"catalog line {n} is malformed ({e})") from None
            self._snaps.append(snap)
            self._lines.append(line)
        # A writer that predates next_id may have added past it: never go below max + 1.
        self.next_id = max(next_id, self._max_id() + 1)

    def _max_id(self):
        return max((s.id for s in self._snaps), default=0)

    # ---- queries ---------------------------------------------------------------
    def snapshots(self, name=None):
        """Snapshots, oldest first (by time, then by id), of one name or all."""
        out = [s for s in self._snaps if name is None or s.name == name]
        return sorted(out, key=lambda s: (s.time, s.id))

    def names(self):
        return sorted({s.name for s in self._snaps})

    def get(self, sid):
        for s in self._snaps:
            if s.id == sid:
                return s
        raise NotFound(f"no snapshot with id {sid}")

    def find(self, name, when=None):
        """The latest snapshot of `name` whose time is not after `when` (None: the latest)."""
        snaps = self.snapshots(name)
        if not snaps:
            known = self.names()
            hint = f"Known names: {', '.join(known)}." if known else "The catalog is empty."
            raise UnknownName(name, hint)
        if when is None:
            return snaps[-1]
        when = utc(when)
        best = None
        for s in snaps:
            if s.time <= when:
                best = s
            else:
                break
        if best is None:
            raise TooEarly(name, format_time(when), format_time(snaps[0].time))
        return best

    def latest(self, name, when=None):
        """Like find, but None instead of an error."""
        try:
            return self.find(name, when)
        except NotFound:
            return None

    @property
    def blob(self):
        """The Root of the committed catalog blob (None before the first commit)."""
        return self._blob

    def live_roots(self):
        """Every tree root the listed snapshots keep alive, each once, in catalog order.

        Each disk's root, and every tree root in `meta` (any JSON object
        with exactly the keys ref, size and depth: the domain XML, the
        NVRAM blob, and whatever later writers add the same way). Roots with
        the null ref (all-zero images) are included; they reach no record.
        The catalog's own record and blob (`ref`, `blob`) are not: gc adds
        them itself. A malformed root raises CatalogCorrupt, so that gc
        never mistakes a damaged catalog for one that keeps less alive.
        """
        out, seen = [], set()

        def add(root):
            key = (root.ref, root.size, root.depth)
            if key not in seen:
                seen.add(key)
                out.append(root)

        for s in self._snaps:
            for entry in s.disks.values():
                add(entry.root)
            try:
                _meta_roots(s.meta, add)
            except DataCorrupt as e:
                raise CatalogCorrupt(f"snapshot {s.id} of {s.name!r} has a malformed root in its meta "
                                     f"({e.args[0] if e.args else e})") from None
        return out

    # ---- changes -----------------------------------------------------------------
    def add(self, snap):
        """Add a snapshot (id assigned here); it is durable only after commit()."""
        check_name(snap.name)
        snap.time = utc(snap.time)
        for s in self._snaps:
            if s.name == snap.name and s.time == snap.time:
                raise DuplicateSnapshot(snap.name, format_time(snap.time), s.id)
        snap.id = self.next_id
        line = _line({"op": "add", **snap.to_json()})
        self._snaps.append(snap)
        self._lines.append(line)
        self.next_id += 1
        return snap

    def forget(self, ids):
        """Take the snapshots with these ids out of the list -> them, oldest first.

        All or nothing: an id not in the catalog raises NotFound and nothing
        is taken out. Like add(), the change is durable only after commit(),
        which writes a new generation of the blob without their lines; the
        ids stay used (next_id does not move back).
        """
        want = set(ids)
        known = {s.id for s in self._snaps}
        missing = sorted(want - known)
        if missing:
            raise NotFound(f"no snapshot with id {', '.join(map(str, missing))} in the catalog")
        gone = [s for s in self._snaps if s.id in want]
        keep = [(s, line) for s, line in zip(self._snaps, self._lines[1:]) if s.id not in want]
        self._snaps = [s for s, _ in keep]
        self._lines = self._lines[:1] + [line for _, line in keep]
        return sorted(gone, key=lambda s: (s.time, s.id))

    def serialize(self):
        head = dict(self._head)
        if self.next_id != self._max_id() + 1:  # only then: the header stays put as lines are added
            head["next_id"] = self.next_id
        self._lines[0] = _line(head)
        return "".join(self._lines).encode("utf-8")

    def commit(self, store):
        """Archive this catalog after everything it points to; then sync. -> record ref."""
        text = self.serialize()
        blob = write_blob(store, text, prev=self._blob, prev_data=self._text)
        gen = self.generation + 1
        now = datetime.now(timezone.utc)
        us = (now - datetime(1970, 1, 1, tzinfo=timezone.utc)) // timedelta(microseconds=1)
        rec = (RECORD.pack(MAGIC, VERSION, store.ref_size, blob.depth, blob.size, gen, len(self._snaps), us)
               + blob.ref + hashlib.sha256(text).digest())
        ref = store.write(rec, btype=CATALOG)
        store.sync()
        self._text, self._blob, self.generation, self.ref = text, blob, gen, ref
        return ref


def _meta_roots(obj, add):
    """Call add(Root) for every tree root in a JSON value (the rule of format.md §11.2)."""
    if isinstance(obj, dict):
        if set(obj) == {"ref", "size", "depth"} and isinstance(obj["ref"], str):
            add(Root.from_json(obj))
            return
        for v in obj.values():
            _meta_roots(v, add)
    elif isinstance(obj, list):
        for v in obj:
            _meta_roots(v, add)


def _unpack_record(rec, ref_size):
    """CATALOG record -> (blob Root, generation, count, sha256)."""
    rec = bytes(rec)
    if len(rec) < RECORD.size or rec[:8] != MAGIC:
        raise CatalogCorrupt("the newest CATALOG record has no catalog magic")
    magic, version, rs, depth, size, gen, count, _us = RECORD.unpack_from(rec)
    if version != VERSION:
        raise CatalogTooNew(version, VERSION)
    if rs != ref_size:
        raise CatalogCorrupt(f"the catalog record has {rs}-byte refs, the store {ref_size}-byte refs")
    end = RECORD.size + rs + HASH_SIZE
    if len(rec) < end:
        raise CatalogCorrupt("the catalog record is truncated")
    if any(rec[end:]):
        raise CatalogCorrupt("the catalog record has bytes after its end")
    ref = rec[RECORD.size:RECORD.size + rs]
    return Root(ref, size, depth), gen, count, rec[RECORD.size + rs:end]


__all__ = [
    "Catalog",
    "CatalogCorrupt",
    "DiskEntry",
    "DuplicateSnapshot",
    "Snapshot",
    "TooEarly",
    "UnknownName",
    "check_name",
    "format_time",
    "parse_time",
]
