"""`foundation gc`: space of forgotten snapshots comes back, kept ones restore, crashes resume."""

import hashlib
import os
import subprocess
import sys

import pytest
from test_cli_images import ROOT, cli, day, write
from test_image_support import BS, content, make_store, open_store, seeded

from foundation.catalog import Catalog
from foundation.errors import StoreBusy
from foundation.gc import collect, roots
from foundation.image import ImageReader
from foundation.store import format as F
from foundation.store.verify import verify

BIG = 1 << 20  # the "DVD": a large file written one day and deleted the next


def churn_days(tmp_path, capsys, store, days=6, seed=7):
    """Import `days` snapshots of one image; on even days a fresh BIG region
    of random bytes appears (a large file written), on odd days it is zeroed
    (deleted). Returns {day: image bytes}."""
    rng = seeded(seed)
    img = bytearray(content(rng, 2 << 20) + bytes(BIG))
    image = tmp_path / "disk.raw"
    history = {}
    for d in range(1, days + 1):
        img[rng.randrange(0, 2 << 20) // BS * BS:][:BS] = rng.randbytes(BS)  # daily small change
        img[2 << 20:] = rng.randbytes(BIG) if d % 2 == 0 else bytes(BIG)
        write(image, img)
        assert cli(capsys, store, "import-image", "vm", image, "--at", day(d))[0] == 0
        history[d] = bytes(img)
    return history


def restores(path, history):
    """Every snapshot in the catalog reads back exactly what was imported that day."""
    with open_store(path, writable=False) as s:
        snaps = Catalog.load(s).snapshots("vm")
        for x in snaps:
            r = ImageReader(s, x.disks["vda"].root)
            assert r.read(0, r.size) == history[x.time.day], f"day {x.time.day} differs"
        return sorted(x.time.day for x in snaps)


def forget(store, days):
    """Drop snapshots from the catalog in one commit, as `foundation forget` does."""
    with open_store(store) as s:
        cat = Catalog.load(s)
        cat.forget([x.id for x in cat.snapshots() if x.time.day in days])
        cat.commit(s)


def unreachable(path):
    """Oracle, independent of gc's sweep: walk every kept tree from its roots
    (depth first, by refs) and sum the record bytes of sealed arenas that no
    walk reached -> bytes gc could reclaim there."""
    with open_store(path, writable=False) as s:
        cat = Catalog.load(s)
        seen = set()
        todo = [r for r in roots(cat)]
        if s.mode == "hash" and cat.ref is not None:
            todo += [cat.ref, cat._blob.ref]
        while todo:
            r = todo.pop()
            if r == s.null_ref or r in seen:
                continue
            seen.add(r)
            btype, data = _typed(s, r)
            if btype == F.TREE:
                todo += [data[i:i + s.ref_size] for i in range(0, len(data), s.ref_size)]
        total = 0
        last = s.log.open.n if s.mode == "hash" else s.log.open.n + 1
        for n in range(last):
            if n == s.log.open.n:
                keys, addrs, end = bytes(s.log.open.keys), list(s.log.open.addrs), s.log.open.end
            else:
                keys, addrs, _ = s._summary_file(n)
                end = s.log.trailer(n).end
            offs = [a & 0xFFFFFFFF for a in addrs] + [end]
            for i, a in enumerate(addrs):
                ref = keys[i * 32:(i + 1) * 32] if s.mode == "hash" else a.to_bytes(8, "big")
                if ref not in seen:
                    total += offs[i + 1] - offs[i]
        return total


def _typed(s, ref):
    if s.mode == "hash":
        a = s._locate(ref) or next(iter(s.index.lookup(ref)))
    else:
        a = int.from_bytes(ref, "big")
    btype, _key, data = s.log.read(a)
    return btype, data


def files(path):
    out = {}
    for d, _, names in os.walk(path):
        for x in names:
            if x not in ("lock", "readers"):
                with open(os.path.join(d, x), "rb") as f:
                    out[os.path.relpath(os.path.join(d, x), path)] = hashlib.sha256(f.read()).hexdigest()
    return out


def log_bytes(path):
    d = os.path.join(path, "arenas")
    return sum(os.path.getsize(os.path.join(d, x)) for x in os.listdir(d))


@pytest.mark.parametrize("mode", ["hash", "value"])
def test_gc_reclaims_what_forgotten_snapshots_alone_held(tmp_path, capsys, mode):
    store = make_store(tmp_path / "s", mode=mode, encrypt=False)
    history = churn_days(tmp_path, capsys, store)
    forget(store, {2, 4})  # two big files gone; day 6's stays
    assert restores(store, history) == [1, 3, 5, 6]
    want = unreachable(store)
    assert want > 2 * BIG * 0.9  # what the oracle says only days 2 and 4 held

    before = files(store)
    rc, out, _ = cli(capsys, store, "gc", "--dry-run", "--min-garbage", "0")
    assert rc == 0 and "nothing changed" in out
    assert files(store) == before

    size = log_bytes(store)
    rc, out, _ = cli(capsys, store, "gc", "--min-garbage", "0")
    assert rc == 0, out
    freed = size - log_bytes(store)
    # Everything unreachable is given back, less the bigger trailers of rewritten arenas.
    assert want - 64 * 40 <= freed <= want + 4096, (want, freed)
    assert restores(store, history) == [1, 3, 5, 6]
    with open_store(store, writable=False) as s:
        damage, _ = verify(s)
        assert damage == []
    assert unreachable(store) <= 4096  # at most the last catalog's leftovers

    # A second gc has nothing left worth doing; new snapshots still dedup against kept data.
    rc, out, _ = cli(capsys, store, "gc")
    assert rc == 0 and "reclaimed 0 B" in out
    img = bytearray(history[6])
    write(tmp_path / "disk.raw", img)
    assert cli(capsys, store, "import-image", "vm", tmp_path / "disk.raw", "--at", day(7))[0] == 0
    history[7] = history[6]
    assert log_bytes(store) - (size - freed) < 64 << 10  # day 7 == day 6: only the catalog grew
    assert restores(store, history) == [1, 3, 5, 6, 7]


@pytest.mark.parametrize("mode", ["hash", "value"])
def test_data_shared_with_kept_snapshots_stays(tmp_path, capsys, mode):
    store = make_store(tmp_path / "s", mode=mode, encrypt=True, key_file=str(tmp_path / "k"))
    os.environ["FOUNDATION_KEY_FILE"] = str(tmp_path / "k")
    try:
        history = churn_days(tmp_path, capsys, store, days=4)
        forget(store, {1, 2, 3})  # only day 4 kept: everything it shares with them stays
        size = log_bytes(store)
        assert cli(capsys, store, "gc", "--min-garbage", "0")[0] == 0
        assert log_bytes(store) < size
        with open_store(store, writable=False, key_file=str(tmp_path / "k")) as s:
            x = Catalog.load(s).snapshots("vm")
            assert [y.time.day for y in x] == [4]
            r = ImageReader(s, x[0].disks["vda"].root)
            assert r.read(0, r.size) == history[4]
            assert verify(s)[0] == []
    finally:
        del os.environ["FOUNDATION_KEY_FILE"]


def test_target_free_stops_early_and_the_next_gc_goes_on(tmp_path, capsys):
    store = make_store(tmp_path / "s", mode="hash")
    history = churn_days(tmp_path, capsys, store)
    forget(store, {2, 4})
    size = log_bytes(store)
    rc, out, _ = cli(capsys, store, "gc", "--min-garbage", "0", "--target-free", "1")
    assert rc == 0 and "stopped early: --target-free" in out and "rewrote 1 of" in out
    mid = log_bytes(store)
    assert mid < size
    assert restores(store, history) == [1, 3, 5, 6]
    rc, out, _ = cli(capsys, store, "gc", "--min-garbage", "0")
    assert rc == 0 and "stopped early" not in out
    assert log_bytes(store) < mid
    assert restores(store, history) == [1, 3, 5, 6]


def test_gc_and_readers_exclude_each_other(tmp_path, capsys):
    store = make_store(tmp_path / "s")
    churn_days(tmp_path, capsys, store, days=2)
    reader = open_store(store, writable=False)
    try:
        rc, _, err = cli(capsys, store, "gc")
        assert rc == StoreBusy.code and "open for reading" in err and "/snapshot" in err
    finally:
        reader.close()
    with open_store(store) as s:
        s.exclusive()
        with pytest.raises(StoreBusy, match="garbage collection is running"):
            open_store(store, writable=False)


def test_damaged_record_healed_by_a_later_copy_is_dropped(tmp_path, capsys):
    store = make_store(tmp_path / "s")
    history = churn_days(tmp_path, capsys, store, days=2)
    # Damage the first record of arena 0 (a leaf of day 1), let verify note it,
    # and archive day 2 again: the block is stored again (healing).
    with open(os.path.join(store, "arenas", F.arena_name(0)), "r+b") as f:
        f.seek(72 + 64 + 10)
        f.write(b"XXXX")
    with open_store(store) as s:
        damage, _ = verify(s)
        assert [(d.arena, d.offset) for d in damage if d.record] == [(0, 72)]
    write(tmp_path / "disk.raw", history[1])
    assert cli(capsys, store, "import-image", "vm", tmp_path / "disk.raw", "--at", day(3))[0] == 0
    history[3] = history[1]
    with open_store(store) as s:
        rep = collect(s, min_garbage=0.0)
        assert 0 in rep.rewritten and rep.blocked == []
    assert restores(store, history) == [1, 2, 3]
    with open_store(store, writable=False) as s:
        assert verify(s)[0] == []


def test_unhealed_damage_blocks_only_its_arena(tmp_path, capsys):
    store = make_store(tmp_path / "s")
    churn_days(tmp_path, capsys, store, days=4)
    forget(store, {2})
    with open(os.path.join(store, "arenas", F.arena_name(0)), "r+b") as f:
        f.seek(72 + 64 + 10)
        f.write(b"XXXX")
    with open_store(store) as s:
        verify(s)
        rep = collect(s, min_garbage=0.0)
    assert rep.blocked and rep.blocked[0][0] == 0 and "damaged" in rep.blocked[0][1]
    assert 0 not in rep.rewritten and rep.rewritten


CRASHER = """
import sys
from foundation.cli import main
sys.exit(main(sys.argv[1:]))
"""


def run_gc(store, crash=None, *args):
    env = dict(os.environ, PYTHONPATH=ROOT)
    if crash:
        env["FOUNDATION_GC_CRASH"] = crash
    return subprocess.run([sys.executable, "-c", CRASHER, "--store", store, "gc", "--min-garbage", "0", *args],
                          env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("mode", ["hash", "value"])
def test_gc_killed_at_any_point_resumes(tmp_path, capsys, mode):
    pristine = make_store(tmp_path / "pristine", mode=mode)
    history = churn_days(tmp_path, capsys, pristine)
    forget(pristine, {2, 4})
    reference = str(tmp_path / "reference")
    import shutil
    shutil.copytree(pristine, reference)
    assert run_gc(reference).returncode == 0
    final = log_bytes(reference)

    points = ["gc.written", "gc.journaled"] if mode == "value" else \
        ["gc.written", "gc.written:3", "gc.swapped", "gc.swapped:2", "gc.swapped:5"]
    for point in points:
        trial = str(tmp_path / f"trial-{point.replace(':', '-')}")
        shutil.copytree(pristine, trial)
        p = run_gc(trial, point)
        assert p.returncode == 137 and "test crash" in p.stderr, p.stderr
        assert restores(trial, history) == [1, 3, 5, 6] if mode == "hash" or point == "gc.written" \
            else True  # a pending value-mode switch: readers wait for a writer to finish it
        with open_store(trial) as s:  # a writer finishes or discards what gc left
            assert not [x for x in os.listdir(os.path.join(trial, "arenas")) if x.endswith(".gc")]
            assert verify(s)[0] == []
        assert restores(trial, history) == [1, 3, 5, 6]
        assert run_gc(trial).returncode == 0
        assert restores(trial, history) == [1, 3, 5, 6]
        assert abs(log_bytes(trial) - final) <= 64 * 8, (point, log_bytes(trial), final)
