"""`foundation forget` and `prune`: the catalog without some snapshots, the retention policy, crashes.

Every kept snapshot must still restore byte for byte, ids must never be
reused, a dry run must change nothing, and a kill -9 anywhere in a forget
must leave the old catalog or the new one.
"""

import json
import random
import shutil
import signal
import time
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace
from zoneinfo import ZoneInfo

import pytest
from conftest import own_host
from test_cli_images import cli, day, run_crasher, write
from test_image_support import BS, content, make_store, mutate, open_store, seeded
from test_vm_support import libvirt_conn, make_vm, vm_dir  # noqa: F401 (fixtures)

from foundation.catalog import Catalog, CatalogCorrupt, DiskEntry, Snapshot
from foundation.catalog.retention import Policy, decide
from foundation.config import ConfigError
from foundation.errors import DataCorrupt, DerivedCorrupt, NotFound
from foundation.image import BytesSource, ImageReader, Root, write_blob, write_image
from foundation.snapshotfs.timeindex import TimeIndex

CATALOG = 3
UTC = timezone.utc


@pytest.fixture(params=["hash", "value"])
def store(request, tmp_path):
    return make_store(tmp_path / "store", mode=request.param)


def import_days(tmp_path, capsys, store, days, name="vm", seed=3):
    """One snapshot of `name` per entry of `days` (day numbers of May 2024) -> {day: image bytes}."""
    rng = seeded(seed)
    img = bytearray(content(rng, 1 << 20))
    image = tmp_path / f"{name}.raw"
    history = {}
    for d in days:
        mutate(rng, img, days_ops=4)
        write(image, img)
        rc, _, err = cli(capsys, store, "import-image", name, image, "--at", day(d))
        assert rc == 0, err
        history[d] = bytes(img)
    return history


def listed(capsys, store, name=None):
    rc, out, err = cli(capsys, store, "list", *([name] if name else []), "--json")
    assert rc == 0, err
    return json.loads(out)


def state(store):
    """What a dry run must leave as it was: the newest catalog record, its generation and bytes, the log."""
    with open_store(store, writable=False) as s:
        cat = Catalog.load(s)
        return s.latest(CATALOG), cat.generation, cat.serialize(), s.log_bytes()


def restores_all(capsys, store, tmp_path, history, name="vm"):
    """Every listed snapshot of `name` restores (by the CLI) to the bytes of its day -> the days listed."""
    days = []
    for s in listed(capsys, store, name):
        d = int(s["time"][8:10])
        out = tmp_path / "restored.raw"
        rc, _, err = cli(capsys, store, "restore", f"{name}@{s['time']}", out, "--force")
        assert rc == 0, err
        assert out.read_bytes() == history[d], f"{name} day {d}"
        days.append(d)
    return days


# ---- forget ---------------------------------------------------------------------------
def test_forget_one_several_the_newest_and_by_id(store, tmp_path, capsys):
    history = import_days(tmp_path, capsys, store, range(1, 8))
    ids = {int(s["time"][8:10]): s["id"] for s in listed(capsys, store)}

    rc, out, err = cli(capsys, store, "forget", "vm@2024-05-02")  # a date: that day's latest snapshot
    assert rc == 0, err
    assert "forgot vm@2024-05-02T01:00:00.000000Z (#2)  [vm@2024-05-02]" in out
    assert "foundation gc" in out
    assert restores_all(capsys, store, tmp_path, history) == [1, 3, 4, 5, 6, 7]

    # several at once, mixing the forms; two targets naming one snapshot forget it once
    rc, out, err = cli(capsys, store, "forget", f"#{ids[4]}", "vm@2024-05-05T01:00:00Z",
                       "vm@2024-05-05T12:00", "vm@2024-05-01T03:00:00+02:00")
    assert rc == 0, err
    assert "3 snapshot(s) forgotten" in out
    assert restores_all(capsys, store, tmp_path, history) == [3, 6, 7]

    # the newest
    rc, out, err = cli(capsys, store, "forget", "vm@2024-05-07")
    assert rc == 0, err
    assert restores_all(capsys, store, tmp_path, history) == [3, 6]
    # the time line now answers with the previous snapshot
    rc, _, err = cli(capsys, store, "restore", "vm@2024-05-07", tmp_path / "o.raw")
    assert rc == 0 and (tmp_path / "o.raw").read_bytes() == history[6]
    rc, _, err = cli(capsys, store, "restore", "vm", tmp_path / "n.raw")
    assert (tmp_path / "n.raw").read_bytes() == history[6]

    # everything: the name is gone, the store still opens and takes new snapshots
    rc, out, err = cli(capsys, store, "forget", "vm@2024-05-03", "vm@2024-05-06")
    assert rc == 0, err
    assert "no snapshot of vm is left" in out
    assert listed(capsys, store) == []
    assert cli(capsys, store, "list", "vm")[0] == 30


