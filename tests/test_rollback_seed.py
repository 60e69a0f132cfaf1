"""A host with no record of a store (new, reinstalled, its state directory lost) takes the replicas' newest commit.

Without it, a store put back to an older copy would be written on: only
the replica would keep the newer days. With it, every writer refuses
(exit 26) before a byte is written, locally or remotely, and says which
replica holds the newer commit; `accept-rollback` still takes the older
copy deliberately. A replica left behind seeds nothing, and one that
cannot be reached costs a one-line warning, not the archive.
"""

import json
import os
import shutil

import pytest
from servers import local_server  # noqa: F401
from test_input import store_files
from test_replica import VM, Site, fresh
from test_rollback import days_then_older_copy, restore_image

from foundation.config import load_config
from foundation.replica import replicas_from_config
from foundation.replica.seed import seed
from foundation.store.rollback import FILE, Watch

ROLLED_BACK, REPLICA_AHEAD = 26, 54


def state():
    return os.environ["FOUNDATION_STATE_DIR"]


def record():
    with open(os.path.join(state(), FILE)) as f:
        return next(iter(json.load(f).values()))


def contents(srv):
    return {name: srv.read(name) for name in srv.stored()}


@pytest.mark.parametrize("kind,mode", [("file", "hash"), ("file", "value"), ("ftp", "hash"), ("s3", "value")])
def test_an_older_copy_on_a_host_without_a_record_is_refused(request, tmp_path, capsys, kind, mode):
    site = Site(tmp_path, capsys, mode=mode)
    srv = fresh(request, kind)
    site.use(srv)
    newer = days_then_older_copy(site, tmp_path)   # days 3 and 4 replicated by the import's hook
    shutil.rmtree(state())                         # a new host: it never saw days 3 and 4
    remote = contents(srv)
    site.image.write_bytes(newer[4])
    before = store_files(site.store)
    for args in (["import-image", VM, site.image, "--at", "2024-05-05T01:00:00Z"], ["archive", "--all"], ["gc"]):
        rc, out, err = site.cli(*args)
        assert rc == ROLLED_BACK, (args, rc, out + err)
        assert "replica offsite holds arena" in err and "older copy" in err and "accept-rollback" in err, err
        assert "Traceback" not in err
        assert store_files(site.store) == before, args   # not a byte of the store changed
    assert contents(srv) == remote                        # nor of the replica
    assert record()["from"] == "replica offsite"

    rc, out, err = site.cli("accept-rollback")
    assert rc == 0 and "accepted" in out and "replica offsite holds" in out, out + err
    assert "from" not in record()
    site.history = {d: newer[d] for d in (1, 2)}
    site.day(5)                                    # writing on from the older copy, deliberately
    rc, _, err = site.cli("replicate")
    assert rc == REPLICA_AHEAD and "newer state" in err, err   # the replica keeps days 3 and 4
    site.restores()


@pytest.mark.parametrize("kind", ["file", "ftp"])
def test_the_seeded_record_is_the_one_the_host_kept(request, tmp_path, capsys, kind):
    """The replica's manifest head and its open arena's last commit record are what the host itself
    recorded; with no rollback the record is seeded and the archive writes on."""
    site = Site(tmp_path, capsys)
    srv = fresh(request, kind)
    site.use(srv)
    for d in (1, 2, 3):
        site.day(d)
    kept = record()
    assert kept["last"], kept                      # the head ends in a commit record
    shutil.rmtree(state())
    with site.local() as local:
        assert seed(Watch(state()), local, replicas_from_config(load_config(str(site.config)))) == "offsite"
    seeded = record()
    assert seeded["from"] == "replica offsite"
    assert {k: seeded[k] for k in ("arena", "end", "chain", "last", "tag")} == \
        {k: kept[k] for k in ("arena", "end", "chain", "last", "tag")}

    shutil.rmtree(state())
    site.day(4)                                    # seeds, finds the store at that commit, writes on
    now = record()
    assert "from" not in now and (now["arena"], now["end"]) > (kept["arena"], kept["end"]), now
    site.restores()


def test_a_replica_behind_the_store_seeds_nothing(request, tmp_path, capsys):
    site = Site(tmp_path, capsys)
    srv = fresh(request, "file")
    site.use(srv)
    site.day(1)
    site.day(2, config=False)                      # not replicated: the replica is a day behind
    shutil.rmtree(state())
    with site.local() as local:
        assert seed(Watch(state()), local, replicas_from_config(load_config(str(site.config)))) is None
    assert not os.path.exists(os.path.join(state(), FILE))
    site.day(3)
    site.restores()


def test_an_unreachable_replica_warns_and_the_archive_goes_on(tmp_path, capsys, caplog):
    """The documented limit: with no replica readable, the host's first record is the store's own,
    so an older copy put back before that first use goes unnoticed."""
    site = Site(tmp_path, capsys)
    site.day(1)
    older = tmp_path / "older-copy"
    shutil.copytree(site.store, older)
    site.day(2)
    restore_image(site, older)
    shutil.rmtree(state())
    site.config = tmp_path / "down.toml"
    site.config.write_text('[replicas.down]\nurl = "ftp://user:pw@127.0.0.1:9/x"\ntimeout = 2\n')
    site.image.write_bytes(site.history[2])
    rc, out, err = site.cli("import-image", VM, site.image, "--at", "2024-05-03T01:00:00Z")
    assert rc == 0, out + err
    warned = [r.getMessage() for r in caplog.records if "replica down was not read" in r.getMessage()]
    assert len(warned) == 1 and "going on without it" in warned[0] and "\n" not in warned[0], warned
    assert "from" not in record()


def test_a_manifest_that_fails_its_checks_warns_and_seeds_nothing(request, tmp_path, capsys, caplog):
    site = Site(tmp_path, capsys)
    srv = fresh(request, "file")
    site.use(srv)
    site.day(1)
    manifest = bytearray(srv.read("manifest"))
    manifest[manifest.index(b'"written":"') + 11] ^= 1      # a changed byte the MAC covers
    srv.write("manifest", bytes(manifest))
    shutil.rmtree(state())
    with site.local() as local:
        assert seed(Watch(state()), local, replicas_from_config(load_config(str(site.config)))) is None
    warned = [r.getMessage() for r in caplog.records if "replica offsite was not read" in r.getMessage()]
    assert len(warned) == 1 and "fails its MAC" in warned[0], warned
    assert not os.path.exists(os.path.join(state(), FILE))
