"""`foundation gc`: space of forgotten snapshots comes back, kept ones restore, crashes resume."""

import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import pytest
from conftest import damage
from test_cli_images import ROOT, cli, day, write
from test_image_support import BS, content, make_store, open_store, seeded

from foundation.catalog import Catalog
from foundation.errors import DataCorrupt, StoreBusy
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


def forget(store, days, **kw):
    """Drop snapshots from the catalog in one commit, as `foundation forget` does."""
    with open_store(store, **kw) as s:
        cat = Catalog.load(s)
        cat.forget([x.id for x in cat.snapshots() if x.time.day in days])
        cat.commit(s)


def unreachable(path):
    """Bytes gc could reclaim: records of the arenas gc may rewrite that no kept snapshot reaches."""
    mode, records, seen, last = walk(path)
    return sum(size for ref, (a, size) in records.items() if ref not in seen and a >> 32 < last)


def walk(path):
    """Oracle, independent of gc's sweep: walk every kept tree from its roots
    (depth first, by refs) -> (mode, {ref: (address, record bytes)}, refs
    reached, first arena gc never rewrites)."""
    with open_store(path, writable=False) as s:
        cat = Catalog.load(s)
        records = {}  # ref -> (address, record bytes)
        for n in range(s.log.open.n + 1):
            if n == s.log.open.n:
                keys, addrs, end = bytes(s.log.open.keys), list(s.log.open.addrs), s.log.open.end
            else:
                keys, addrs, _ = s.summary_records(n)
                end = s.log.trailer(n).end
            offs = [a & 0xFFFFFFFF for a in addrs] + [end]
            for i, a in enumerate(addrs):
                ref = keys[i * 32:(i + 1) * 32] if s.mode == "hash" else a.to_bytes(8, "big")
                records[bytes(ref)] = (a, offs[i + 1] - offs[i])
        seen = set()
        todo = roots(cat)
        if s.mode == "hash" and cat.ref is not None:
            todo += [cat.ref, cat.blob.ref]
        while todo:
            r = bytes(todo.pop())
            if r == s.null_ref or r in seen:
                continue
            seen.add(r)
            btype, _key, data = s.log.read(records[r][0])
            if btype == F.TREE:
                todo += [data[i:i + s.ref_size] for i in range(0, len(data), s.ref_size)]
        # The open arena is never rewritten in hash mode; value mode rewrites it too.
        return s.mode, records, seen, s.log.open.n if s.mode == "hash" else s.log.open.n + 1


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
    # Everything unreachable is given back, less the bigger trailers of rewritten
    # arenas and the few records the mark's Bloom filter keeps by false positive (0.1 %).
    assert want * 0.97 - 64 * 40 <= freed <= want + 4096, (want, freed)
    assert restores(store, history) == [1, 3, 5, 6]
    with open_store(store, writable=False) as s:
        assert verify(s)[0] == []
    assert unreachable(store) <= 0.01 * want + 4096  # Bloom false positives, the last catalog's leftovers

    # A second gc has nothing left worth doing but what the first one's Bloom filter kept by
    # false positive (its seeds differ run to run); new snapshots still dedup against kept data.
    rc, out, _ = cli(capsys, store, "gc", "--json")
    assert rc == 0 and json.loads(out)["reclaimed"] <= 0.01 * want + 4096, out
    img = bytearray(history[6])
    write(tmp_path / "disk.raw", img)
    assert cli(capsys, store, "import-image", "vm", tmp_path / "disk.raw", "--at", day(7))[0] == 0
    history[7] = history[6]
    assert log_bytes(store) - (size - freed) < 64 << 10  # day 7 == day 6: only the catalog grew
    assert restores(store, history) == [1, 3, 5, 6, 7]


