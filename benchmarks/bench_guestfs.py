#!/usr/bin/env python3
"""Guest file systems through the /snapshot tree against the kernel's own driver, and reader against reader.

For each file system (ext4, XFS on LVM, btrfs, NTFS, FAT32) a GPT disk
holds one partition with a directory of --files small files and one file
of --mb MiB. With the page cache dropped before each cold run:
  - tree: list the directory (names and lstat of every entry) and read the
    big file through a mounted /snapshot tree over the raw disk archived
    as an image file (the readers of foundation.guestfs);
  - loop: the same on a read-only loop mount of the same partition, in a
    private mount namespace (the kernel's driver: the reference; ntfs-3g
    for NTFS, none for FAT: this kernel has neither driver);
  - readers: the same through each candidate library directly, no FUSE:
    pytsk3 against libfsext / libfsntfs / libfsfat, libfsxfs against
    dissect.xfs when installed (how docs/design.md chose per file system).
Results go to stdout and benchmarks/results/guestfs-<time>.json.

    sudo python benchmarks/bench_guestfs.py [--mb 1024] [--files 10000] [--fs ext4,xfs,btrfs,ntfs,fat]
"""

import argparse
import datetime as dt
import json
import os
import random
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
sys.path.insert(0, HERE)

import guest_images as G  # noqa: E402
from bench_read import drop_caches, read_all  # noqa: E402
from foundation.guestfs.sources import FileObject  # noqa: E402
import snapshotfs_support as T  # noqa: E402

MIB = G.MIB


def listing(d):
    n = 0
    for e in os.scandir(d):
        e.stat(follow_symlinks=False)
        n += 1
    return n


def measure_dir(root):
    """{list_s, read_s, read_mbs} of root/many and root/big.bin, each cold."""
    drop_caches()
    t0 = time.perf_counter()
    n = listing(os.path.join(root, "many"))
    t1 = time.perf_counter()
    drop_caches()
    t2 = time.perf_counter()
    size = read_all(os.path.join(root, "big.bin"))
    t3 = time.perf_counter()
    return {"entries": n, "list_s": round(t1 - t0, 3), "read_s": round(t3 - t2, 3),
            "read_mbs": round(size / MIB / (t3 - t2), 1)}


def make_source(work, files, mb):
    src = os.path.join(work, "src")
    os.makedirs(os.path.join(src, "many"))
    for i in range(files):
        with open(os.path.join(src, "many", f"f{i:05d}.txt"), "wb") as f:
            f.write(b"small file %d\n" % i)
    rng = random.Random(1)
    with open(os.path.join(src, "big.bin"), "wb") as f:
        for _ in range(mb):
            f.write(rng.randbytes(MIB))
    return src


