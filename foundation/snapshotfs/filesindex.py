"""The file listings `find` searches: one row per version of a path, kept for a run of days.

A path that stays the same for a year of nightly snapshots is one row
(first and last position in its disk's chain of snapshots), so a search
reads versions, not days. A new snapshot is indexed from the previous
indexed snapshot of the same disk with changes.compare_disks, which reads
only what the image trees say changed; an identical disk costs one
UPDATE. The index is derived data, rebuilt from the archive on demand, so
it lives on the host (state_dir/files/<store uuid>.sqlite, mode 0600),
not in the store, which holds only encrypted and authenticated records:
the host already holds the VMs' disks and the key in the clear, and a
lost or stale index costs only the time to rebuild it. The SQL schema is
in docs/format.md ("File listings").

A night that changed nothing where the file systems lie costs no file
system reader at all: each indexed disk keeps the byte ranges its listing
was decided from (every byte the readers read, and the span of every file
system found), and a next day whose changed ranges (treediff.py, from the
image trees alone) miss all of them reads, by construction, the same bytes
and so lists the same files. Only file systems whose span on the disk is
known (read by TSK from a partition or the bare disk) allow that; any
other disk is compared as before.
"""

import bisect
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import sqlite3

from foundation.catalog import format_time
from foundation.errors import DataCorrupt, FilesUnreadable, UsageError
from foundation.snapshotfs.treediff import _merge, changed_ranges

# The file-system readers (changes.py, foundation.guestfs: pytsk3, dissect) are
# imported only when a disk must really be read, not on a night that skips them.

log = logging.getLogger(__name__)

# The readers' read-ahead through the image tree when listing: they read metadata (superblocks,
# inode tables, directories) in 64 KiB chunks, never file contents, and a run of them grew the
# window to 8 MiB, read in log order into 4 MiB spans: a night whose change met the looked ranges
# peaked ~40 MB above the others for it (benchmarks/README.md, "peak memory of `archive`"),
# for the same listing time. Below the reader's LOG_ORDER_MIN, reads go through the block cache.
READAHEAD = 512 << 10

FORMAT = 1
SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS snaps (sid INTEGER, disk TEXT, vm TEXT, time TEXT, root TEXT,
    seq INTEGER, error TEXT, PRIMARY KEY (sid, disk));
CREATE TABLE IF NOT EXISTS files (vm TEXT, disk TEXT, part TEXT, path TEXT, name TEXT,
    first INTEGER, last INTEGER, size INTEGER, type TEXT, changed INTEGER);