@pytest.mark.parametrize("mode", ["hash", "value"])
def test_data_shared_with_kept_snapshots_stays(tmp_path, capsys, monkeypatch, mode):
    key = str(tmp_path / "k")
    store = make_store(tmp_path / "s", mode=mode, encrypt=True, key_file=key)
    monkeypatch.setenv("FOUNDATION_KEY_FILE", key)
    history = churn_days(tmp_path, capsys, store, days=4)
    forget(store, {1, 2, 3}, key_file=key)  # only day 4 kept: everything it shares with them stays
    size = log_bytes(store)
    assert cli(capsys, store, "gc", "--min-garbage", "0")[0] == 0
    assert log_bytes(store) < size
    with open_store(store, writable=False, key_file=key) as s:
        x = Catalog.load(s).snapshots("vm")
        assert [y.time.day for y in x] == [4]
        r = ImageReader(s, x[0].disks["vda"].root)
        assert r.read(0, r.size) == history[4]
        assert verify(s)[0] == []


@pytest.mark.parametrize("limit,said", [(("--target-free", "1"), "--target-free reached"),
                                         (("--max-time", "0"), "--max-time 0s reached")])
def test_a_limit_stops_gc_early_and_the_next_gc_goes_on(tmp_path, capsys, limit, said):
    store = make_store(tmp_path / "s", mode="hash")
    history = churn_days(tmp_path, capsys, store)
    forget(store, {2, 4})
    size = log_bytes(store)
    rc, out, _ = cli(capsys, store, "gc", "--min-garbage", "0", *limit)
    assert rc == 0 and f"stopped early: {said}" in out, out
    mid = log_bytes(store)
    assert mid < size if limit[0] == "--target-free" else mid == size   # one arena, or none in no time
    assert restores(store, history) == [1, 3, 5, 6]
    rc, out, _ = cli(capsys, store, "gc", "--min-garbage", "0")
    assert rc == 0 and "stopped early" not in out
    assert log_bytes(store) < mid
    assert restores(store, history) == [1, 3, 5, 6]


def test_value_mode_says_limits_do_not_apply(tmp_path, capsys):
    store = make_store(tmp_path / "s", mode="value")
    history = churn_days(tmp_path, capsys, store, days=4)
    forget(store, {2})
    size = log_bytes(store)
    rc, out, err = cli(capsys, store, "gc", "--min-garbage", "0", "--target-free", "1")
    assert rc == 0 and "do not apply to a compare-by-value store" in err
    assert log_bytes(store) < size and restores(store, history) == [1, 3, 4]


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


def damaged_then_healed(tmp_path, capsys):
    """Damage the first record of arena 0 (a leaf of day 1), let verify note it, and archive day 1
    again as day 3: the block is stored again (healing). -> (store, history)."""
    store = make_store(tmp_path / "s")
    history = churn_days(tmp_path, capsys, store, days=2)
    damage(os.path.join(store, "arenas", F.arena_name(0)), 72 + 64 + 10, b"XXXX")
    with open_store(store) as s:
        assert [(d.arena, d.offset) for d in verify(s)[0] if d.record] == [(0, 72)]
    write(tmp_path / "disk.raw", history[1])
    assert cli(capsys, store, "import-image", "vm", tmp_path / "disk.raw", "--at", day(3))[0] == 0
    history[3] = history[1]
    return store, history


def test_damaged_record_healed_by_a_later_copy_is_dropped(tmp_path, capsys):
    store, history = damaged_then_healed(tmp_path, capsys)
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
    with open_store(store) as s:
        candidates = collect(s, min_garbage=0.0, dry_run=True).candidates
    # Damage a record a kept snapshot needs in an arena gc would rewrite.
    _, records, seen, _ = walk(store)
    live = sorted(a for ref, (a, _) in records.items() if ref in seen)
    n = next(c for c in candidates if any(a >> 32 == c for a in live))
    a = next(a for a in live if a >> 32 == n)
    with open(os.path.join(store, "arenas", F.arena_name(n)), "r+b") as f:
        f.seek((a & 0xFFFFFFFF) + 64 + 10)
        f.write(b"XXXX")
    with open_store(store) as s:
        verify(s)
        rep = collect(s, min_garbage=0.0)
    assert [b[0] for b in rep.blocked] == [n] and "damaged and still needed" in rep.blocked[0][1]
    assert n not in rep.rewritten and sorted(rep.rewritten) == sorted(c for c in candidates if c != n)
    with open_store(store, writable=False) as s:  # the damage is still reported, nothing else
        assert [(d.arena, d.offset) for d in verify(s)[0]] == [(n, a & 0xFFFFFFFF)]