def make_fs(kind, work, src, mb):
    """(partition image, GPT type, loop mount options) for one file system."""
    img = os.path.join(work, f"{kind}.img")
    size = (mb + 64 + mb // 8) * MIB
    if kind == "ext4":
        G.ext4(img, size, src)
    elif kind == "xfs":
        G.xfs(img, max(size, 320 * MIB), src)
    elif kind == "btrfs":
        G.btrfs(img, max(size, 320 * MIB), src, {})
    elif kind == "ntfs":
        G.blank(img, size)
        G.run(["mkntfs", "-q", "-F", "-Q", img])
        mnt = img + ".mnt"                 # ntfs-3g: the kernel here has no NTFS driver
        os.makedirs(mnt)
        G.run(["unshare", "-m", "sh", "-c", f"set -e; ntfs-3g {img} {mnt}; cp -r {src}/. {mnt}/; umount {mnt}"])
        os.rmdir(mnt)
    elif kind == "fat":
        G.blank(img, size)
        G.run(["mkfs.vfat", "-F", "32", img])
        G.run(["mcopy", "-s", "-i", img, os.path.join(src, "many"), os.path.join(src, "big.bin"), "::/"])
    return img


def tree_run(kind, work, img):
    """Archive a GPT disk holding img (in an LVM volume for xfs) and measure through the tree."""
    part = img
    if kind == "xfs":
        part = os.path.join(work, "pv.img")
        G.lvm_pv(part, os.path.getsize(img) + 8 * MIB, "bench", [("root", img)])
    disk = os.path.join(work, f"{kind}-disk.img")
    G.disk(disk, os.path.getsize(part) + 4 * MIB, [(part, G.GPT_LINUX)])
    arch_dir = os.path.join(work, f"archive-{kind}")
    os.makedirs(arch_dir)
    arch = T.ImagesArchiver(arch_dir)
    arch.add("bench", T.utc(2026, 11, 25), {"vda": disk})
    os.remove(disk)
    if part != img:
        os.remove(part)
    mnt = os.path.join(work, "tree")
    with T.Mounted(arch, mnt):
        root = f"{mnt}/2026/11/25/bench/vda/p1" + ("/bench/root" if kind == "xfs" else "")
        return measure_dir(root)


def loop_run(kind, img):
    """The same through the kernel's driver: a read-only loop mount in a private namespace."""
    if kind == "fat":
        return None                        # this kernel has no vfat driver
    mnt = img + ".mnt"
    os.makedirs(mnt, exist_ok=True)
    opts = "ro,loop,nouuid" if kind == "xfs" else "ro,loop"
    mount = f"ntfs-3g -o ro {img} {mnt}" if kind == "ntfs" else f"mount -o {opts} {img} {mnt}"
    me = os.path.abspath(__file__)
    out = G.run(["unshare", "-m", "sh", "-c",
                 f"set -e; {mount}; {sys.executable} {me} --measure {mnt}; umount {mnt}"])
    os.rmdir(mnt)
    return json.loads(out.strip().splitlines()[-1])


class _Src:
    def __init__(self, path):
        self.fd = os.open(path, os.O_RDONLY)
        self.size = os.fstat(self.fd).st_size

    def read(self, off, n):
        return os.pread(self.fd, n, off)


def _timed_reader(listdir, read_big):
    drop_caches()
    t0 = time.perf_counter()
    n = listdir()
    t1 = time.perf_counter()
    drop_caches()
    t2 = time.perf_counter()
    size = read_big()
    t3 = time.perf_counter()
    return {"entries": n, "list_s": round(t1 - t0, 3), "read_s": round(t3 - t2, 3),
            "read_mbs": round(size / MIB / (t3 - t2), 1)}


def _chunks(read, size, bs=8 * MIB):
    n = 0
    for off in range(0, size, bs):
        n += len(read(off, min(bs, size - off)))
    return n


def reader_runs(kind, img):
    """{reader: measures} for the libraries that could read this file system, without FUSE."""
    out = {}
    if kind in ("ext4", "ntfs", "fat"):
        from foundation.guestfs.disk import DiskFiles
        vol = DiskFiles(_Src(img)).volumes()[""]

        def tsk_list():
            many = [e for e in vol.list_dir(vol.root_addr) if e.name == b"many"][0]
            return len(vol.list_dir(many.addr))

        def tsk_read():
            big = [e for e in vol.list_dir(vol.root_addr) if e.name == b"big.bin"][0]
            f = vol.open_file(big.addr)
            return _chunks(lambda o, n: vol.read_file(f, o, n, big.size), big.size)
        out["pytsk3"] = _timed_reader(tsk_list, tsk_read)
    libyal = {"ext4": "pyfsext", "ntfs": "pyfsntfs", "fat": "pyfsfat", "xfs": "pyfsxfs"}.get(kind)
    if libyal:
        mod = __import__(libyal)
        v = mod.volume()
        v.open_file_object(FileObject(_Src(img), []))

        def get(name):
            return v.get_file_entry_by_path("/" + name) or v.get_file_entry_by_path("\\" + name)

        def yal_list():
            n = 0
            for e in get("many").sub_file_entries:
                e.size, e.name
                if hasattr(e, "file_mode"):
                    e.file_mode, e.get_modification_time_as_integer()
                n += 1
            return n

        def yal_read():
            e = get("big.bin")
            return _chunks(lambda o, n: e.read_buffer_at_offset(n, o), e.size)
        out[libyal] = _timed_reader(yal_list, yal_read)
    if kind == "btrfs":
        from dissect.btrfs import Btrfs
        bfs = Btrfs(open(img, "rb"))

        def db_list():
            return sum(1 for n, i in bfs.get("/many").iterdir() if n not in (".", "..") and i.inode)

        def db_read():
            node = bfs.get("/big.bin")
            f = node.open()
            return _chunks(lambda o, n: (f.seek(o), f.read(n))[1], node.size)
        out["dissect.btrfs"] = _timed_reader(db_list, db_read)
    if kind == "xfs":
        try:
            from dissect.xfs import XFS
        except ImportError:
            XFS = None
        if XFS is not None:
            fs = XFS(open(img, "rb"))

            def dx_list():
                return sum(1 for n, i in fs.get("/many").listdir().items() if n not in (".", "..") and i.inode)

            def dx_read():
                f = fs.get("/big.bin").open()
                return _chunks(lambda o, n: (f.seek(o), f.read(n))[1], fs.get("/big.bin").size)
            out["dissect.xfs"] = _timed_reader(dx_list, dx_read)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=int, default=1024, help="size of the big file (MiB)")
    ap.add_argument("--files", type=int, default=10000, help="files in the listed directory")
    ap.add_argument("--fs", default="ext4,xfs,btrfs,ntfs,fat")
    ap.add_argument("--work", default=None, help="scratch directory (default: a temporary one)")
    ap.add_argument("--measure", help=argparse.SUPPRESS)      # inside the loop mount's namespace
    a = ap.parse_args()
    if a.measure:
        print(json.dumps(measure_dir(a.measure)))
        return
    work = tempfile.mkdtemp(prefix="bench-guestfs-", dir=a.work)
    results = {"mb": a.mb, "files": a.files, "time": dt.datetime.now(dt.timezone.utc).isoformat(), "fs": {}}
    try:
        src = make_source(work, a.files, a.mb)
        for kind in a.fs.split(","):
            d = os.path.join(work, kind)
            os.makedirs(d)
            img = make_fs(kind, d, src, a.mb)
            r = {"loop": loop_run(kind, img), "readers": reader_runs(kind, img), "tree": tree_run(kind, d, img)}
            results["fs"][kind] = r
            print(kind, json.dumps(r), flush=True)
            shutil.rmtree(d)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    out = os.path.join(HERE, "results", f"guestfs-{dt.datetime.now():%Y%m%d-%H%M%S}.json")
    with open(out, "w") as f:
        json.dump(results, f, indent=2)
    print(f"{'fs':6} {'how':12} {'list s':>7} {'read s':>7} {'MB/s':>7}")
    for kind, r in results["fs"].items():
        rows = [("tree", r["tree"]), ("loop", r["loop"])] + list(r["readers"].items())
        for how, m in rows:
            if m is None:
                continue
            print(f"{kind:6} {how:12} {m['list_s']:7.2f} {m['read_s']:7.2f} {m['read_mbs']:7.1f}")
    print("results:", out)


if __name__ == "__main__":
    main()