def test_ids_are_never_reused(store, tmp_path, capsys):
    history = import_days(tmp_path, capsys, store, range(1, 5))
    assert [s["id"] for s in listed(capsys, store)] == [1, 2, 3, 4]
    assert cli(capsys, store, "forget", "#4", "#3")[0] == 0
    with open_store(store, writable=False) as s:
        cat = Catalog.load(s)
        assert cat.next_id == 5
        assert cat.serialize().split(b"\n")[0] == b'{"format":"foundation-catalog","next_id":5,"version":1}'
    history.update(import_days(tmp_path, capsys, store, [9], seed=9))
    assert [s["id"] for s in listed(capsys, store)] == [1, 2, 5]
    with open_store(store, writable=False) as s:  # back to the plain header once max + 1 is right again
        assert Catalog.load(s).serialize().split(b"\n")[0] == b'{"format":"foundation-catalog","version":1}'
    assert restores_all(capsys, store, tmp_path, history) == [1, 2, 9]
    # forget everything, then add: still no reuse
    assert cli(capsys, store, "forget", "#1", "#2", "#5")[0] == 0
    import_days(tmp_path, capsys, store, [10], seed=10)
    assert [s["id"] for s in listed(capsys, store)] == [6]


def test_catalogs_without_next_id_and_damaged_next_id():
    from test_image_support import MemStore

    s = MemStore("hash")
    cat = Catalog.load(s)
    for i in range(3):
        cat.add(snapshot(s, "vm", T0 + timedelta(days=i)))
    text = cat.serialize()
    assert b"next_id" not in text  # the header of every catalog written before forget existed
    for header, want in ((b'{"format":"foundation-catalog","version":1}', 4),
                         (b'{"format":"foundation-catalog","next_id":9,"version":1}', 9),
                         # a writer that predates next_id added past it: never below max + 1
                         (b'{"format":"foundation-catalog","next_id":2,"version":1}', 4)):
        c = Catalog()
        c._parse(header + b"\n" + text.split(b"\n", 1)[1])
        assert c.next_id == want
        assert c.add(snapshot(s, "vm", T0 + timedelta(days=10))).id == want
    for bad in (b'"x"', b"0", b"1.5", b"true"):
        with pytest.raises(CatalogCorrupt, match="next_id"):
            Catalog()._parse(b'{"format":"foundation-catalog","next_id":' + bad + b',"version":1}\n')


def test_dry_runs_change_nothing(store, tmp_path, capsys):
    import_days(tmp_path, capsys, store, range(1, 6))
    before = state(store)
    rc, out, err = cli(capsys, store, "forget", "--dry-run", "vm@2024-05-05", "#1")
    assert rc == 0, err
    assert "would forget vm@2024-05-01T01:00:00.000000Z (#1)" in out
    assert "dry run: 2 snapshot(s) would be forgotten; nothing changed" in out
    assert state(store) == before
    rc, out, err = cli(capsys, store, "prune", "-n", "--keep-last", "2")
    assert rc == 0, err
    assert "forget  vm  #1" in out and "keep    vm  #5" in out and "newest, last 1" in out
    assert "dry run: 3 snapshot(s) would be forgotten, 2 kept; nothing changed" in out
    assert state(store) == before
    assert len(listed(capsys, store)) == 5


