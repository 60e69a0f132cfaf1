"""`foundation gc --relayout`: the whole log laid out again, the newest day of each VM first, in disk order."""

import json
import os
import shutil

from test_cli_images import cli, day, write
from test_gc import BIG, churn_days, files, forget, log_bytes, restores, serves, unreachable
from test_image_support import BS, make_store, open_store, seeded

import foundation.gc as gc
from foundation.catalog import Catalog
from foundation.errors import StoreFull
from foundation.image import ImageReader
from foundation.store import format as F
from foundation.store import switch
from foundation.store.verify import verify


def log_positions(path, name, **kw):
    """Each distinct record the newest day of `name` reads, in disk order, as its position in the
    whole log (0 = the first record of arena 0)."""
    with open_store(path, writable=False, **kw) as s:
        order = []
        for n in range(s.log.open.n + 1):
            order += list(s.log.open.addrs) if n == s.log.open.n else list(s.summary_records(n)[1])
        at = {a: i for i, a in enumerate(order)}
        snap = Catalog.load(s).snapshots(name)[-1]
        r = ImageReader(s, snap.disks["vda"].root)
        rs = s.ref_size
        refs = b"".join(x[2] for x in r.iter_leaves() if x[2] is not None)
        refs = b"".join(refs[i:i + rs] for i in range(0, len(refs), rs) if refs[i:i + rs] != s.null_ref)
        out, seen = [], set()
        for a in s.addresses(refs):
            if a not in seen:
                seen.add(a)
                out.append(at[a])
        return out


