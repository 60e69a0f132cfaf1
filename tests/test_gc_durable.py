"""gc and the commit point: a gc ends with a commit record, and an interrupted gc never stops a replica.

A compare-by-value gc rewrites the log and writes the new head to both
copies; its new open arena ends with a commit record (docs/format.md
§6.1), so with both head copies lost right after it the log still gives
the newest commit. A gc killed at any point leaves the old or the new
arena set whole: `replicate` and `audit` read it (replicate finishes a
pending switch first, as a writer's open would, and says so), and a
store recovered from that replica alone restores every kept day.
"""

import fcntl
import os
import shutil

import pytest
from test_cli_images import cli
from test_gc import POINTS, churn_days, files, forget, gc_left_something, run_gc, serves
from test_image_support import make_store

from foundation.store import format as F
from foundation.store.primary import Primary

KEPT = (1, 3, 5, 6)


def gc_store(tmp_path, capsys, mode):
    """A store of 6 days with days 2 and 4 forgotten -> (path, {kept day: bytes}); mode "relayout":
    a compare-by-hash store that gc lays out again (`gc --relayout`)."""
    store = make_store(tmp_path / "store", mode="hash" if mode == "relayout" else mode)
    history = churn_days(tmp_path, capsys, store)
    forget(store, {2, 4})
    return store, {d: history[d] for d in KEPT}


def relayout(mode):
    """gc's arguments for the mode: "hash" rewrites arena by arena, "relayout" lays the log out."""
    return {"hash": ["--in-place"], "value": [], "relayout": ["--relayout"]}[mode]


@pytest.mark.parametrize("mode", ["hash", "value", "relayout"])
def test_every_head_copy_lost_right_after_gc_is_found_in_the_log(tmp_path, capsys, mode):
    store, kept = gc_store(tmp_path, capsys, mode)
    rc, out, err = cli(capsys, store, "gc", "--min-garbage", "0", *relayout(mode))
    assert rc == 0 and "reclaimed" in out, out + err
    with Primary(store) as p:
        want = p.commit()
        assert any(p.trailer(n).generation for n in range(want.arena))   # arenas were rewritten
    for name in F.HEADS:
        os.unlink(os.path.join(store, name))
    with Primary(store) as p:
        assert p.commit() == want     # generation, arena and end: the commit record at the end of the gc
    serves(capsys, store, kept)      # a reader, before any writer rewrote a head copy
    rc, out, _ = cli(capsys, store, "verify")
    assert rc == 1 and "head copy head is missing" in out, out
    rc, out, err = cli(capsys, store, "rebuild")
    assert rc == 0 and "every head copy was missing or damaged; rebuilt from the log" in out, out + err
    assert cli(capsys, store, "verify")[0] == 0
    serves(capsys, store, kept)


def audit_says(capsys, store, url):
    """`audit` of the replica at url -> the kinds of the problems it printed (rc 0 or 1, never a refusal)."""
    rc, out, err = cli(capsys, store, "audit", "--replica", url)
    assert rc in (0, 1) and "Traceback" not in err, (rc, out, err)
    kinds = {line.split()[0] for line in out.splitlines() if line.split() and line.split()[0].isupper()}
    assert (rc == 0) == (not kinds), (rc, out)
    return kinds


@pytest.mark.parametrize("mode", ["hash", "value", "relayout"])
def test_replicate_and_audit_go_on_through_an_interrupted_gc(tmp_path, capsys, caplog, mode):
    """At every point of a gc, killed: audit reads the store as it stands (the old or the new arena
    set) and finds the replica at most stale; replicate brings it up to date (finishing a pending
    switch, and saying so); a store recovered from the replica alone serves every kept day."""
    pristine, kept = gc_store(tmp_path, capsys, mode)
    site = tmp_path / "replica"
    site.mkdir()
    url = f"file://{site}/"
    rc, out, err = cli(capsys, pristine, "replicate", "--to", url, "--allow-plaintext")
    assert rc == 0, out + err
    for k, point in enumerate(POINTS[mode]):
        trial, remote = str(tmp_path / f"trial-{k}"), tmp_path / f"remote-{k}"
        shutil.copytree(pristine, trial)
        shutil.copytree(site, remote)
        url = f"file://{remote}/"
        os.environ["FOUNDATION_STATE_DIR"] = str(tmp_path / f"host-{k}")   # each copy is a store of its own
        p = run_gc(trial, point, *relayout(mode))
        assert p.returncode == 137 and "test crash" in p.stderr, (point, p.stderr)
        pending = os.path.exists(os.path.join(trial, "gc.json"))
        assert pending == (mode != "hash" and point != "gc.written"), point

        before = files(trial)
        assert audit_says(capsys, trial, url) <= {"STALE"}, point     # the replica is behind the new arenas
        assert files(trial) == before                                  # audit wrote nothing
        caplog.clear()
        rc, out, err = cli(capsys, trial, "replicate", "--to", url, "--allow-plaintext")
        assert rc == 0, (point, out, err)
        assert ("note: finished the switch of an interrupted gc" in out) == pending, (point, out)
        assert not os.path.exists(os.path.join(trial, "gc.json"))
        assert audit_says(capsys, trial, url) == set(), point
        serves(capsys, trial, kept)

        recovered = str(tmp_path / f"recovered-{k}")
        rc, out, err = cli(capsys, trial, "recover", "--from", url, "--store", recovered)
        assert rc == 0, (point, out, err)
        serves(capsys, recovered, kept)
        # The next writer finishes what is left (a stray rewritten arena, a dirty index).
        rc, _, err = cli(capsys, trial, "import-image", "vm", tmp_path / "disk.raw", "--at", "2024-06-01")
        assert rc == 0, err
        assert not gc_left_something(trial)
        shutil.rmtree(recovered)
        shutil.rmtree(remote)


def test_replicate_beside_a_writer_reads_the_pending_switch_as_it_stands(tmp_path, capsys):
    """While a writer holds the store (it finishes the switch itself), replicate sends the switch's new
    arena set as it stands on disk, consistently: the replica recovers every kept day."""
    store, kept = gc_store(tmp_path, capsys, "value")
    p = run_gc(store, "gc.journaled")
    assert p.returncode == 137 and os.path.exists(os.path.join(store, "gc.json"))
    fd = os.open(os.path.join(store, F.LOCK), os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)       # a writer's lock, as an archive holds it
    try:
        url = f"file://{tmp_path / 'replica'}/"
        os.makedirs(tmp_path / "replica")
        rc, out, err = cli(capsys, store, "replicate", "--to", url, "--allow-plaintext")
        assert rc == 0 and "finished the switch" not in out, out + err
        assert os.path.exists(os.path.join(store, "gc.json"))       # still the writer's to finish
        assert audit_says(capsys, store, url) == set()
    finally:
        os.close(fd)
    rc, out, err = cli(capsys, store, "recover", "--from", url, "--store", tmp_path / "recovered")
    assert rc == 0, out + err
    serves(capsys, str(tmp_path / "recovered"), kept)
