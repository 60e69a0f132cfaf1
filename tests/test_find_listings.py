"""The file listings `find` searches, added night by night as `archive` does, against a rebuild from scratch.

A night whose changes miss every byte the listing was read from (the
partition table, the superblocks, each file system's span) is listed
without opening a file system; the result must be exactly the listing
made by comparing the file systems, which the same days indexed with that
shortcut turned off give.
"""

import os

import pytest
import snapshotfs_support as T
from guest_days import MIB, GuestDisk, GuestFS, rnd


def _poke(path, offset, data):
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def _tables(path):
    import sqlite3

    db = sqlite3.connect(path)
    try:
        files = sorted(db.execute("SELECT vm, disk, part, path, name, first, last, size, type, changed FROM files"))
        snaps = sorted(db.execute("SELECT sid, disk, vm, time, root, seq, error FROM snaps"))
    finally:
        db.close()
    return files, snaps


def _update(arch, state):
    from foundation.catalog import Catalog
    from foundation.snapshotfs.filesindex import FilesIndex
    from foundation.store import Store

    with Store.open(arch.store_path, key_file=arch.key_file) as s:
        idx = FilesIndex(state, s.uuid)
        try:
            n = idx.update(s, Catalog.load(s), ["web"])
        finally:
            idx.close()
        return n, idx.path


@pytest.mark.parametrize("mode", ["hash", "value"])
def test_nights_outside_the_file_systems_are_listed_without_reading_them(tmp_path, monkeypatch, mode):
    from foundation.snapshotfs import filesindex

    w = str(tmp_path)
    arch = T.StoreArchiver(f"{w}/archive", mode=mode)
    ext = GuestFS("ext4", f"{w}/ext.img", 16 * MIB, {"a.txt": b"day 0\n", "sub/b.bin": rnd(100_000, 1)})
    fat = GuestFS("vfat", f"{w}/fat.img", 8 * MIB, {"README.TXT": b"fat\n"})
    vda = GuestDisk(f"{w}/vda.img", 48 * MIB, [ext, fat], "gpt")      # ends at 26 MiB: 21 MiB free after
    vdb = f"{w}/vdb.img"                                                # no file system at all
    with open(vdb, "wb") as f:
        f.write(rnd(16 * MIB, 2))
    opened = []
    real = filesindex.FilesIndex._index_one

    def index_one(self, store, vm, disk, snap, *a):
        opened.append((disk, snap.time.day))
        return real(self, store, vm, disk, snap, *a)

    monkeypatch.setattr(filesindex.FilesIndex, "_index_one", index_one)
    state = f"{w}/state"

    def night(day):
        vda.sync()
        arch.add("web", T.utc(2026, 10, day), {"vda": vda.path, "vdb": vdb})
        return _update(arch, state)

    night(1)
    _poke(vda.path, 30 * MIB, rnd(MIB, 3))            # free space after the partitions
    _poke(vdb, 8 * MIB, rnd(MIB, 4))
    night(2)
    ext.write("a.txt", b"day 3, longer than before\n")
    _poke(vda.path, 40 * MIB, rnd(MIB, 5))
    night(3)
    night(4)                                          # nothing changed
    fat.write("NEW.TXT", b"new\n")
    _poke(vdb, 0, rnd(4096, 6))                       # where a partition table or superblock would be
    night(5)
    assert opened == [("vda", 1), ("vdb", 1), ("vda", 3), ("vda", 5), ("vdb", 5)]

    # the same days indexed the slow way, from scratch: the same listing
    monkeypatch.setattr(filesindex.FilesIndex, "_unchanged", lambda *a: False)
    n, path = _update(arch, f"{w}/rebuilt")
    assert n == 10
    got, want = _tables(os.path.join(state, "files", os.path.basename(path))), _tables(path)
    assert got == want
    files, snaps = got
    assert all(e is None for *_, e in snaps) and len(snaps) == 10
    a = [(first, last, size) for _, disk, _, p, *_r in files if p == "/a.txt"
         for first, last, size in [(_r[1], _r[2], _r[3])]]
    assert a == [(0, 1, 6), (2, 4, 26)]               # seq 0-1 the old a.txt, 2-4 the new one
    assert {p for _, d, _, p, *_ in files if d == "vdb"} == set()


def test_a_disk_whose_file_system_cannot_be_spanned_is_always_compared(tmp_path, monkeypatch):
    """_looked gives no ranges when a file system failed to open: the next night reads the disk again."""
    from foundation.snapshotfs import filesindex

    class Side:
        class files:
            failed = {"p1": "damaged"}

        class source:
            seen = [(0, 4096)]

    assert filesindex._looked(Side) is None
    assert filesindex._looked(None) is None
    assert filesindex._meet([(10, 5)], [[0, 10], [20, 5]]) is False
    assert filesindex._meet([(10, 11)], [[0, 10], [20, 5]]) is True
    assert filesindex._meet([(9, 1)], [[0, 10]]) is True
    assert filesindex._meet([], [[0, 10]]) is False


