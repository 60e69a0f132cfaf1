"""The /snapshot tree over a damaged store: every intact day byte for byte, every lost block EIO with a log line.

A store of 4 days of one VM (256 KiB arenas, encrypted) is damaged the
ways a disk loses data — a sealed arena deleted, a 4 KiB page of one
zeroed, the newest arena deleted, both head copies deleted — and mounted.
Every day is read block by block through FUSE. The oracle is the store's
own record layout, read before the damage: a block is lost exactly when
its leaf record or a tree node above it lies in the damaged bytes. Every
other block must read exactly as archived; every lost one must fail with
EIO (never a wrong or zero byte) and leave a log line naming the VM, the
day, the disk and the byte range read.
"""

import errno
import os
import re
import shutil

import pytest
import snapshotfs_support as T
from test_damage_matrix import DAYS, SIZE, images
from test_snapshotfs import needs_root

from foundation.catalog import Catalog
from foundation.image.shape import Shape, split_refs
from foundation.store import format as F
from foundation.store import layout as L

pytestmark = [pytest.mark.fuse]

BS = 4096


def block_records(s, root):
    """[[(arena, start, end)] per leaf block]: the records each block of the image needs (its leaf
    and every tree node above it); [] for a block stored as the null ref (zeros)."""
    sh = Shape(s, root.size)
    out = [[] for _ in range(sh.nleaves)]

    def span(ref):
        n, off = F.split(s.address(ref))
        return n, off, off + L.HEADER_SIZE + L.stored(s.log.record_header(n, off), 0)

    def walk(k, j, ref, above):
        if ref == s.null_ref:
            return
        here = above + [span(ref)]
        if k == 0:
            out[j] = here
            return
        for i, r in enumerate(split_refs(s.read(ref), sh.rs)):
            walk(k - 1, j * sh.fanout + i, r, here)

    walk(sh.depth, 0, root.ref, [])
    return out


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """(workdir with the pristine archive, images, {day: block records}, {"open", "middle", "catalog"})."""
    base = tmp_path_factory.mktemp("damaged-tree")
    arch = T.StoreArchiver(str(base / "archive"), arena_size=256 << 10)
    imgs = images()
    for d, img in enumerate(imgs):
        p = base / f"day{d}.img"
        p.write_bytes(img)
        arch.add("vm", T.utc(2026, 1, d + 1), {"vda": str(p)})
    with arch.open_store() as s:
        snaps = Catalog.load(s).snapshots("vm")
        need = {sn.time.day: block_records(s, sn.disks["vda"].root) for sn in snaps}
        where = {"open": s.log.open.n, "middle": s.log.open.n - 1}
        _, addrs, _ = s.summary_records(where["middle"])
        where["record"] = F.split(addrs[len(addrs) // 2])[1]
    return arch, imgs, need, where


DAMAGES = ("middle-arena-deleted", "middle-page-zeroed", "newest-arena-deleted", "head-copies-deleted")


def damage(arch, how, where):
    """Damage the store -> (arena, start, end) of the bytes lost, or None."""
    adir = os.path.join(arch.store_path, F.ARENAS)
    if how == "middle-arena-deleted":
        os.unlink(os.path.join(adir, F.arena_name(where["middle"])))
        return where["middle"], 0, 1 << 40
    if how == "newest-arena-deleted":
        os.unlink(os.path.join(adir, F.arena_name(where["open"])))
        return where["open"], 0, 1 << 40
    if how == "middle-page-zeroed":
        page = where["record"] // BS * BS
        with open(os.path.join(adir, F.arena_name(where["middle"])), "r+b") as f:
            f.seek(page)
            f.write(bytes(BS))
        return where["middle"], page, page + BS
    for name in F.HEADS:
        os.unlink(os.path.join(arch.store_path, name))
    return None


@pytest.mark.parametrize("how", DAMAGES)
@needs_root
def test_tree_serves_intact_days_and_fails_lost_blocks_loudly(made, how, tmp_path):
    pristine, imgs, need, where = made
    arch = T.StoreArchiver.__new__(T.StoreArchiver)
    arch.__dict__.update(pristine.__dict__, dir=str(tmp_path))
    arch.store_path = str(tmp_path / "store")
    shutil.copytree(pristine.store_path, arch.store_path)
    hurt = damage(arch, how, where)

    def lost(recs):
        return hurt is not None and any(n == hurt[0] and a < hurt[2] and hurt[1] < b for n, a, b in recs)

    # The newest catalog lies in the newest arena: without it the newest day is not listed.
    listed = [d for d in range(1, DAYS + 1) if not (how == "newest-arena-deleted" and d == DAYS)]
    mnt = f"/tmp/fdntest-damaged-{how}-{os.getpid()}"
    failed = {}
    with T.Mounted(arch, mnt) as m:
        assert sorted(os.listdir(f"{mnt}/2026/01")) == [f"{d:02d}" for d in listed]
        for d in listed:
            path = f"{mnt}/2026/01/{d:02d}/vm/vda.raw"
            img = imgs[d - 1]
            with open(path, "rb", buffering=0) as f:
                for i, recs in enumerate(need[d]):
                    try:
                        got = os.pread(f.fileno(), BS, i * BS)
                    except OSError as e:
                        assert e.errno == errno.EIO and lost(recs), (d, i, e)
                        failed.setdefault(d, []).append(i)
                        continue
                    assert got == img[i * BS:(i + 1) * BS], f"day {d} block {i}: wrong bytes"
                    assert not lost(recs), f"day {d} block {i} needs lost bytes yet read back"
        assert m.proc.poll() is None
        log = m.log()
    # Exactly the blocks that need lost bytes failed (the reads above check each way).
    assert failed == {d: b for d in listed if (b := [i for i, recs in enumerate(need[d]) if lost(recs)])}
    costs = {d: sum(map(lost, need[d])) for d in need}
    assert (sum(costs.values()) == 0) == (how == "head-copies-deleted"), costs   # the damage cost something
    assert any(costs[d] < SIZE // BS for d in listed), "no day was served even in part"
    # One log line per failed read, naming VM, day, disk and the bytes read.
    for d, blocks in failed.items():
        for i in blocks:
            line = re.search(rf"EIO: read 2026/01/{d:02d}/vm/vda\.raw at offset {i * BS} \(\d+ bytes\): (.*)", log)
            assert line and "arena" in line.group(1), (d, i, log[-2000:])