def test_errors_are_clear_and_change_nothing(store, tmp_path, capsys):
    import_days(tmp_path, capsys, store, [2, 3])
    before = state(store)

    def err_of(*args, code):
        rc, out, err = cli(capsys, store, *args)
        assert rc == code, (args, rc, err)
        assert err.startswith("foundation: ")
        return err

    assert "No snapshots of 'nosuch' in the catalog. Known names: vm." in err_of(
        "forget", "vm@2024-05-03", "nosuch@2024-05-03", code=30)
    assert "'vm' has no snapshot at or before 2024-05-01T23:59:59.999999Z; its first snapshot is from " \
           "2024-05-02" in err_of("forget", "vm@2024-05-03", "vm@2024-05-01", code=30)
    assert "#99: no snapshot with id 99" in err_of("forget", "#99", code=30)
    assert "give NAME@WHEN (a date or time) or #ID" in err_of("forget", "vm", code=31)
    assert "an id is # followed by digits" in err_of("forget", "#x", code=31)
    assert "Cannot read 'soon' as a date or time" in err_of("forget", "vm@soon", code=31)
    assert "No snapshots of 'nosuch'" in err_of("prune", "--keep-daily", "1", "nosuch", code=30)
    cfg = tmp_path / "none.toml"
    cfg.write_text("")
    e = err_of("--config", cfg, "prune", code=2)
    assert "No retention policy" in e and "would forget every snapshot but each name's newest" in e
    assert "No retention policy" in err_of("--config", cfg, "prune", "--keep-daily", "0", code=2)
    for table, what in (("keep_dayly = 3", "unknown setting 'keep_dayly' in [retention]"),
                        ("keep_daily = -1", "[retention] keep_daily must be a non-negative integer, not -1"),
                        ('keep_weekly = "4"', "keep_weekly must be a non-negative integer, not '4'"),
                        ("keep_last = true", "keep_last must be a non-negative integer, not True"),
                        ("keep_monthly = 1.5", "keep_monthly must be a non-negative integer")):
        cfg.write_text(f"[retention]\n{table}\n")
        assert what in err_of("--config", cfg, "prune", code=31)
    cfg.write_text("retention = 3\n")
    assert "unknown setting 'retention'" in err_of("--config", cfg, "prune", code=31)
    with pytest.raises(SystemExit) as e:
        cli(capsys, store, "prune", "--keep-daily", "-1")
    assert e.value.code == 2 and "expected a non-negative whole number, not '-1'" in capsys.readouterr().err
    assert state(store) == before


# ---- prune ----------------------------------------------------------------------------------
def test_prune_keeps_by_policy_and_kept_snapshots_restore(store, tmp_path, capsys):
    # two snapshots on some days, a gap, and a second name that prune leaves alone when named
    rng = seeded(21)
    img = bytearray(content(rng, 1 << 20))
    image = tmp_path / "vm.raw"
    history = {}
    times = [(d, h) for d in (1, 2, 3, 6, 7, 8, 13, 14, 20) for h in ((1, 13) if d in (2, 7, 14) else (1,))]
    for d, h in times:
        mutate(rng, img, days_ops=3)
        write(image, img)
        t = f"2024-05-{d:02d}T{h:02d}:00:00Z"
        assert cli(capsys, store, "import-image", "vm", image, "--at", t)[0] == 0
        history[t] = bytes(img)
    other = import_days(tmp_path, capsys, store, [1, 2, 3], name="other", seed=4)
    rc, out, err = cli(capsys, store, "prune", "vm", "--keep-daily", "3", "--keep-weekly", "2")
    assert rc == 0, err
    kept = [s["time"][:13] for s in listed(capsys, store, "vm")]
    # daily 3: the 20th, the 14th (13:00), the 13th; weekly 2: W21 (Monday the 20th), W20 (the 14th 13:00)
    assert kept == ["2024-05-13T01", "2024-05-14T13", "2024-05-20T01"], kept
    assert "forget  vm  #1" in out and "snapshot(s) forgotten" in out
    assert [s["time"][8:10] for s in listed(capsys, store, "other")] == ["01", "02", "03"]
    for s in listed(capsys, store, "vm"):
        out_path = tmp_path / "r.raw"
        assert cli(capsys, store, "restore", f"vm@{s['time']}", out_path, "--force")[0] == 0
        assert out_path.read_bytes() == history[s["time"][:19] + "Z"]
    # again: nothing more to forget
    rc, out, _ = cli(capsys, store, "prune", "vm", "--keep-daily", "3", "--keep-weekly", "2")
    assert rc == 0 and "nothing to forget" in out
    assert restores_all(capsys, store, tmp_path, other, name="other") == [1, 2, 3]


