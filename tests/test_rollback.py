"""A store put back to an older copy (a restored disk image, rsync, a cloned disk) is caught before anything is written.

The host keeps the newest commit it saw of each store (the state
directory), the replica its manifest: every writer refuses an older store
with exit 26 and changes no byte of it or of the replica; readers read
and say so; `accept-rollback` takes it deliberately, and even then
replicate keeps the replica's newer days unless forced (exit 54).
"""

import os
import shutil

import pytest
from servers import local_server  # noqa: F401
from test_input import store_files
from test_replica import VM, Site, fresh


ROLLED_BACK = 26


def restore_image(site, older):
    """Put the older copy of the disk back, as a restored image would: head and arenas as they were."""
    shutil.rmtree(site.store)
    shutil.copytree(older, site.store)


def days_then_older_copy(site, tmp_path):
    """Days 1-4 archived, then the copy of the disk made after day 2 put back -> the history of days 1-4."""
    site.day(1)
    site.day(2)
    older = tmp_path / "older-copy"
    shutil.copytree(site.store, older)
    site.day(3)
    site.day(4)
    newer = dict(site.history)
    restore_image(site, older)
    return newer


@pytest.fixture(params=["hash", "value"])
def site(request, tmp_path, capsys):
    return Site(tmp_path, capsys, mode=request.param)


@pytest.mark.parametrize("with_replica", [False, True])
def test_every_writer_refuses_an_older_copy_and_changes_nothing(request, site, tmp_path, with_replica):
    srv = fresh(request, "file") if with_replica else None
    if srv:
        site.use(srv)
    newer = days_then_older_copy(site, tmp_path)
    remote = srv.stored() if srv else None

    rc, out, err = site.cli("verify")
    assert rc == ROLLED_BACK and "ROLLED BACK" in out and "older copy" in out, out + err
    rc, out, err = site.cli("list")
    assert rc == 0 and "older copy" in err and out.count(VM) == 2, out + err
    site.image.write_bytes(newer[4])
    before = store_files(site.store)                  # the readers above made only their lock file
    for args in (["import-image", VM, site.image, "--at", "2024-05-05T01:00:00Z"], ["gc"],
                 ["archive", "--all"], ["rebuild"], ["replicate"] if srv else ["prune", "--keep-daily", "1"]):
        rc, out, err = site.cli(*args)
        assert rc == ROLLED_BACK, (args, rc, out + err)
        assert "arena" in err and "this host saw" in err and "accept-rollback" in err, err
    assert store_files(site.store) == before          # not a byte of the store changed
    if srv:
        assert srv.stored() == remote            # nor of the replica

    rc, out, err = site.cli("accept-rollback")
    assert rc == 0 and "accepted" in out, out + err
    assert site.cli("verify")[0] == 0
    site.history = {d: newer[d] for d in (1, 2)}
    site.restores()
    site.day(5)                                  # writing on from the older copy, deliberately
    if srv:
        # the replica still holds days 3 and 4, which the store lacks: kept unless forced
        rc, _, err = site.cli("replicate")
        assert rc == 54 and "newer state" in err, err
        assert site.cli("recover", "--from", "offsite", "--store", tmp_path / "newer")[0] == 0
        site.history, kept = {d: newer[d] for d in (1, 2, 3, 4)}, site.history
        site.restores(store=tmp_path / "newer")
        site.history = kept
        assert site.cli("replicate", "--force")[0] == 0
    site.restores()


def test_a_newer_commit_elsewhere_is_not_a_rollback(site):
    """Opening a store that moved on (written on another host) is fine, and moves the record on."""
    site.day(1)
    site.day(2)
    state = os.environ["FOUNDATION_STATE_DIR"]
    shutil.rmtree(state)                          # this host forgot it: another host wrote day 2
    assert site.cli("list")[0] == 0
    site.day(3)
    assert site.cli("verify")[0] == 0


def test_a_rewritten_older_copy_is_caught_by_its_chain(site, tmp_path):
    """An older copy written on elsewhere until it passed the position this host saw: the chain of
    arenas differs, so it is still not the store this host knew."""
    site.day(1)
    older = tmp_path / "older-copy"
    shutil.copytree(site.store, older)
    state = os.environ["FOUNDATION_STATE_DIR"]
    saved = tmp_path / "state"
    for d in range(2, 5):
        site.day(d)
    shutil.copytree(state, saved)
    restore_image(site, older)
    shutil.rmtree(state)
    for d in range(5, 12):                        # on another host, which knew nothing newer
        site.day(d, changes=60)
    shutil.rmtree(state)
    shutil.copytree(saved, state)
    rc, out, err = site.cli("verify")
    assert rc == ROLLED_BACK and "another history" in out, out + err
