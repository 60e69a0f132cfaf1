"""A lost newest catalog record: `rebuild --salvage` lists its days again from the catalog blob in the log.

The record names the blob; the blob (a tree of JSON lines beginning with
the header line) was written just before it. With the record damaged, the
days it alone listed are missing from `list` until `rebuild --salvage`
finds that blob and commits it again; with the blob lost too, it says
from when on snapshots cannot be named. A blob whose record was never
written (a crash before it) is no lost list and is never taken.
"""

import json
import os
import random

import pytest
from test_cli_images import cli, day, write
from test_image_support import make_store, open_store

from foundation.catalog import CATALOG, Catalog
from foundation.image import write_blob
from foundation.store import format as F
from foundation.store import layout as L

DAYS = 24        # enough lines that the catalog blob is a tree of several leaves


@pytest.fixture(params=["hash", "value"])
def archived(request, tmp_path, capsys):
    """(store, {day: image bytes}) of DAYS days of a small image."""
    # run=1: the tests cut the log at byte distances sized for records of one block each (with
    # runs the leaves of the catalog blob compress together, and 12 KiB reaches back a day more)
    store = make_store(tmp_path / "store", mode=request.param, run=1)
    rng = random.Random(3)
    img = bytearray(rng.randbytes(64 << 10))
    image = tmp_path / "disk.raw"
    history = {}
    for d in range(1, DAYS + 1):
        img[rng.randrange(16) * 4096:][:4096] = rng.randbytes(4096)
        write(image, img)
        assert cli(capsys, store, "import-image", "vm", image, "--at", day(d))[0] == 0
        history[d] = bytes(img)
    with open_store(store, writable=False) as s:
        blob = Catalog.load(s).blob
        assert blob.depth >= 1 and blob.size > 4096
    return store, history


def newest_record(store):
    """(arena file, offset) of the newest CATALOG record."""
    with open_store(store, writable=False) as s:
        n, off = F.split(s.address(s.latest(CATALOG)))
    return os.path.join(store, F.ARENAS, F.arena_name(n)), off


def listed(capsys, store):
    rc, out, err = cli(capsys, store, "list", "vm", "--json")
    assert rc == 0, err
    return sorted(int(x["time"][8:10]) for x in json.loads(out)), err


def test_the_lost_records_days_are_listed_again(archived, tmp_path, capsys):
    store, history = archived
    path, off = newest_record(store)
    with open(path, "r+b") as f:          # one bit of the record's payload: the record is lost, nothing else
        f.seek(off + L.HEADER_SIZE + 20)
        b = f.read(1)
        f.seek(off + L.HEADER_SIZE + 20)
        f.write(bytes([b[0] ^ 1]))
    days, err = listed(capsys, store)
    assert days == list(range(1, DAYS)) and "may be lost" in err
    rc, out, err = cli(capsys, store, "rebuild", "--salvage")
    assert rc == 0, out + err
    assert "catalog: the newest catalog record was lost; its list was found in the log" in out
    assert f"catalog: listed again: vm@{day(DAYS)}" in out.replace(".000000Z", "Z"), out
    days, err = listed(capsys, store)
    assert days == list(range(1, DAYS + 1)) and "may be lost" not in err, err
    for d in (1, DAYS - 1, DAYS):
        rc, _, err = cli(capsys, store, "restore", f"vm@{day(d)}", tmp_path / "out.raw", "--force")
        assert rc == 0, err
        assert (tmp_path / "out.raw").read_bytes() == history[d]
    # The next day is added to the list brought back.
    write(tmp_path / "disk.raw", history[1])
    assert cli(capsys, store, "import-image", "vm", tmp_path / "disk.raw", "--at", day(DAYS + 1))[0] == 0
    assert listed(capsys, store)[0] == list(range(1, DAYS + 2))


def test_with_the_blob_lost_too_rebuild_says_what_cannot_be_named(archived, capsys):
    store, _ = archived
    path, off = newest_record(store)
    with open(path, "r+b") as f:          # the record and the blob's last leaves and root before it
        start = max(F.ARENA_HEADER_SIZE, off - 3 * 4096)
        f.seek(start)
        f.write(bytes(off + 200 - start))
    rc, out, err = cli(capsys, store, "rebuild", "--salvage")
    assert rc in (0, 1), out + err
    days, _ = listed(capsys, store)
    assert DAYS not in days
    after = days[-1]
    assert ("catalog: the newest catalog record is lost and the list it named is not intact in the log: "
            f"snapshots of any VM taken after {day(after)}") in out.replace(".000000Z", "Z"), out


def test_a_blob_whose_record_was_never_written_is_not_taken(archived, capsys):
    """A crash between the blob and its record leaves a list that was never committed."""
    store, _ = archived
    with open_store(store) as s:
        cat = Catalog.load(s)
        cat.forget([x.id for x in cat.snapshots()[:5]])
        write_blob(s, cat.serialize())    # the blob of a forget, and no record: as if killed before it
        s.sync()
    rc, out, err = cli(capsys, store, "rebuild", "--salvage")
    assert rc == 0 and "catalog:" not in out, out + err
    assert listed(capsys, store)[0] == list(range(1, DAYS + 1))