def test_prune_from_the_config_file(store, tmp_path, capsys):
    history = import_days(tmp_path, capsys, store, range(1, 11))
    cfg = tmp_path / "foundation.toml"
    cfg.write_text(f'store = "{store}"\n\n[retention]\nkeep_last = 2\nkeep_weekly = 2\n')
    rc, out, err = cli(capsys, store, "--config", cfg, "prune", "--dry-run")
    assert rc == 0, err
    assert "policy: --keep-last 2 --keep-weekly 2" in out
    assert "keep    vm  #5  2024-05-05 01:00:00" in out and "weekly 2024-W18" in out
    rc, out, err = cli(capsys, store, "--config", cfg, "prune")
    assert rc == 0, err
    # 2024-05-05 is a Sunday: week 18 ends with it, week 19 with the 10th (the newest)
    assert restores_all(capsys, store, tmp_path, history) == [5, 9, 10]
    # an option on the command line replaces the whole table
    rc, out, err = cli(capsys, store, "--config", cfg, "prune", "--keep-last", "1")
    assert rc == 0, err
    assert restores_all(capsys, store, tmp_path, history) == [10]


def test_prune_uses_the_local_days_of_the_snapshot_tree(store, tmp_path, capsys, monkeypatch):
    """In New York, 03:00 UTC on the 2nd is still the 1st: one day, one kept snapshot."""
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        for t in ("2024-05-01T12:00:00Z", "2024-05-02T03:00:00Z", "2024-05-02T12:00:00Z"):
            img = tmp_path / "x.raw"
            img.write_bytes(t.encode() * 100)
            assert cli(capsys, store, "import-image", "vm", img, "--at", t)[0] == 0
        rc, out, err = cli(capsys, store, "prune", "--keep-daily", "5")
        assert rc == 0, err
        assert "forget  vm  #1  2024-05-01 08:00:00 EDT" in out
        assert [s["id"] for s in listed(capsys, store)] == [2, 3]
    finally:
        monkeypatch.undo()
        time.tzset()


# ---- the policy alone ---------------------------------------------------------------
T0 = datetime(2024, 5, 1, 2, 0, tzinfo=UTC)


class Snap:
    """Just what the policy looks at."""

    def __init__(self, sid, name, t):
        self.id, self.name, self.time = sid, name, t

    def __repr__(self):
        return f"#{self.id} {self.name} {self.time:%Y-%m-%d %H:%M}"


def snaps_at(times, name="vm", first_id=1):
    return [Snap(first_id + i, name, t) for i, t in enumerate(times)]


def kept(snaps, tz=UTC, **policy):
    return [d.snapshot.id for d in decide(snaps, Policy(**policy), tz) if d.keep]


def test_policy_daily_weekly_monthly_yearly():
    # a snapshot at 01:00 and 13:00 every day of 2023 and 2024, ids in time order
    times = []
    t = datetime(2023, 1, 1, 1, tzinfo=UTC)
    while t.year < 2025:
        times += [t, t + timedelta(hours=12)]
        t += timedelta(days=1)
    snaps = snaps_at(times)
    by_id = {s.id: s for s in snaps}

    def shown(ids):
        return [f"{by_id[i].time:%Y-%m-%d %H}" for i in ids]

    assert shown(kept(snaps, daily=3)) == ["2024-12-29 13", "2024-12-30 13", "2024-12-31 13"]
    # ISO weeks: Monday 2024-12-30 starts week 1 of 2025; each week's newest is its Sunday 13:00
    assert shown(kept(snaps, weekly=3)) == ["2024-12-22 13", "2024-12-29 13", "2024-12-31 13"]
    assert shown(kept(snaps, monthly=3)) == ["2024-10-31 13", "2024-11-30 13", "2024-12-31 13"]
    assert shown(kept(snaps, yearly=5)) == ["2023-12-31 13", "2024-12-31 13"]  # only two years have any
    assert shown(kept(snaps, last=3)) == ["2024-12-30 13", "2024-12-31 01", "2024-12-31 13"]
    # union of rules; each counts on its own (restic's rule, not borg's)
    assert shown(kept(snaps, last=1, daily=2, monthly=2)) == ["2024-11-30 13", "2024-12-30 13", "2024-12-31 13"]
    decisions = {d.snapshot.id: d for d in decide(snaps, Policy(last=1, daily=2, monthly=2), UTC)}
    assert decisions[snaps[-1].id].reasons == ["newest", "last 1", "daily 2024-12-31", "monthly 2024-12"]
    assert decisions[snaps[-3].id].reasons == ["daily 2024-12-30"]
    assert decisions[snaps[0].id].reasons == []
    # counts larger than the history keep every period there is
    assert len(kept(snaps, daily=10_000)) == 731
    assert len(kept(snaps, weekly=10_000)) == 106  # 2023-W01 .. 2025-W01, plus 2022-W52 (Sunday 2023-01-01)