def test_a_night_told_its_changes_reads_nothing_of_the_store(tmp_path, monkeypatch):
    """`archive` tells the listing which ranges each new tree changed (`known`): a night that misses
    the looked ranges is listed from the database alone (no tree diff, no store use at all); one
    that meets them is read; the result is the listing a rebuild from scratch gives."""
    from foundation.catalog import Catalog
    from foundation.snapshotfs import filesindex
    from foundation.snapshotfs.filesindex import FilesIndex, tree_key
    from foundation.store import Store

    w = str(tmp_path)
    arch = T.StoreArchiver(f"{w}/archive")
    ext = GuestFS("ext4", f"{w}/ext.img", 16 * MIB, {"a.txt": b"day 0\n"})
    vda = GuestDisk(f"{w}/vda.img", 32 * MIB, [ext], "gpt")
    vdb = f"{w}/vdb.img"
    with open(vdb, "wb") as f:
        f.write(rnd(16 * MIB, 2))
    state = f"{w}/state"
    opened = []
    real = FilesIndex._index_one

    def index_one(self, store, vm, disk, snap, *a):
        opened.append((disk, snap.time.day))
        return real(self, store, vm, disk, snap, *a)

    monkeypatch.setattr(FilesIndex, "_index_one", index_one)

    class NoStore:
        def __getattr__(self, name):
            raise AssertionError(f"the store was used ({name})")

    def night(day, pokes):
        for path, off, n in pokes:
            _poke(path, off, rnd(n, day))
        vda.sync()
        arch.add("web", T.utc(2026, 10, day), {"vda": vda.path, "vdb": vdb})
        with Store.open(arch.store_path, key_file=arch.key_file) as s:
            cat = Catalog.load(s)
            a, b = cat.snapshots("web")[-2:] if day > 1 else (None, None)
            known = {} if a is None else {
                (tree_key(a.disks[d].root), tree_key(b.disks[d].root)): [(o, n) for p, o, n in pokes if p == path]
                for d, path in (("vda", vda.path), ("vdb", vdb))}
            idx = FilesIndex(state, s.uuid)
            try:
                return idx.update(s if any(o < 8 * MIB for _, o, _ in pokes) or day == 1 else NoStore(),
                                  cat, ["web"], known), idx.path
            finally:
                idx.close()

    night(1, [])
    monkeypatch.setattr(filesindex, "changed_ranges", lambda *a: pytest.fail("diffed a pair it was told about"))
    assert night(2, [(vda.path, 30 * MIB, MIB), (vdb, 8 * MIB, MIB)])[0] == 2     # past the partitions
    assert night(3, [])[0] == 2                                                     # nothing changed
    n, path = night(4, [(vdb, 0, 4096)])                                            # where a probe reads
    assert n == 2 and opened == [("vda", 1), ("vdb", 1), ("vdb", 4)]

    monkeypatch.undo()        # the same days indexed the slow way, from scratch
    monkeypatch.setattr(FilesIndex, "_unchanged", lambda *a: False)
    with Store.open(arch.store_path, key_file=arch.key_file) as s:
        idx = FilesIndex(f"{w}/rebuilt", s.uuid)
        try:
            assert idx.update(s, Catalog.load(s), ["web"]) == 8
        finally:
            idx.close()
    assert _tables(path) == _tables(idx.path)


def test_the_listings_commit_without_fsync_and_a_damaged_one_goes_with_its_log(tmp_path):
    """The database keeps a write-ahead log synced at checkpoints only (a night's update waits for
    no fsync); its log files are the database's mode, and a damaged database is rebuilt with its
    log removed, not replayed into the new one."""
    import sqlite3
    import stat

    from foundation.snapshotfs.filesindex import FORMAT, FilesIndex

    idx = FilesIndex(str(tmp_path), "u1")
    try:
        assert idx.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert idx.db.execute("PRAGMA synchronous").fetchone()[0] == 1      # NORMAL
        with idx.db:
            idx.db.execute("INSERT INTO snaps VALUES (7, 'vda', 'web', 't', 'r', 0, NULL)")
        wal = idx.path + "-wal"
        assert os.path.getsize(wal) > 0 and stat.S_IMODE(os.stat(wal).st_mode) == 0o600
    finally:
        idx.close()
    assert not os.path.exists(idx.path + "-wal")          # checkpointed into the file at close
    assert sqlite3.connect(idx.path).execute("SELECT sid FROM snaps").fetchall() == [(7,)]
    # a damaged database beside a log of another: both dropped, the listings start again
    with open(idx.path, "r+b") as f:
        f.write(b"not a database" * 8)
    with open(idx.path + "-wal", "wb") as f:
        f.write(os.urandom(4096))
    idx = FilesIndex(str(tmp_path), "u1")
    try:
        assert idx.db.execute("SELECT value FROM meta WHERE key = 'format'").fetchone()[0] == str(FORMAT)
        assert idx.db.execute("SELECT count(*) FROM snaps").fetchone()[0] == 0
    finally:
        idx.close()