def scattered_days(tmp_path, capsys, store, days=6):
    """churn_days, and on each day three 4 KiB blocks of the image rewritten at random places: the
    newest day's blocks lie over every day's arenas -> {day: image bytes}."""
    rng = seeded(3)
    history = churn_days(tmp_path, capsys, store, days=1)
    img = bytearray(history[1])
    for d in range(2, days + 1):
        for _ in range(3):
            at = rng.randrange(0, (2 << 20) // BS) * BS
            img[at:at + BS] = rng.randbytes(BS)
        img[2 << 20:] = rng.randbytes(BIG) if d % 2 == 0 else bytes(BIG)
        write(tmp_path / "disk.raw", img)
        assert cli(capsys, store, "import-image", "vm", tmp_path / "disk.raw", "--at", day(d))[0] == 0
        history[d] = bytes(img)
    return history


def with_other_vm(tmp_path, capsys, store):
    """A second VM with its own small disk on two days: the newest days of two names."""
    rng = seeded(11)
    img = tmp_path / "other.raw"
    data = bytearray(rng.randbytes(256 << 10))
    write(img, data)
    assert cli(capsys, store, "import-image", "other", img, "--at", day(2))[0] == 0
    data[4096:8192] = rng.randbytes(4096)
    write(img, data)
    assert cli(capsys, store, "import-image", "other", img, "--at", day(5))[0] == 0
    return bytes(data)


def test_relayout_puts_each_newest_day_in_disk_order_and_every_day_restores(tmp_path, capsys):
    store = make_store(tmp_path / "s", mode="hash")
    history = scattered_days(tmp_path, capsys, store)
    other = with_other_vm(tmp_path, capsys, store)
    forget(store, {2, 4})
    garbage = unreachable(store)
    before = log_positions(store, "vm")
    assert before != sorted(before)  # a week of changes scattered the newest day over the log
    size = log_bytes(store)

    rc, out, err = cli(capsys, store, "gc", "--relayout")
    assert rc == 0, err
    assert "laid the log out again" in out

    for name in ("vm", "other"):
        pos = log_positions(store, name)
        # every block of the newest day follows the one before it in the log: one read front to back
        assert pos == list(range(pos[0], pos[0] + len(pos))), name
    assert restores(store, history) == [1, 3, 5, 6]
    with open_store(store, writable=False) as s:
        assert verify(s)[0] == []
        snaps = Catalog.load(s).snapshots("other")
        r = ImageReader(s, snaps[-1].disks["vda"].root)
        assert r.read(0, r.size) == other
    # the garbage is gone too, as a plain gc would free it (less the Bloom filter's false positives)
    assert log_bytes(store) < size - garbage * 0.9
    assert unreachable(store) <= 0.01 * garbage + 4096

    # The store goes on as before: a later day dedups against the moved records, and a plain gc runs.
    write(tmp_path / "disk.raw", history[6])
    size = log_bytes(store)
    assert cli(capsys, store, "import-image", "vm", tmp_path / "disk.raw", "--at", day(7))[0] == 0
    assert log_bytes(store) - size < 64 << 10  # day 7 == day 6: only the catalog grew
    assert cli(capsys, store, "gc", "--min-garbage", "0")[0] == 0
    assert restores(store, {**history, 7: history[6]}) == [1, 3, 5, 6, 7]


def test_relayout_generations_and_chain_follow_the_switch(tmp_path, capsys):
    store = make_store(tmp_path / "s", mode="hash")
    history = churn_days(tmp_path, capsys, store, days=4)
    with open_store(store, writable=False) as s:
        gens = {n: s.log.trailer(n).generation for n in range(s.log.open.n)}
        generation = s.commit().generation
    assert cli(capsys, store, "gc", "--relayout")[0] == 0
    with open_store(store, writable=False) as s:
        # each sealed arena replaced carries the next generation; the head's number goes on
        for n in range(s.log.open.n):
            assert s.log.trailer(n).generation == gens.get(n, 0) + 1, n
        assert s.commit().generation == generation + 1
        assert verify(s)[0] == []
    assert not os.path.exists(os.path.join(store, "gc.json"))
    assert not [x for x in os.listdir(os.path.join(store, "arenas")) if x.endswith(".gc")]
    assert restores(store, history) == [1, 2, 3, 4]


def test_relayout_refuses_what_it_cannot_do_and_changes_nothing(tmp_path, capsys, monkeypatch):
    value = make_store(tmp_path / "v", mode="value")
    churn_days(tmp_path, capsys, value, days=2)
    before = files(value)
    rc, _, err = cli(capsys, value, "gc", "--relayout")
    assert rc != 0 and "--relayout applies to compare-by-hash stores" in err
    assert files(value) == before

    store = make_store(tmp_path / "s", mode="hash")
    history = churn_days(tmp_path, capsys, store, days=3)
    before = files(store)
    rc, _, err = cli(capsys, store, "gc", "--relayout", "--max-time", "10")
    assert rc != 0 and "cannot stop early" in err
    rc, out, _ = cli(capsys, store, "gc", "--relayout", "--dry-run")
    assert rc == 0 and "nothing changed" in out
    assert files(store) == before

    # Too little free space for the live records: said before anything is written.
    class Full:
        free = 4096

    monkeypatch.setattr(gc.shutil, "disk_usage", lambda path: Full)
    rc, _, err = cli(capsys, store, "gc", "--relayout")
    assert rc != 0 and "bytes free" in err and "--relayout writes the" in err, err
    monkeypatch.undo()
    assert files(store) == before
    assert restores(store, history) == [1, 2, 3]


def test_relayout_stops_on_listed_damage_before_changing_anything(tmp_path, capsys):
    store = make_store(tmp_path / "s", mode="hash")
    churn_days(tmp_path, capsys, store, days=3)
    # a record of arena 0 damaged and listed by verify
    with open_store(store, writable=False) as s:
        a = s.summary_records(0)[1][1]
    with open(os.path.join(store, "arenas", F.arena_name(0)), "r+b") as f:
        f.seek((a & 0xFFFFFFFF) + 64 + 10)
        f.write(b"XXXX")
    with open_store(store) as s:
        verify(s)
    before = files(store)
    rc, _, err = cli(capsys, store, "gc", "--relayout")
    assert rc != 0 and "damaged record(s) are listed" in err and "foundation repair" in err, err
    assert files(store) == before


def nights(tmp_path, capsys, store, count, size, seed, span=None, when=day, blocks=8):
    """`count` nights of a disk of `size` random bytes, each after the first rewriting `blocks` random
    4 KiB blocks (of its last `span` bytes, or anywhere), imported at when(night) -> {night: bytes}."""
    rng = seeded(seed)
    img = bytearray(rng.randbytes(size))
    span = span or size
    history = {}
    for d in range(1, count + 1):
        for _ in range(blocks if d > 1 else 0):
            at = size - span + rng.randrange(span // BS) * BS
            img[at:at + BS] = rng.randbytes(BS)
        write(tmp_path / "disk.raw", img)
        assert cli(capsys, store, "import-image", "vm", tmp_path / "disk.raw", "--at", when(d))[0] == 0
        history[d] = bytes(img)
    return history


def month_of_nights(tmp_path, capsys, store):
    """A 1 MiB disk whose 30 nights each rewrite 16 random blocks, and all but the last 5 forgotten:
    nearly every arena holds garbage, as after a year pruned -> {night: image bytes} of the kept ones."""
    history = nights(tmp_path, capsys, store, 30, 1 << 20, seed=5, blocks=16)
    forget(store, set(range(1, 26)))
    return {d: history[d] for d in range(26, 31)}


def test_gc_lays_the_log_out_by_itself_when_it_would_rewrite_nearly_all_of_it(tmp_path, capsys, monkeypatch):
    store = make_store(tmp_path / "s", mode="hash")
    kept = month_of_nights(tmp_path, capsys, store)
    plain = str(tmp_path / "plain")
    shutil.copytree(store, plain)
    monkeypatch.setenv("FOUNDATION_STATE_DIR", str(tmp_path / "host-plain"))  # a copy is a store of its own
    rc, out, _ = cli(capsys, plain, "gc", "--in-place", "--json")
    assert rc == 0 and json.loads(out)["relayout"] is False
    assert restores(plain, kept) == sorted(kept)

    # Not enough room for the copy: the arenas are rewritten one by one instead, and nothing is lost.
    class Full:
        free = 4096

    short = str(tmp_path / "short")
    shutil.copytree(store, short)
    monkeypatch.setenv("FOUNDATION_STATE_DIR", str(tmp_path / "host-short"))
    monkeypatch.setattr(gc.shutil, "disk_usage", lambda path: Full)
    rc, out, _ = cli(capsys, short, "gc", "--json")
    assert rc == 0 and json.loads(out)["relayout"] is False and json.loads(out)["rewritten"], out
    monkeypatch.undo()
    assert restores(short, kept) == sorted(kept)

    monkeypatch.setenv("FOUNDATION_STATE_DIR", str(tmp_path / "host"))
    rc, out, _ = cli(capsys, store, "gc", "--json")
    rep = json.loads(out)
    assert rc == 0 and rep["relayout"] is True, rep
    pos = log_positions(store, "vm")
    assert pos == list(range(len(pos)))  # the newest night first, in disk order
    assert restores(store, kept) == sorted(kept)
    # the same space as the arena-by-arena gc, give or take the records the Bloom filters keep
    assert abs(log_bytes(store) - log_bytes(plain)) < 0.02 * log_bytes(plain)


def test_relayout_of_an_encrypted_store(tmp_path, capsys, monkeypatch):
    key = str(tmp_path / "k")
    store = make_store(tmp_path / "s", mode="hash", encrypt=True, key_file=key)
    monkeypatch.setenv("FOUNDATION_KEY_FILE", key)
    history = scattered_days(tmp_path, capsys, store, days=4)
    before = log_positions(store, "vm", key_file=key)
    assert before != sorted(before)
    rc, out, err = cli(capsys, store, "gc", "--relayout")
    assert rc == 0 and "laid the log out again" in out, err
    pos = log_positions(store, "vm", key_file=key)
    assert pos == list(range(len(pos)))
    serves(capsys, store, history)  # `list` and `restore` through the CLI, byte for byte
    rc, out, _ = cli(capsys, store, "verify")
    assert rc == 0 and out.startswith("ok:"), out


def test_a_plain_gc_lays_out_the_tail_of_the_log_it_rewrites_anyway(tmp_path, capsys):
    """A disk whose nights change only its last 256 KiB: after a prune the garbage lies in the
    arenas the nights wrote, after the untouched bulk of the disk. gc lays out that tail, the
    newest night's records in it first, and leaves the arenas before it as they were."""
    store = make_store(tmp_path / "s", mode="hash")
    history = nights(tmp_path, capsys, store, 12, 2 << 20, seed=9, span=256 << 10)
    forget(store, set(range(1, 10)))
    kept = {d: history[d] for d in (10, 11, 12)}
    before = files(store)

    rc, out, _ = cli(capsys, store, "gc", "--json")
    rep = json.loads(out)
    assert rc == 0 and rep["relayout"] is True and rep["relayout_from"] > 0, rep
    first = rep["relayout_from"]
    after = files(store)
    for n in range(first):
        name = os.path.join("arenas", F.arena_name(n))
        assert (after[name] == before[name]) == (n not in rep["rewritten"]), n
    with open_store(store, writable=False) as s:
        start = sum(len(s.summary_records(n)[1]) for n in range(first))  # log position of the tail's start
    pos = log_positions(store, "vm")
    tail = [p for p in pos if p >= start]
    assert tail and tail == list(range(start, start + len(tail)))  # the newest night's records lead the tail
    assert restores(store, kept) == [10, 11, 12]
    with open_store(store, writable=False) as s:
        assert verify(s)[0] == []


def disk_full_at(monkeypatch, k):
    """The k-th arena gc writes finds the disk full (the others are written) -> the arenas asked for."""
    write_arena, calls = switch.write_arena, []

    def write(store, n, data):
        calls.append(n)
        if len(calls) == k:
            raise StoreFull("arena")
        return write_arena(store, n, data)

    monkeypatch.setattr(switch, "write_arena", write)
    return calls


def test_a_relayout_the_full_disk_cuts_short_leaves_nothing_behind(tmp_path, capsys, monkeypatch):
    """The disk fills while the new log is written: gc says so, deletes what it wrote at once (the
    space comes back now), and the old log stands."""
    store = make_store(tmp_path / "s", mode="hash")
    history = scattered_days(tmp_path, capsys, store, days=4)
    before = files(store)
    calls = disk_full_at(monkeypatch, 3)
    rc, _, err = cli(capsys, store, "gc", "--relayout")
    assert rc == StoreFull.code and "The store disk is full" in err, err
    assert len(calls) == 3
    assert not [x for x in os.listdir(os.path.join(store, "arenas")) if x.endswith(".gc")]
    assert files(store) == before
    monkeypatch.undo()
    assert restores(store, history) == sorted(history)


def test_a_plain_gc_lays_out_the_whole_log_when_the_newest_day_lies_scattered(tmp_path, capsys, monkeypatch):
    """Nothing forgotten, so nothing is worth rewriting; but 60 nights of small changes spread the
    newest day over the log, and the log is small beside the disk: gc lays it all out again."""
    from foundation.gc.relayout import scatter

    store = make_store(tmp_path / "s", mode="hash")
    history = nights(tmp_path, capsys, store, 60, 4 << 20, seed=12,
                     when=lambda d: f"2024-{1 + (d - 1) // 28:02d}-{1 + (d - 1) % 28:02d}T03:00:00Z")

    def scattered():
        with open_store(store, writable=False) as s:
            return scatter(s, Catalog.load(s))[0]

    before = scattered()
    assert before >= gc.SCATTERED, before
    copy = str(tmp_path / "copy")
    shutil.copytree(store, copy)
    monkeypatch.setenv("FOUNDATION_STATE_DIR", str(tmp_path / "host-copy"))
    rc, out, _ = cli(capsys, copy, "gc", "--in-place", "--json")
    assert rc == 0 and json.loads(out)["rewritten"] == []  # no garbage: arena by arena, nothing to do

    monkeypatch.setenv("FOUNDATION_STATE_DIR", str(tmp_path / "host"))
    rc, out, _ = cli(capsys, store, "gc", "--json")
    rep = json.loads(out)
    assert rc == 0 and rep["relayout"] is True and rep["relayout_from"] == 0, rep
    after = scattered()
    assert after < 1.5, (before, after)
    pos = log_positions(store, "vm")
    assert pos == list(range(len(pos)))
    with open_store(store, writable=False) as s:
        snaps = Catalog.load(s).snapshots("vm")
        assert len(snaps) == 60
        for d in (1, 30, 60):
            r = ImageReader(s, snaps[d - 1].disks["vda"].root)
            assert r.read(0, r.size) == history[d], d
    rc, out, _ = cli(capsys, store, "verify")
    assert rc == 0 and out.startswith("ok:"), out
    # and a second gc finds nothing scattered: it leaves the log alone
    rc, out, _ = cli(capsys, store, "gc", "--json")
    assert rc == 0 and json.loads(out)["relayout"] is False and json.loads(out)["rewritten"] == []


def test_a_relayout_gc_chose_itself_falls_back_to_arena_by_arena(tmp_path, capsys, monkeypatch, caplog):
    """The disk fills while a plain gc lays the log out: it deletes the copy and rewrites the arenas
    one by one instead, which needs an arena's room, and says why."""
    store = make_store(tmp_path / "s", mode="hash")
    kept = month_of_nights(tmp_path, capsys, store)
    disk_full_at(monkeypatch, 2)
    size = log_bytes(store)
    rc, out, _ = cli(capsys, store, "gc", "--json")
    rep = json.loads(out)
    assert rc == 0 and rep["relayout"] is False and rep["rewritten"], rep
    assert any("could not lay the log out again" in r.getMessage() and "disk is full" in r.getMessage()
               for r in caplog.records)
    assert not [x for x in os.listdir(os.path.join(store, "arenas")) if x.endswith(".gc")]
    assert log_bytes(store) < size
    monkeypatch.undo()
    assert restores(store, kept) == sorted(kept)
    with open_store(store, writable=False) as s:
        assert verify(s)[0] == []