def test_policy_gaps_ties_names_and_the_newest():
    t = T0
    a = snaps_at([t, t + timedelta(hours=1), t + timedelta(days=1), t + timedelta(days=9),
                  t + timedelta(days=9, hours=3)], "a")
    # ids in a different order from time: the policy goes by time
    b = [Snap(100 - i, "b", t + timedelta(days=i)) for i in range(4)]
    both = a + b
    # days with no snapshot do not count: daily 2 of "a" reaches back 8 days;
    # of two snapshots on one day the later one is kept
    assert sorted(kept(both, daily=2)) == [3, 5, 97, 98]
    # no rule at all: each name's newest stays, nothing else
    assert sorted(kept(both)) == [5, 97]
    assert {d.snapshot.id: d.reasons for d in decide(both, Policy(), UTC) if d.keep} == {5: ["newest"],
                                                                                       97: ["newest"]}
    # keep_last is per name
    assert sorted(kept(both, last=2)) == [4, 5, 97, 98]
    # decisions come oldest first, every snapshot once
    ds = decide(both, Policy(weekly=1), UTC)
    assert [d.snapshot for d in ds] == sorted(both, key=lambda s: (s.time, s.id))
    assert decide([], Policy(daily=1)) == []


def oracle(snaps, policy, tz):
    """The rules written out plainly: per name, per rule, group by period, newest of the N latest."""
    keep = set()
    periods = {"daily": lambda t: t.date(), "weekly": lambda t: t.isocalendar()[:2],
               "monthly": lambda t: (t.year, t.month), "yearly": lambda t: t.year}
    for name in {s.name for s in snaps}:
        mine = sorted((s for s in snaps if s.name == name), key=lambda s: (s.time, s.id))
        keep.add(mine[-1].id)
        keep.update(s.id for s in (mine[-policy.last:] if policy.last else []))
        for rule, period in periods.items():
            groups = {}
            for s in mine:
                groups.setdefault(period(s.time.astimezone(tz)), []).append(s)
            for p in sorted(groups)[::-1][:getattr(policy, rule)]:
                keep.add(groups[p][-1].id)
    return keep


@pytest.mark.parametrize("seed", range(6))
def test_policy_matches_a_plain_oracle_on_random_calendars(seed):
    rng = random.Random(seed)
    tz = [UTC, ZoneInfo("America/New_York"), ZoneInfo("Asia/Kolkata"), timezone(timedelta(hours=-11))][seed % 4]
    snaps, sid = [], 1
    for name in ("alpha", "beta", "gamma"):
        t = datetime(2020, 1, 1, tzinfo=UTC) + timedelta(minutes=rng.randrange(10**6))
        for _ in range(rng.randrange(1, 400)):
            t += timedelta(minutes=rng.choice([7, 90, 600, 1440, 1500, 4000, 20000, 90000]))
            snaps.append(Snap(sid, name, t))
            sid += 1
    rng.shuffle(snaps)
    for _ in range(20):
        p = Policy(**{k: rng.choice([0, 0, 1, 2, 3, 7, 30]) for k in ("last", "daily", "weekly", "monthly",
                                                                        "yearly")})
        got = {d.snapshot.id for d in decide(snaps, p, tz) if d.keep}
        assert got == oracle(snaps, p, tz), p


@pytest.mark.parametrize("tz", [UTC, ZoneInfo("America/New_York"), ZoneInfo("Pacific/Auckland")])
def test_daily_days_are_the_days_of_the_snapshot_tree(tz):
    """keep_daily with room for everything keeps exactly the newest entry of each /snapshot day directory."""
    rng = random.Random(1)
    snaps = [Snap(i, "vm", datetime(2024, 3, 1, tzinfo=UTC) + timedelta(minutes=rng.randrange(60 * 24 * 60)))
             for i in range(1, 300)]
    index = TimeIndex(snaps, tz)
    want = {index.snapshots_on("vm", d)[-1].id for d in index.day_list}
    assert {d.snapshot.id for d in decide(snaps, Policy(daily=10_000), tz) if d.keep} == want


