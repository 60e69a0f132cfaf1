"""Naming the lost days in bulk names exactly what a restore fails on, day by day.

Several days of one image share most of their subtrees; a salvage scan
steps over a zeroed page in one arena and a tree node lost in another.
`Losses` (a level at a time, one C call for a day's leaf refs, each shared
subtree looked at once) must give, for every day, the byte ranges found by
reading every block of the day one by one, and the same ranges when
each day is asked on its own.
"""

import os
import random

import pytest
from test_cli_images import cli, day, write
from test_image_support import make_store, open_store

from foundation.catalog import Catalog
from foundation.catalog.salvage import losses
from foundation.errors import DataCorrupt, NotFound
from foundation.image.lost import Losses, lost_ranges
from foundation.image.shape import Shape, split_refs
from foundation.store import format as F
from foundation.store import layout as L

BS = 4096
SIZE = (5 << 20) + 1000      # depth 2 in both modes, its last node and leaf cut short
DAYS = 5


@pytest.fixture(params=["hash", "value"])
def damaged(request, tmp_path, capsys):
    """A store of DAYS days after `rebuild --salvage` over a zeroed page and a lost tree node."""
    store = make_store(tmp_path / "store", mode=request.param)
    rng = random.Random(5)
    img = bytearray(rng.randbytes(SIZE))
    img[BS * 300:BS * 340] = bytes(BS * 40)    # null leaves
    image = tmp_path / "disk.raw"
    for d in range(1, DAYS + 1):
        for _ in range(3):   # a few changed blocks a day, in the first quarter: the rest is shared
            o = rng.randrange(SIZE // 4 // BS) * BS
            img[o:o + BS] = rng.randbytes(BS)
        write(image, img)
        assert cli(capsys, store, "import-image", "vm", image, "--at", day(d))[0] == 0
    with open_store(store, writable=False) as s:
        roots = [sn.disks["vda"].root for sn in Catalog.load(s).snapshots("vm")]
        sh = Shape(s, SIZE)
        # the last level-1 node, which every day shares (it lies in the unchanged half)
        node = split_refs(s.read(roots[1].ref), sh.rs)[sh.counts[1] - 1]
        nn, noff = F.split(s.address(node))
        middle = s.log.open.n // 2
    with open(os.path.join(store, F.ARENAS, F.arena_name(nn)), "r+b") as f:
        f.seek(noff + L.HEADER_SIZE + 10)
        b = f.read(1)
        f.seek(noff + L.HEADER_SIZE + 10)
        f.write(bytes([b[0] ^ 1]))
    if middle != nn:
        with open(os.path.join(store, F.ARENAS, F.arena_name(middle)), "r+b") as f:
            f.seek(64 << 10)
            f.write(bytes(BS))
    rc, out, err = cli(capsys, store, "rebuild", "--salvage")
    assert rc == 1 and "LOST vm@" in out, out + err
    return store, roots, node


def read_every_block(s, root):
    """The lost byte ranges found the slow way: every node and leaf read on its own."""
    sh = Shape(s, root.size)
    lost = []

    def lose(b0, b1):
        if lost and lost[-1][1] == b0:
            lost[-1] = (lost[-1][0], b1)
        else:
            lost.append((b0, b1))

    def walk(k, j, ref):
        span = sh.fanout ** k
        b0, b1 = j * span, min(sh.nleaves, (j + 1) * span)
        if ref == s.null_ref or b0 >= b1:
            return
        try:
            data = s.read(ref)
        except (DataCorrupt, NotFound):
            return lose(b0, b1)
        if k:
            for i, r in enumerate(split_refs(data, sh.rs)[:sh.counts[k - 1] - j * sh.fanout]):
                walk(k - 1, j * sh.fanout + i, r)

    walk(sh.depth, 0, root.ref)
    return [(a * sh.bs, min(b * sh.bs, root.size)) for a, b in lost]


def test_bulk_names_what_reading_every_block_finds(damaged):
    store, roots, node = damaged
    with open_store(store, writable=False) as s:
        truth = [read_every_block(s, r) for r in roots]
        checked = []
        unreadable = s.unreadable
        s.unreadable = lambda refs: checked.append(len(refs) // s.ref_size) or unreadable(refs)
        shared = Losses(s)
        got = [shared.ranges(r) for r in roots]
        s.unreadable = unreadable
        assert got == truth
        assert [lost_ranges(s, r) for r in roots] == truth     # each day on its own
        # the tree node lost costs every day its whole subtree; the zeroed page costs some days more
        sh = Shape(s, SIZE)
        cut = ((sh.counts[1] - 1) * sh.fanout * BS, SIZE)
        assert all(cut in t for t in truth) and any(len(t) > 1 for t in truth)
        # shared subtrees were checked once: the later days check only the leaves under what changed
        assert len(checked) == DAYS and max(checked[1:]) <= checked[0] // 2
        named = [(sn.time, rs) for sn, _, rs in losses(s)]
        assert named == [(sn.time, t) for sn, t in zip(Catalog.load(s).snapshots("vm"), truth) if t]