def where(path, ref):
    """Log addresses of every record named `ref` (compare-by-hash), oldest first."""
    with open_store(path, writable=False) as s:
        out = []
        for n in range(s.log.open.n + 1):
            if n == s.log.open.n:
                keys, addrs = bytes(s.log.open.keys), list(s.log.open.addrs)
            else:
                keys, addrs, _ = s.summary_records(n)
            out += [a for i, a in enumerate(addrs) if keys[i * 32:(i + 1) * 32] == ref]
        return out


def test_node_stored_after_its_parent_stays_live(tmp_path, capsys):
    # A dead parent survives a gc (its arena, the open one, is not rewritten) while
    # its dead child is dropped; archiving the same image again dedups onto the old
    # parent and stores the child after it: a ref that points forwards in the log.
    store = make_store(tmp_path / "s", mode="hash")
    rng = random.Random(1)
    half = 512 << 10  # 128 leaves: the root names two level-1 nodes
    a = rng.randbytes(2 * half)
    history = {1: a[:half] + rng.randbytes(half), 2: a, 3: a}  # day 1 shares the first node with day 2
    image = tmp_path / "disk.raw"
    for d in (1, 2):
        write(image, history[d])
        assert cli(capsys, store, "import-image", "vm", image, "--at", day(d))[0] == 0
    with open_store(store, writable=False) as s:
        root = Catalog.load(s).snapshots()[-1].disks["vda"].root
        child = s.read(root.ref)[:32]
    forget(store, {1, 2})
    assert cli(capsys, store, "gc", "--in-place")[0] == 0  # arena by arena: the open one stays
    assert where(store, root.ref) and not where(store, child)
    write(image, history[3])
    assert cli(capsys, store, "import-image", "vm", image, "--at", day(3))[0] == 0
    assert where(store, root.ref)[0] < where(store, child)[0]
    assert restores(store, history) == [3]
    assert cli(capsys, store, "gc", "--min-garbage", "0")[0] == 0
    assert restores(store, history) == [3]
    with open_store(store, writable=False) as s:
        assert verify(s)[0] == []


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


def gc_left_something(store):
    """An interrupted gc left work for the next writer: a journal, a rewritten arena, a dirty index."""
    adir = os.path.join(store, "arenas")
    try:
        with open(os.path.join(store, "index"), "rb") as f:
            dirty = F.IndexHeader.unpack(f.read(F.INDEX_HEADER_SIZE)).dirty
    except FileNotFoundError:  # deleted by a switch cut short: the journal is there
        dirty = False
    return bool(os.path.exists(os.path.join(store, "gc.json")) or dirty
                or [x for x in os.listdir(adir) if x.endswith(".gc")])


def serves(capsys, store, history):
    """`list` and `restore` of the CLI return every day of history ({day: bytes}), byte for byte."""
    rc, out, err = cli(capsys, store, "list", "vm", "--json")
    assert rc == 0, err
    assert sorted(int(x["time"][8:10]) for x in json.loads(out)) == sorted(history)
    for d, want in history.items():
        out_path = os.path.join(os.path.dirname(store), "out.raw")
        rc, _, err = cli(capsys, store, "restore", f"vm@{day(d)}", out_path, "--force")
        assert rc == 0, err
        with open(out_path, "rb") as f:
            assert f.read() == want, d


