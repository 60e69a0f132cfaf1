"""An older catalog put back beside a newer head: caught before anything is written, and no replica loses a day.

The newest catalog record lives in the newest arena. Put that arena back
as an older copy (a file restored from an image, an rsync of arenas/, a
cloned disk whose head was kept) and the newest readable catalog is an
older one: days 1–3 are listed, day 4 is not. A writer going on from there
would write the next catalog after the older one and day 4 would be gone
for good. So: the host's record of the newest commit it saw (the record at
its last offset has another tag, or none) makes every writer refuse (exit
26) with nothing written, locally or remotely; readers read and say so.
Without that record (another host), the replica's newest commit becomes
the host's first record and writers refuse as well; accepted, `replicate`
still never drops the replica's newer days (exit 54), and the replica
alone brings day 4 back.
With the whole arena set put back older, the newest arena is missing:
writers refuse (exit 20) as for a lost newest arena.
"""

import json
import os
import shutil
from urllib.parse import urlparse

import pytest
from servers import local_server  # noqa: F401
from test_input import store_files
from test_replica import VM, Site, fresh, tree_hashes

from foundation.catalog import CATALOG
from foundation.store import Store
from foundation.store import format as F

ROLLED_BACK, DAMAGED, REPLICA_AHEAD = 26, 20, 54


def put_back(site, older, what, n):
    """The newest catalog's arena n (`open`), or every arena (`arenas`), as the older copy holds them."""
    ad = os.path.join(site.store, "arenas")
    if what == "open":
        shutil.copyfile(older / "arenas" / F.arena_name(n), os.path.join(ad, F.arena_name(n)))
    else:
        shutil.rmtree(ad)
        shutil.copytree(older / "arenas", ad)


def lists(site, days):
    rc, out, err = site.cli("list")
    assert rc == 0 and [ln.split()[2] for ln in out.splitlines()[1:]] == [f"2024-05-{d:02d}" for d in days], out
    return err


@pytest.mark.parametrize("what", ["open", "arenas"])
@pytest.mark.parametrize("with_replica", [False, True])
@pytest.mark.parametrize("mode", ["hash", "value"])
def test_an_older_catalog_is_caught_and_nothing_is_written(request, tmp_path, capsys, what, with_replica, mode):
    site = Site(tmp_path, capsys, mode=mode, size=1 << 20)
    srv = fresh(request, "file") if with_replica else None
    if srv:
        site.use(srv)
    older = tmp_path / "older-copy"
    for d in (1, 2, 3):
        site.day(d)
    shutil.copytree(site.store, older)
    site.day(4, changes=1 if what == "open" else 80)   # 80 blocks: day 4 begins a new arena
    newest = dict(site.history)
    with Store.open(site.store, key_file=site.key) as s:
        n = F.split(s.address(s.latest(CATALOG)))[0]
        assert n == s.log.open.n
    # `open`: the same arena, older (shorter); `arenas`: a copy from before the newest arena existed.
    assert (older / "arenas" / F.arena_name(n)).exists() == (what == "open")
    put_back(site, older, what, n)
    kept = [1, 2, 3]
    remote = tree_hashes(urlparse(srv.url).path) if srv else None

    rc, out, err = site.cli("verify")
    if what == "open":   # the record the host saw last is not there: another history
        assert rc == ROLLED_BACK and "ROLLED BACK" in out and "another history" in out, out + err
    else:                # the newest arena is gone: damage, naming the catalog that may be lost with it
        assert rc == 1 and "arena file is missing" in out and "older than lost bytes" in out, out + err
    err = lists(site, kept)
    assert "snapshots taken after the newest one listed may be lost" in err, err
    before = store_files(site.store)
    site.image.write_bytes(newest[4])
    writers = [["import-image", VM, site.image, "--at", "2024-05-05T01:00:00Z"], ["archive", "--all"], ["gc"],
               ["rebuild"], ["forget", f"{VM}@2024-05-01T01:00:00Z"], ["prune", "--keep-daily", "1"]]
    for args in writers + ([["replicate"]] if srv else []):
        rc, out, err = site.cli(*args)
        if what == "open":
            assert rc == ROLLED_BACK and "this host saw" in err and "accept-rollback" in err, (args, rc, out + err)
        else:
            assert rc == DAMAGED and "arena" in err and "missing" in err, (args, rc, out + err)
        assert "Traceback" not in err
        assert store_files(site.store) == before, args    # not a byte of the store changed
    if srv:
        assert tree_hashes(urlparse(srv.url).path) == remote   # nor of the replica

        # Another host, which never saw the newer commit: the damage still stops replicate.
        shutil.rmtree(os.environ["FOUNDATION_STATE_DIR"])
        rc, out, err = site.cli("replicate")
        assert rc == DAMAGED and ("ends before the committed end" in err or "missing" in err), out + err
        assert tree_hashes(urlparse(srv.url).path) == remote
        assert store_files(site.store) == before
        if what == "open":
            # That host has no record, but the replica has: its manifest's commit ends in a record
            # the older arena lacks, so the import refuses (foundation.replica.seed).
            rc, out, err = site.cli("import-image", VM, site.image, "--at", "2024-05-05T01:00:00Z")
            assert rc == ROLLED_BACK and "replica offsite holds" in err and "accept-rollback" in err, out + err
            assert store_files(site.store) == before
            # Accepted deliberately, the import goes on after the older catalog; its replicate, and
            # any later one, keep day 4.
            assert site.cli("accept-rollback")[0] == 0
            rc, out, err = site.cli("import-image", VM, site.image, "--at", "2024-05-05T01:00:00Z")
            assert rc == 0, out + err
            rc, out, err = site.cli("replicate")
            assert rc == REPLICA_AHEAD and "holds a newer state of this store" in err and "Nothing was sent" in err
            assert tree_hashes(urlparse(srv.url).path) == remote
        rc, out, err = site.cli("recover", "--from", "offsite", "--store", tmp_path / "from-replica")
        assert rc == 0, out + err
        site.restores(store=tmp_path / "from-replica")          # every day, 4 included, byte for byte
    site.history = {d: newest[d] for d in kept}
    site.restores()                                            # the older days still restore


def test_a_zeroed_last_record_is_damage_not_another_history(tmp_path, capsys):
    """The host compares the tag of the last record it saw: zeroed there (a lost page), that record is
    damage, which verify names (exit 1), not an older copy (exit 26)."""
    site = Site(tmp_path, capsys, size=1 << 20)
    site.day(1)
    site.day(2)
    with open(os.path.join(os.environ["FOUNDATION_STATE_DIR"], "heads.json")) as f:
        seen = next(iter(json.load(f).values()))
    with open(os.path.join(site.store, "arenas", F.arena_name(seen["arena"])), "r+b") as f:
        f.seek(seen["last"])
        f.write(bytes(64))
    rc, out, err = site.cli("verify")
    assert rc == 1 and "ROLLED BACK" not in out and "DAMAGED" in out, out + err
    site.restores()