def test_policy_from_config():
    assert Policy.from_config({"keep_daily": 7, "keep_weekly": 4, "keep_monthly": 12, "keep_yearly": 0,
                               "keep_last": 3}) == Policy(last=3, daily=7, weekly=4, monthly=12)
    assert Policy.from_config({}).empty
    with pytest.raises(ConfigError, match=r"Config file /x.toml: unknown setting 'daily' in \[retention\]"):
        Policy.from_config({"daily": 7}, "/x.toml")
    with pytest.raises(ConfigError, match="keep_yearly must be a non-negative integer, not False"):
        Policy.from_config({"keep_yearly": False})
    with pytest.raises(ValueError):
        Policy(daily=-1)


# ---- the catalog API -------------------------------------------------------------------
def snapshot(store, name, t, data=b"", meta=None):
    root = write_image(store, BytesSource(data), len(data)) if data else Root(store.null_ref, 0, 0)
    return Snapshot(None, name, f"uuid-{name}", t, {"vda": DiskEntry(root, len(data))}, meta or {}, len(data))


def test_forget_api_and_live_roots(store):
    with open_store(store) as s:
        cat = Catalog.load(s)
        xml = write_blob(s, b"<domain/>")
        nvram = write_blob(s, b"\1" * 5000)
        for i in range(4):
            meta = {"domain_xml": xml.to_json(), "nvram": {"path": "/x", "blob": nvram.to_json()},
                    "changed_bytes": {"vda": 1}, "run": {"id": f"r{i}"}}
            cat.add(snapshot(s, "vm", T0 + timedelta(days=i), bytes([i + 1]) * BS * 3, meta))
        cat.add(snapshot(s, "other", T0, b"o" * BS, {"how": "import-image"}))
        cat.commit(s)
        roots = cat.live_roots()
        disk_roots = [x.disks["vda"].root for x in sorted(cat.snapshots(), key=lambda x: x.id)]
        assert roots == disk_roots[:1] + [xml, nvram] + disk_roots[1:]  # each once, catalog order
        with pytest.raises(NotFound, match="no snapshot with id 9"):
            cat.forget([2, 9])
        assert len(cat.snapshots()) == 5  # all or nothing
        gone = cat.forget([3, 1, 3])
        assert [x.id for x in gone] == [1, 3]
        assert cat.forget([]) == []
        assert [x.id for x in cat.snapshots("vm")] == [2, 4]
        assert xml in cat.live_roots() and disk_roots[0] not in cat.live_roots()
        gen = cat.generation
        cat.commit(s)
        assert cat.blob is not None
    with open_store(store, writable=False) as s:
        cat = Catalog.load(s)
        assert cat.generation == gen + 1
        assert [x.id for x in cat.snapshots()] == [5, 2, 4]
        for x in cat.snapshots("vm"):
            assert ImageReader(s, x.disks["vda"].root).read(0, BS * 3) == bytes([x.id]) * BS * 3
        assert cat.live_roots() == [disk_roots[1], xml, nvram, disk_roots[3], disk_roots[4]]
        # a malformed root in meta is damage, never "nothing to keep alive"
        cat.snapshots("vm")[0].meta["domain_xml"] = {"ref": "zz", "size": 1, "depth": 0}
        with pytest.raises(CatalogCorrupt, match="snapshot 2 of 'vm' has a malformed root"):
            cat.live_roots()


def test_the_snapshot_tree_drops_forgotten_snapshots(store, tmp_path, capsys):
    """The /snapshot tree reloads the catalog when a new one is committed: nothing more is needed."""
    from foundation.snapshotfs.archive import StoreArchive

    import_days(tmp_path, capsys, store, [1, 2, 3])
    arch = StoreArchive(store, check_interval=0)
    try:
        assert [s.id for s in arch.snapshots()] == [1, 2, 3]
        assert cli(capsys, store, "forget", "vm@2024-05-02")[0] == 0
        assert arch.refresh()
        assert [s.id for s in arch.snapshots()] == [1, 3]
        index = TimeIndex(arch.snapshots(), UTC)
        assert index.day_names(2024, 5) == ["01", "03"]
        assert index.at_day("vm", datetime(2024, 5, 2).date()).id == 1
    finally:
        arch.close()