CREATE INDEX IF NOT EXISTS files_name ON files (name);
CREATE INDEX IF NOT EXISTS files_path ON files (vm, disk, part, path, last);
CREATE INDEX IF NOT EXISTS files_open ON files (vm, disk, last);
CREATE TABLE IF NOT EXISTS looked (sid INTEGER, disk TEXT, root TEXT, ranges TEXT, PRIMARY KEY (sid, disk));
"""


class FilesIndex:
    """The listing database of one store, opened (and created) under `state_dir`."""

    def __init__(self, state_dir, store_uuid):
        self._known = {}
        d = os.path.join(state_dir, "files")
        self.path = os.path.join(d, f"{store_uuid}.sqlite")
        try:
            os.makedirs(d, mode=0o700, exist_ok=True)
            os.close(os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600))
        except OSError as e:
            raise UsageError(f"cannot keep the file listings in {d}: {e.strerror or e}; "
                             "pass --state-dir DIR or set FOUNDATION_STATE_DIR") from None
        try:
            self._open()
        except (sqlite3.DatabaseError, ValueError) as e:
            # Derived data: a damaged file is dropped and built again.
            log.warning("file listings %s unreadable (%s): rebuilding them", self.path, e)
            if getattr(self, "db", None) is not None:
                self.db.close()
            for p in (self.path, self.path + "-wal", self.path + "-shm"):  # its log goes with it
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(p)
            self._open()

    def _open(self):
        self.db = sqlite3.connect(self.path, timeout=60)
        # Write-ahead log, synced at its checkpoints only: a commit waits for no fsync (the
        # rollback journal took two a commit, each waiting behind whatever else the disk had
        # queued). A power cut may lose the newest commits, never the file's consistency; the
        # next update indexes their snapshots again.
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(SCHEMA)
        got = self.db.execute("SELECT value FROM meta WHERE key = 'format'").fetchone()
        if got is None or got[0] != str(FORMAT):
            self.clear()

    def close(self):
        self.db.close()

    def clear(self):
        """Forget everything: the next update indexes every snapshot again."""
        with self.db:
            self.db.execute("DELETE FROM files")
            self.db.execute("DELETE FROM snaps")
            self.db.execute("DELETE FROM looked")
            self.db.execute("INSERT OR REPLACE INTO meta VALUES ('format', ?)", (str(FORMAT),))

    # ---- building --------------------------------------------------------------------
    def update(self, store, catalog, names=None, known=None):
        """Index every snapshot of `names` (default all) not indexed yet; -> number indexed.

        One process at a time (the archive's update and a `find` may meet):
        the other waits on the lock file beside the database. `known` maps
        (root a, root b), as `_root` names them, to the merged [(offset,
        length)] outside which tree b is tree a's (the writer's own word, e.g.
        `archive`'s: the blocks it re-read and zeroed): such a pair is not
        diffed, and a listing that takes the shortcut reads nothing of the
        store (`archive` hands a store that opens only when first used).
        """
        self._cat = catalog
        self._known = known or {}
        n = 0
        fd = os.open(self.path + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            for vm in names or catalog.names():
                snaps = catalog.snapshots(vm)
                for disk in sorted({d for s in snaps for d in s.disks}):
                    n += self._update_chain(store, vm, disk, [s for s in snaps if disk in s.disks])
        finally:
            os.close(fd)
        return n

    def _update_chain(self, store, vm, disk, chain):
        rows = {sid: (root, seq, err) for sid, root, seq, err in self.db.execute(
            "SELECT sid, root, seq, error FROM snaps WHERE vm = ? AND disk = ?", (vm, disk))}
        todo = [s for s in chain if s.id not in rows]
        if not todo:
            return 0
        done = [s for s in chain if s.id in rows]
        stale = any(rows[s.id][0] != _root(s, disk) for s in done)
        if stale or (done and (todo[0].time, todo[0].id) < (done[-1].time, done[-1].id)):
            # A snapshot landed before indexed ones, or a root changed (gc in value
            # mode renames blocks): index this disk's chain again from the start.
            with self.db:
                self.db.execute("DELETE FROM files WHERE vm = ? AND disk = ?", (vm, disk))
                self.db.execute("DELETE FROM looked WHERE disk = ? AND sid IN "
                                "(SELECT sid FROM snaps WHERE vm = ? AND disk = ?)", (disk, vm, disk))
                self.db.execute("DELETE FROM snaps WHERE vm = ? AND disk = ?", (vm, disk))
            rows, todo, done = {}, chain, []
        prev = next((s for s in reversed(done) if rows[s.id][2] is None), None)
        seq = max((r[1] for r in rows.values() if r[1] is not None), default=-1) + 1
        sides = {}
        for s in todo:
            prev_seq = rows[prev.id][1] if prev else None
            if (prev is not None and self._unchanged(store, vm, disk, s, prev, prev_seq, seq)
                    or self._index_one(store, vm, disk, s, prev, prev_seq, seq, sides)):
                rows[s.id] = (_root(s, disk), seq, None)
                prev, seq = s, seq + 1
            for k in [k for k in sides if prev is None or k[0] != prev.id]:
                del sides[k]           # keep only the walk the next night is compared with
        return len(todo)

    def _unchanged(self, store, vm, disk, snap, prev, prev_seq, seq):
        """Index `snap` as `prev` again if nothing its listing was read from changed; -> whether it was."""
        a, b = prev.disks[disk], snap.disks[disk]
        got = self.db.execute("SELECT ranges FROM looked WHERE sid = ? AND disk = ? AND root = ?",
                              (prev.id, disk, _root(prev, disk))).fetchone()
        if got is None or a.size != b.size:
            return False
        changed = self._known.get((_root(prev, disk), _root(snap, disk)))
        if _meet(changed_ranges(store, a.root, b.root) if changed is None else changed, json.loads(got[0])):
            return False
        with self.db:
            self.db.execute("UPDATE files SET last = ? WHERE vm = ? AND disk = ? AND first <= ? AND last >= ?",
                            (seq, vm, disk, prev_seq, prev_seq))
            self.db.execute("INSERT INTO snaps VALUES (?, ?, ?, ?, ?, ?, NULL)",
                            (snap.id, disk, vm, format_time(snap.time), _root(snap, disk), seq))
            # the same bytes read give the same reads: what was looked at is looked at again
            self.db.execute("INSERT OR REPLACE INTO looked VALUES (?, ?, ?, ?)",
                            (snap.id, disk, _root(snap, disk), got[0]))
        return True

    def _index_one(self, store, vm, disk, snap, prev, prev_seq, seq, sides):
        """Index one snapshot's disk against `prev` (at prev_seq); False if it could not be read."""
        from foundation.snapshotfs.changes import TreeSource, snapshot_changes

        def source(s, d):
            return TreeSource(store, s.disks[d], record=s is snap, readahead=READAHEAD)   # what snap's listing is read from

        try:
            changes = snapshot_changes(source, prev, snap, disk, store, sides)
            new = [self._row(store, snap, disk, c, prev_seq, seq) for c in changes
                   if c.after is not None and (c.content or c.before is None)]
            looked = _looked(sides.get((snap.id, disk)))
        except FilesUnreadable as e:
            log.warning("%s", e)
            with self.db:
                self.db.execute("INSERT INTO snaps VALUES (?, ?, ?, ?, ?, NULL, ?)",
                                (snap.id, disk, vm, format_time(snap.time), _root(snap, disk), str(e)))
            return False
        with self.db:
            if prev is not None:
                # everything alive at prev lives on, then what changed or went is cut back
                self.db.execute("UPDATE files SET last = ? WHERE vm = ? AND disk = ? AND first <= ? AND last >= ?",
                                (seq, vm, disk, prev_seq, prev_seq))
                gone = [(prev_seq, vm, disk, c.partition, c.path, seq) for c in changes
                        if c.before is not None and (c.after is None or c.content)]
                self.db.executemany("UPDATE files SET last = ? WHERE vm = ? AND disk = ? AND part = ? "
                                    "AND path = ? AND last = ?", gone)
            self.db.executemany("INSERT INTO files VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", new)
            self.db.execute("INSERT INTO snaps VALUES (?, ?, ?, ?, ?, ?, NULL)",
                            (snap.id, disk, vm, format_time(snap.time), _root(snap, disk), seq))
            if looked is not None:
                self.db.execute("INSERT OR REPLACE INTO looked VALUES (?, ?, ?, ?)",
                                (snap.id, disk, _root(snap, disk), looked))
        return True

    def _row(self, store, snap, disk, c, prev_seq, seq):
        from foundation.snapshotfs.changes import kind_of, size_of

        e, vm = c.after, snap.name
        changed = True
        if c.before is None and prev_seq is not None:
            changed = self._differs_from_last_seen(store, snap, disk, c)
        name = c.path.rsplit("/", 1)[-1]
        return (vm, disk, c.partition, c.path, name, seq, seq, size_of(e), kind_of(e), int(changed))

    def _differs_from_last_seen(self, store, snap, disk, c):
        """A path back after a gap: compare it with the version seen last (True if unknown)."""
        from foundation.snapshotfs.changes import Side, TreeSource, find_entry, kind_of, label, size_of, unreadable
        from foundation.snapshotfs.volumes import ReadFailed, scrub

        vm = snap.name
        got = self.db.execute(
            "SELECT f.last, f.size, f.type, s.sid FROM files f JOIN snaps s ON s.vm = f.vm AND s.disk = f.disk "
            "AND s.seq = f.last WHERE f.vm = ? AND f.disk = ? AND f.part = ? AND f.path = ? "
            "ORDER BY f.last DESC LIMIT 1", (vm, disk, c.partition, c.path)).fetchone()
        if got is None:
            return True
        _, size, kind, sid = got
        if kind != kind_of(c.after) or size != size_of(c.after):
            return True
        if kind == "dir":
            return False
        old = next((s for s in self._cat.snapshots(vm) if s.id == sid), None)
        if old is None or kind != "file":
            return True
        try:
            side = Side(TreeSource(store, old.disks[disk], readahead=READAHEAD), f"{label(old)} disk {disk}")
            vol = side.volumes().get(c.partition)
            e = find_entry(vol, c.path) if vol is not None else None
            if e is None or e.size != c.after.size:
                return True
            then = _digest(vol, e)
        except (ReadFailed, DataCorrupt, FilesUnreadable) as err:
            scrub(err)
            return True                     # the old version cannot be read: say changed
        try:
            return _digest(c.volumes[1], c.after) != then
        except (ReadFailed, DataCorrupt) as err:
            raise unreadable(f"{label(snap)} disk {disk}", err) from None

    # ---- searching -------------------------------------------------------------------
    def errors(self, names=None):
        """[(vm, time, sid, disk, message)] of snapshots whose file systems could not be read."""
        q = "SELECT vm, time, sid, disk, error FROM snaps WHERE error IS NOT NULL ORDER BY vm, time, disk"
        return [r for r in self.db.execute(q) if names is None or r[0] in names]

    def search(self, pattern, live, names=None, since=None, until=None):
        """Yield (vm, time, sid, disk, part, path, size, type, changed) for every day a match existed.

        `pattern` is a glob (`*`, `?`, `[...]`) matched against the file's
        name, or against its whole path when it contains a slash. `live`:
        the ids of the snapshots still in the catalog (forgotten ones are skipped);
        `since`, `until`: times in the catalog's format (compared as text, which
        orders them), or None.
        """
        col = "path" if "/" in pattern else "name"
        pos = {}
        for vm, disk, seq, sid, t in self.db.execute(
                "SELECT vm, disk, seq, sid, time FROM snaps WHERE seq IS NOT NULL"):
            pos[(vm, disk, seq)] = (sid, t)
        out = []
        for vm, disk, part, path, first, last, size, kind, changed in self.db.execute(
                f"SELECT vm, disk, part, path, first, last, size, type, changed FROM files WHERE {col} GLOB ?",
                (pattern,)):
            if names is not None and vm not in names:
                continue
            first_seen = True
            for seq in range(first, last + 1):
                at = pos.get((vm, disk, seq))
                if at is not None and at[0] in live and not (since and at[1] < since or until and at[1] > until):
                    out.append((vm, at[1], at[0], disk, part, path, size, kind, bool(changed) and first_seen))
                    first_seen = False
        out.sort(key=lambda r: (r[0], r[1], r[3], r[4], r[5]))
        return out


def _looked(side):
    """JSON [[offset, length], ...] of the disk bytes `side`'s listing was decided from, or None.

    Every byte its readers read (the partition table, superblocks, journal,
    the walk), and the whole span of each file system found, since a change
    anywhere inside a file system may change its files. None when a file
    system's span is unknown (not read by TSK from a slice of this disk) or
    one failed to open: such a disk is always compared.
    """
    if side is None or side.source.seen is None or side.files.failed:
        return None
    spans = []
    for v in side.volumes().values():
        sp = side.span(v)
        if sp is None:
            return None
        spans.append((sp[0], sp[1] - sp[0]))
    return json.dumps(_merge(side.source.seen + spans), separators=(",", ":"))


def _meet(changed, looked):
    """Whether any range of `changed` overlaps one of `looked` (both sorted, merged [(offset, length)])."""
    starts = [o for o, _ in looked]
    for o, n in changed:
        i = bisect.bisect_right(starts, o + n - 1) - 1     # the last looked range starting inside or before
        if i >= 0 and looked[i][0] + looked[i][1] > o:
            return True
    return False


def _digest(vol, e):
    """SHA-256 of a file's bytes, read one side at a time (so a failure names its day)."""
    from foundation.snapshotfs.changes import READ

    h = hashlib.sha256()
    f = vol.open_file(e.addr)
    for off in range(0, e.size, READ):
        h.update(vol.read_file(f, off, READ, e.size))
    return h.digest()


def _root(snap, disk):
    return tree_key(snap.disks[disk].root)


def tree_key(r):
    """How the listings name a tree (a Root)."""
    return f"{r.ref.hex()}:{r.size}:{r.depth}"
