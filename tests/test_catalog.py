"""The system catalog: persistence in the log, TimeLine lookup, crash and rebuild."""

from datetime import datetime, timedelta, timezone

import pytest
from test_image_support import BS, MemStore, make_store, open_store

from foundation.catalog import (Catalog, CatalogCorrupt, DiskEntry, DuplicateSnapshot, Snapshot, TooEarly,
                                UnknownName, format_time, parse_time)
from foundation.catalog import BadName, BadTime
from foundation.image import BytesSource, Root, write_image

T0 = datetime(2024, 5, 1, 2, 0, tzinfo=timezone.utc)


@pytest.fixture(params=["hash", "value"])
def spath(request, tmp_path):
    return make_store(tmp_path / "store", mode=request.param)


def snap(store, name, t, data=b"", meta=None):
    root = write_image(store, BytesSource(data), len(data)) if data else Root(store.null_ref, 0, 0)
    return Snapshot(None, name, f"uuid-{name}", t, {"vda": DiskEntry(root, len(data))}, meta or {}, len(data))


def test_empty_store_has_empty_catalog(spath):
    with open_store(spath, writable=False) as s:
        cat = Catalog.load(s)
    assert cat.snapshots() == [] and cat.names() == []
    with pytest.raises(UnknownName, match="The catalog is empty"):
        cat.find("vm")


def test_commit_and_load_round_trip(spath):
    with open_store(spath) as s:
        cat = Catalog.load(s)
        for day in range(5):
            for name in ("alpha", "beta"):
                cat.add(snap(s, name, T0 + timedelta(days=day), bytes([day + 1]) * BS,
                             meta={"xml": "<domain/>", "day": day}))
            cat.commit(s)
    with open_store(spath, writable=False) as s:
        cat = Catalog.load(s)
        assert cat.generation == 5
        assert cat.names() == ["alpha", "beta"]
        snaps = cat.snapshots("beta")
        assert [x.time for x in snaps] == [T0 + timedelta(days=d) for d in range(5)]
        assert [x.meta["day"] for x in snaps] == list(range(5))
        assert all(x.time.tzinfo == timezone.utc for x in snaps)
        assert len({x.id for x in cat.snapshots()}) == 10
        from foundation.image import ImageReader

        x = cat.find("alpha", T0 + timedelta(days=3, hours=5))
        assert ImageReader(s, x.disks["vda"].root).read(0, BS) == bytes([4]) * BS


def test_timeline_lookup(spath):
    with open_store(spath) as s:
        cat = Catalog.load(s)
        times = [T0, T0 + timedelta(hours=20), T0 + timedelta(days=3)]
        for t in reversed(times):  # added out of order: lookup goes by time
            cat.add(snap(s, "vm", t))
        cat.commit(s)
    with open_store(spath, writable=False) as s:
        cat = Catalog.load(s)
    assert cat.find("vm").time == times[2]
    assert cat.find("vm", times[0]).time == times[0]  # exactly at: that one
    assert cat.find("vm", times[1] - timedelta(microseconds=1)).time == times[0]
    assert cat.find("vm", times[2] + timedelta(days=400)).time == times[2]
    assert cat.find("vm", parse_time("2024-05-02", end_of_day=True)).time == times[1]
    with pytest.raises(TooEarly, match=r"'vm' has no snapshot at or before 2024-05-01T01:59:59.999999Z; "
                                       r"its first snapshot is from 2024-05-01T02:00:00.000000Z"):
        cat.find("vm", T0 - timedelta(microseconds=1))
    with pytest.raises(UnknownName, match=r"No snapshots of 'nosuch' in the catalog. Known names: vm."):
        cat.find("nosuch")


def test_duplicates_and_bad_names_are_refused(spath):
    with open_store(spath) as s:
        cat = Catalog.load(s)
        cat.add(snap(s, "vm", T0))
        with pytest.raises(DuplicateSnapshot, match="already has a snapshot at 2024-05-01T02:00:00"):
            cat.add(snap(s, "vm", T0))
        for bad in ["", "a/b", "a@b", " lead", "tab\tname", "x" * 201]:
            with pytest.raises(BadName):
                cat.add(snap(s, bad, T0 + timedelta(days=1)))