def read_only_commands_serve(capsys, store, history):
    """list, restore and verify work on what an interrupted gc left, return the exact bytes of every
    kept day, and change nothing on disk."""
    before = files(store)
    serves(capsys, store, history)
    rc, out, err = cli(capsys, store, "verify")
    assert rc == 0 and out.startswith("ok:"), (out, err)
    assert files(store) == before


# Every named point of gc: hash mode's per-arena rewrite and swap, value mode's rewrite, journal, and
# each step of the switch (the store's own points, foundation.store.switch.finish).
# "relayout" is a compare-by-hash store's `gc --relayout`, which switches through value mode's journal.
POINTS = {"hash": ["gc.written", "gc.written:3", "gc.swapped", "gc.swapped:2", "gc.swapped:5"],
          "value": ["gc.written", "gc.journaled", "gc.renamed", "gc.renamed:2", "gc.trimmed", "gc.headed"]}
POINTS["relayout"] = POINTS["value"]


@pytest.mark.parametrize("mode", ["hash", "value", "relayout"])
def test_gc_killed_at_any_point_never_locks_the_user_out(tmp_path, capsys, caplog, mode):
    args = {"hash": ["--in-place"], "value": [], "relayout": ["--relayout"]}[mode]  # "hash": arena by arena
    pristine = make_store(tmp_path / "pristine", mode="hash" if mode == "relayout" else mode)
    history = churn_days(tmp_path, capsys, pristine)
    forget(pristine, {2, 4})
    kept = {d: history[d] for d in (1, 3, 5, 6)}
    image = tmp_path / "day7.raw"
    write(image, history[6])
    after = {**kept, 7: history[6]}
    reference = str(tmp_path / "reference")
    shutil.copytree(pristine, reference)
    # Copies of one store are older copies of each other to a host that saw them: each has a host.
    os.environ["FOUNDATION_STATE_DIR"] = str(tmp_path / "host-reference")
    garbage = unreachable(reference)
    assert run_gc(reference, None, *args).returncode == 0
    assert cli(capsys, reference, "import-image", "vm", image, "--at", day(7))[0] == 0
    assert run_gc(reference, None, *args).returncode == 0
    final = log_bytes(reference)

    rng = random.Random(5)
    kills = [(p, None) for p in POINTS[mode]] + [(None, rng.uniform(0.2, 0.9)) for _ in range(6)]
    for k, (point, delay) in enumerate(kills):
        trial = str(tmp_path / f"trial-{k}")
        shutil.copytree(pristine, trial)
        os.environ["FOUNDATION_STATE_DIR"] = str(tmp_path / f"host-{k}")
        if point:
            p = run_gc(trial, point, *args)
            assert p.returncode == 137 and "test crash" in p.stderr, (point, p.stderr)
        else:
            p = subprocess.Popen([sys.executable, "-c", CRASHER, "--store", trial, "gc", "--min-garbage", "0", *args],
                                 env=dict(os.environ, PYTHONPATH=ROOT), stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
            time.sleep(delay)
            p.send_signal(signal.SIGKILL)
            p.wait()
        read_only_commands_serve(capsys, trial, kept)
        left = gc_left_something(trial)
        # The next writer finishes or undoes what gc left, and says so.
        caplog.clear()
        rc, _, err = cli(capsys, trial, "import-image", "vm", image, "--at", day(7))
        assert rc == 0, err
        said = [r.getMessage() for r in caplog.records if "interrupted" in r.getMessage()]
        assert bool(said) == left, (point, delay, said)
        assert not gc_left_something(trial)
        with open_store(trial, writable=False) as s:
            assert verify(s)[0] == []
        assert restores(trial, after) == [1, 3, 5, 6, 7]
        assert run_gc(trial, None, *args).returncode == 0
        assert restores(trial, after) == [1, 3, 5, 6, 7]
        # The same space as one uninterrupted gc, give or take the records
        # each run's Bloom filter keeps by false positive.
        assert abs(log_bytes(trial) - final) <= 0.01 * garbage + 512, (point, delay, log_bytes(trial), final)


@pytest.mark.parametrize("point", ["gc.written", "gc.swapped"])
def test_gc_killed_after_dropping_a_damaged_record(tmp_path, capsys, point):
    # As test_damaged_record_healed_by_a_later_copy_is_dropped, but gc is killed
    # around the swap of arena 0: damaged.json must never name an offset of the
    # rewritten file (there, the start of an intact live record).
    store, history = damaged_then_healed(tmp_path, capsys)
    with open_store(store) as s:
        candidates = collect(s, min_garbage=0.0, dry_run=True).candidates
    p = run_gc(store, f"{point}:{candidates.index(0) + 1}")
    assert p.returncode == 137 and "test crash" in p.stderr, p.stderr
    assert restores(store, history) == [1, 2, 3]
    with open_store(store) as s:
        # Still listed while the old file stands; never once the new one is in.
        assert (F.addr(0, 72) in s.bad) == (point == "gc.written")
    assert restores(store, history) == [1, 2, 3]
    assert run_gc(store).returncode == 0
    assert restores(store, history) == [1, 2, 3]
    with open_store(store) as s:
        assert verify(s)[0] == [] and s.bad == set()


# ---- damaged records the summaries do not show (second review) -------------------------------------

def live_tree_nodes(store):
    """[(address, ref, node bytes)] of the kept trees' TREE records in sealed arenas, oldest first."""
    _, records, seen, _ = walk(store)
    out = []
    with open_store(store, writable=False) as s:
        for ref in seen:
            a = records[ref][0]
            if a >> 32 < s.log.open.n:
                btype, _, data = s.log.read(a)
                if btype == F.TREE:
                    out.append((a, ref, data))
    return sorted(out)


def test_gc_stops_on_a_damaged_node_its_rebuilt_summary_leaves_out(tmp_path, capsys):
    """A summary rebuilt around a damaged tree node no longer lists it: gc cannot see what it names,
    so it must stop rather than drop the node's intact children."""
    store = make_store(tmp_path / "s", mode="hash")
    churn_days(tmp_path, capsys, store, days=4)
    forget(store, {2})
    a, ref, data = live_tree_nodes(store)[0]
    children = {data[i:i + 32] for i in range(0, len(data), 32)} - {bytes(32)}
    n, off = F.split(a)
    with open(os.path.join(store, "arenas", F.arena_name(n)), "r+b") as f:
        f.seek(off + 64 + 10)
        f.write(b"XXXX")
    rc, out, _ = cli(capsys, store, "rebuild")
    assert rc == 1 and "LOST" in out  # the days that need the node are named
    rc, out, err = cli(capsys, store, "gc", "--min-garbage", "0")
    assert rc == DataCorrupt.code and f"arena {n} offset {off}: a damaged record that no summary lists" in err, \
        out + err
    assert all(where(store, c) for c in children)      # nothing it names was dropped


def test_a_node_that_fails_its_score_is_never_expanded(tmp_path, capsys):
    """A tree record whose tag holds but whose content is wrong (verify: 'does not match its score'),
    healed by a later archive: gc marks from the intact copy, so the child only it names stays."""
    from foundation import native

    store = make_store(tmp_path / "s", mode="hash")
    history = churn_days(tmp_path, capsys, store, days=2)
    _, records, seen, _ = walk(store)
    with open_store(store, writable=False) as s:
        nodes = {}
        for ref in seen:
            btype, _, data = s.log.read(records[ref][0])
            if btype == F.TREE:
                nodes[ref] = data
        uses = {}
        for data in nodes.values():
            for i in range(0, len(data), 32):
                uses[data[i:i + 32]] = uses.get(data[i:i + 32], 0) + 1
        root = next(x for x in Catalog.load(s).snapshots("vm") if x.time.day == 1).disks["vda"].root.ref
        for ref in (nodes[root][i:i + 32] for i in range(0, len(nodes[root]), 32)):
            a = records.get(ref, (0,))[0]
            slots = [i for i in range(0, len(nodes.get(ref, b"")), 32) if uses.get(nodes[ref][i:i + 32]) == 1
                     and nodes[ref][i:i + 32] != bytes(32)]
            if ref in nodes and a >> 32 < s.log.open.n and slots:
                break
        else:
            raise AssertionError("no level-1 node with a child of its own in a sealed arena")
        n, off = F.split(a)
        child = nodes[ref][slots[0]:slots[0] + 32]
        wrong = bytearray(nodes[ref])
        wrong[slots[0]:slots[0] + 32] = os.urandom(32)
        rec, _ = native.pack(s.codec, n, s.log.iv(n), off, F.TREE, bytes(wrong), len(wrong), ref)
    assert len(rec) == records[ref][1]
    with open(os.path.join(store, "arenas", F.arena_name(n)), "r+b") as f:
        f.seek(off)
        f.write(rec)
    with open_store(store, writable=False) as s:
        assert [(d.arena, d.offset) for d in verify(s)[0]] == [(n, off)]
    write(tmp_path / "disk.raw", history[1])           # archiving heals: day 1 stored again
    assert cli(capsys, store, "import-image", "vm", tmp_path / "disk.raw", "--at", day(3))[0] == 0
    history[3] = history[1]
    forget(store, {2})
    del history[2]
    assert cli(capsys, store, "gc", "--min-garbage", "0")[0] == 0
    assert where(store, child)
    assert restores(store, history) == [1, 3]


def test_a_summary_of_the_arena_before_a_gc_swap_is_not_trusted(tmp_path, capsys):
    """A power loss can undo the summary's unlink but keep the arena's rename: the old summary,
    beside the rewritten arena, must be rebuilt, not read."""
    store = make_store(tmp_path / "s", mode="hash")
    history = churn_days(tmp_path, capsys, store, days=4)
    forget(store, {2})
    del history[2]
    d = os.path.join(store, "summaries")
    old = {x: open(os.path.join(d, x), "rb").read() for x in os.listdir(d)}
    assert cli(capsys, store, "gc", "--min-garbage", "0")[0] == 0
    for x, b in old.items():
        with open(os.path.join(d, x), "wb") as f:
            f.write(b)
    os.unlink(os.path.join(store, "index"))
    with open_store(store):
        pass
    assert restores(store, history) == [1, 3, 4]
    with open_store(store, writable=False) as s:
        assert verify(s)[0] == []


def test_a_damaged_data_record_no_summary_lists_does_not_stop_gc(tmp_path, capsys):
    """Stepped over in the open arena, a damaged data record names nothing: gc goes on."""
    store = make_store(tmp_path / "s", mode="hash")
    churn_days(tmp_path, capsys, store, days=4)
    _, records, seen, _ = walk(store)
    with open_store(store, writable=False) as s:
        a = next(a for ref, (a, _) in records.items() if ref in seen and a >> 32 == s.log.open.n
                 and s.log.read(a)[0] == F.DATA)
    n, off = F.split(a)
    with open(os.path.join(store, "arenas", F.arena_name(n)), "r+b") as f:
        f.seek(off + 64 + 10)
        f.write(b"XXXX")
    with open_store(store) as s:                       # stepped over, and remembered
        assert a in s.bad
    rc, out, err = cli(capsys, store, "gc", "--min-garbage", "0")
    assert rc == 0, out + err
    forget(store, {2})
    rc, out, err = cli(capsys, store, "gc", "--min-garbage", "0")
    assert rc == 0, out + err
    with open_store(store, writable=False) as s:       # nothing else was lost on the way
        assert [(d.arena, d.offset) for d in verify(s)[0]] == [(n, off)]