# ---- crashes ------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["hash", "value"])
def test_crash_at_any_point_of_a_forget(tmp_path, capsys, mode):
    pristine = make_store(tmp_path / "pristine", mode=mode)
    history = import_days(tmp_path, capsys, pristine, range(1, 7))
    args = ("forget", "vm@2024-05-02", "#4", "vm@2024-05-06")
    old, new = [1, 2, 3, 4, 5, 6], [1, 3, 5]

    totals = {}
    for kind in ("store", "os"):
        trial = str(tmp_path / f"trial-{kind}")
        shutil.copytree(pristine, trial)
        own_host(tmp_path, trial)
        p = run_crasher(trial, kind, 10**9, *args)
        assert p.returncode == 0, p.stderr
        totals[kind] = int(p.stdout.split()[-1])
    rng = random.Random(mode)
    points = [("store", k) for k in range(1, totals["store"] + 1)]
    points += [("os", k) for k in sorted(rng.sample(range(1, totals["os"] + 1), min(40, totals["os"])))]
    seen = set()
    for kind, at in points:
        work = str(tmp_path / f"w-{kind}-{at}")
        shutil.copytree(pristine, work)
        own_host(tmp_path, work)
        p = run_crasher(work, kind, at, *args)
        assert p.returncode == -signal.SIGKILL, (kind, at, p.returncode, p.stderr)
        for writable in (False, True):  # a reader first (it trusts only what was synced), then the next writer
            try:
                with open_store(work, writable=writable) as s:
                    cat = Catalog.load(s)
                    days = [x.time.day for x in cat.snapshots("vm")]
                    assert days in (old, new), (kind, at, days)
                    seen.add(tuple(days))
                    for x in cat.snapshots("vm"):
                        r = ImageReader(s, x.disks["vda"].root)
                        assert r.read(0, r.size) == history[x.time.day], (kind, at, x.time.day)
            except (DataCorrupt, DerivedCorrupt) as e:
                pytest.fail(f"{kind} call {at}, {'writable' if writable else 'read-only'} open: {e}")
        if days == old:  # the forget can simply be run again
            rc, _, err = cli(capsys, work, *args)
            assert rc == 0, err
        with open_store(work, writable=False) as s:
            assert [x.time.day for x in Catalog.load(s).snapshots("vm")] == new
        rc, _, err = cli(capsys, work, "import-image", "vm", tmp_path / "vm.raw", "--at", day(9))
        assert rc == 0, err
        assert [x["id"] for x in listed(capsys, work)] == [1, 3, 5, 7]
        shutil.rmtree(work)
    assert seen == {tuple(old), tuple(new)}


# ---- the archiver ----------------------------------------------------------------------------
@pytest.mark.libvirt
def test_archive_after_forgetting_a_vms_newest_snapshot(make_vm, tmp_path, capsys):
    """The archiver finds its previous snapshot by run id; forgotten, it reads the whole disk once."""
    from test_vm_cli import archive
    from test_vm_support import DiskSpec, MiB

    path = make_store(tmp_path / "store", mode="hash", max_log_size=256 << 20)
    target = SimpleNamespace(args=["--store", path], state=str(tmp_path / "state"))  # what archive() reads
    vm = make_vm([DiskSpec("vda", "raw", size=8 * MiB)])
    want = []
    for night, (pattern, off) in enumerate([(0x11, 0), (0x22, 1 * MiB), (0x33, 2 * MiB), (0x44, 3 * MiB)]):
        vm.write("vda", pattern, off, 64 << 10)
        p = archive(target, vm.name)
        assert p.returncode == 0, p.stdout + p.stderr
        want.append(vm.state())
        if night == 1:  # forget the newest: the one the disk's base holds
            rc, out, err = cli(capsys, path, "forget", f"{vm.name}@{listed(capsys, path)[-1]['time']}")
            assert rc == 0, err
            assert "its next archive reads its whole disks" in out
            want.pop()
    snaps = listed(capsys, path, vm.name)
    assert [s["meta"]["incremental"]["vda"] for s in snaps] == [False, False, True]
    with open_store(path, writable=False) as s:
        cat = Catalog.load(s)
        for x, disks in zip(cat.snapshots(vm.name), want):
            r = ImageReader(s, x.disks["vda"].root)
            assert {"vda": r.read(0, r.size)} == disks
        roots = cat.live_roots()
        assert all(Root.from_json(x.meta["domain_xml"]) in roots for x in cat.snapshots())
    vm.assert_healthy()