def test_newest_catalog_is_the_last_catalog_record(spath):
    with open_store(spath) as s:
        cat = Catalog.load(s)
        refs = []
        for i in range(3):
            cat.add(snap(s, "vm", T0 + timedelta(days=i)))
            refs.append(cat.commit(s))
        assert s.latest(3) == refs[-1]
        # data written after the last commit does not hide the catalog
        write_image(s, BytesSource(b"z" * BS * 3), BS * 3)
        assert s.latest(3) == refs[-1]


def test_uncommitted_additions_vanish_after_a_crash(spath):
    with open_store(spath) as s:
        cat = Catalog.load(s)
        cat.add(snap(s, "vm", T0, b"a" * BS))
        cat.commit(s)
    s = open_store(spath)
    cat = Catalog.load(s)
    cat.add(snap(s, "vm", T0 + timedelta(days=1), b"b" * BS))
    s.close(clean=False)  # no sync after the addition: as if the power went
    with open_store(spath, writable=False) as s:
        cat = Catalog.load(s)
        assert [x.time for x in cat.snapshots()] == [T0]


def test_catalog_found_after_rebuild(spath):
    from foundation.store.rebuild import rebuild

    with open_store(spath) as s:
        cat = Catalog.load(s)
        for i in range(40):  # enough records to seal several arenas
            cat.add(snap(s, f"vm{i % 3}", T0 + timedelta(hours=i), bytes([i]) * (BS * 20)))
            cat.commit(s)
        want = [x.to_json() for x in cat.snapshots()]
    import os
    import shutil

    for f in ("index", "bloom", "bloom.json"):
        p = os.path.join(spath, f)
        if os.path.exists(p):
            os.unlink(p)
    shutil.rmtree(os.path.join(spath, "summaries"))
    os.mkdir(os.path.join(spath, "summaries"))
    with open_store(spath) as s:
        rebuild(s)
    with open_store(spath, writable=False) as s:
        assert [x.to_json() for x in Catalog.load(s).snapshots()] == want


def test_commit_rewrites_only_the_tail():
    s = MemStore("value")
    cat = Catalog.load(s)
    for i in range(300):
        cat.add(snap(s, "vm", T0 + timedelta(days=i), meta={"xml": "<domain>" + "x" * 300 + "</domain>"}))
    cat.commit(s)
    assert len(cat.serialize()) > 30 * BS
    before = s.bytes_written
    cat.add(snap(s, "vm", T0 + timedelta(days=1000)))
    cat.commit(s)
    # the new line's block(s), the path above them and the CATALOG record
    assert s.bytes_written - before <= 6 * BS
    cat2 = Catalog.load(s)
    assert len(cat2.snapshots()) == 301


def test_damaged_catalog_is_reported():
    s = MemStore("hash")
    cat = Catalog.load(s)
    cat.add(snap(s, "vm", T0))
    ref = cat.commit(s)
    rec = bytearray(s.blocks[ref][1])
    rec[-1] ^= 1  # the blob's SHA-256
    s.blocks[ref] = (3, bytes(rec))
    with pytest.raises(CatalogCorrupt, match="does not match its SHA-256"):
        Catalog.load(s)
    rec[:8] = b"garbage!"
    s.blocks[ref] = (3, bytes(rec))
    with pytest.raises(CatalogCorrupt, match="no catalog magic"):
        Catalog.load(s)


def test_parse_time():
    assert parse_time("2024-05-01T13:30:00Z") == datetime(2024, 5, 1, 13, 30, tzinfo=timezone.utc)
    assert parse_time("2024-05-01T15:30:00+02:00") == datetime(2024, 5, 1, 13, 30, tzinfo=timezone.utc)
    assert parse_time("2024-05-01 13:30Z") == datetime(2024, 5, 1, 13, 30, tzinfo=timezone.utc)
    assert parse_time("2024-05-01T13:30:00.25Z").microsecond == 250000
    d = parse_time("2024-05-01", end_of_day=True)
    assert d - parse_time("2024-05-01") == timedelta(days=1, microseconds=-1)
    for bad in ["yesterday", "2024-13-01", "2024-05-01T25:00", "", "1714567890"]:
        with pytest.raises(BadTime, match="Cannot read"):
            parse_time(bad)
    assert format_time(T0) == "2024-05-01T02:00:00.000000Z"
