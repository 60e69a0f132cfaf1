#!/usr/bin/env python3
"""Reading the past: the /snapshot tree against `restore` and against the original image.

Measures, on one archived disk (an ext4 file system of many files inside a
GPT-partitioned image, plus zero space), with the page cache dropped
before each cold run:
  - sequential read MB/s of the whole vda.raw through the FUSE mount (on
    a fresh mount: with the first lookup of its path, which reads the
    disk's partitions and file systems for snapshot.json; and with the path
    resolved first), through restore_image (what `foundation restore`
    runs, its snapshot found untimed), and of the original image file;
  - milliseconds of 4 KiB reads at random offsets of a cold vda.raw on a
    fresh mount (the first reads of a booting past day);
  - time to list every file of the day (os.walk of vda/p1), cold and warm;
  - time to list the top levels of a tree of --days days (one catalog);
  - time from `foundation boot --start` to a running domain (needs libvirtd).
Results go to stdout and benchmarks/results/bench_read.json.

    sudo python benchmarks/bench_read.py [--mb 512] [--files 3000] [--days 400] [--no-boot]
"""

import argparse
import datetime as dt
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]       # this tree's foundation, and the tests' helpers
from measure import drop_caches  # noqa: E402  (benchmarks/ is the script's own directory)

import snapshotfs_support as T  # noqa: E402  (the tests' disk images and mounts)

MIB = 1 << 20


def read_all(path, bs=1 << 20):
    n = 0
    with open(path, "rb", buffering=0) as f:
        while True:
            b = f.read(bs)
            if not b:
                return n
            n += len(b)


def first_reads(path, size, n=20, seed=7):
    """Milliseconds of n reads of 4 KiB at random offsets of a cold file (a past day booting):
    (the first one, the median, the slowest)."""
    rng = random.Random(seed)
    ms = []
    fd = os.open(path, os.O_RDONLY)
    try:
        for _ in range(n):
            off = rng.randrange(size // 4096) * 4096
            t0 = time.perf_counter()
            os.pread(fd, 4096, off)
            ms.append((time.perf_counter() - t0) * 1000)
    finally:
        os.close(fd)
    return round(ms[0], 1), round(sorted(ms)[n // 2], 1), round(max(ms), 1)


def timed(fn):
    t0 = time.perf_counter()
    v = fn()
    return time.perf_counter() - t0, v


def build_disk(work, mb, nfiles):
    """A GPT disk of `mb` MiB: an ext4 partition filled about 60 % with files, the rest zeros."""
    rng = random.Random(42)
    src = os.path.join(work, "files")
    fs_mb = mb - 2
    budget = int(fs_mb * MIB * 0.6)
    sizes = [max(1, int(rng.paretovariate(1.2) * 2000)) for _ in range(nfiles)]
    scale = budget / sum(sizes)
    os.makedirs(src)
    words = [rng.randbytes(6).hex() for _ in range(500)]
    for i, s in enumerate(sizes):
        s = max(1, int(s * scale))
        d = os.path.join(src, f"d{i % 40:02d}", f"e{i % 7}")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"f{i:05d}.dat"), "wb") as f:
            if i % 2:
                f.write(rng.randbytes(s))                                   # incompressible
            else:
                text = (" ".join(rng.choice(words) for _ in range(s // 8 + 1))).encode()
                f.write(text[:s])                                           # compressible
    fsimg = os.path.join(work, "fs.img")
    T.mkfs_image("ext4", fsimg, fs_mb * MIB - MIB, src)
    disk = os.path.join(work, "vda.img")
    T.partitioned_disk(disk, mb * MIB, [(fsimg, T.GPT_LINUX)])
    os.unlink(fsimg)
    return disk, nfiles


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=int, default=512, help="disk size in MiB (default 512)")
    ap.add_argument("--files", type=int, default=3000, help="files in its ext4 (default 3000)")
    ap.add_argument("--days", type=int, default=400, help="days in the big-tree listing case (default 400)")
    ap.add_argument("--no-boot", action="store_true", help="skip the boot case")
    ap.add_argument("--plain", action="store_true", help="unencrypted store (default: encrypted, as `init` makes)")
    ap.add_argument("--dir", help="work directory (default: a temporary one)")
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench_read needs root (FUSE, drop_caches, libvirt)")
    work = a.dir or tempfile.mkdtemp(prefix="fdn-bench-read-")
    os.makedirs(work, exist_ok=True)
    res = {"mb": a.mb, "files": a.files, "encrypted": not a.plain}
    try:
        print(f"building a {a.mb} MiB disk with {a.files} files ...", flush=True)
        disk, nfiles = build_disk(work, a.mb, a.files)
        arch = T.StoreArchiver(os.path.join(work, "archive"), arena_size=16 << 20, encrypt=not a.plain)
        xml = T.domain_xml("fdntest-bench", "7d1f9f7c-5a55-4d43-8a2b-0c7f3b1d9e01", {"vda": "/nonexistent.img"})
        t, _ = timed(lambda: arch.add("fdntest-bench", T.utc(2026, 11, 21), {"vda": disk}, xml=xml))
        res["archive_s"] = round(t, 2)
        print(f"archived in {t:.1f} s")
        size = os.path.getsize(disk)

        drop_caches()
        t, n = timed(lambda: read_all(disk))
        res["original_MBps"] = round(n / t / 1e6, 1)

        from foundation.catalog import Catalog
        from foundation.image import restore_image

        out = os.path.join(work, "restored.raw")
        drop_caches()
        with arch.open_store() as s:
            snap = Catalog.load(s).find("fdntest-bench")
            t, _ = timed(lambda: restore_image(s, snap.disks["vda"].root, out))
        res["restore_MBps"] = round(size / t / 1e6, 1)
        os.unlink(out)

        mnt = os.path.join(work, "mnt")
        with T.Mounted(arch, mnt):
            raw = f"{mnt}/2026/11/21/fdntest-bench/vda.raw"
            drop_caches()
            t, n = timed(lambda: read_all(raw))
            assert n == size
            res["mount_raw_MBps"] = round(n / t / 1e6, 1)  # with the path's first lookup (snapshot.json)
        with T.Mounted(arch, mnt):
            os.stat(raw)  # the path resolved first, as restore_image above finds its snapshot untimed
            drop_caches()
            t, n = timed(lambda: read_all(raw))
            res["mount_raw_read_MBps"] = round(n / t / 1e6, 1)
        with T.Mounted(arch, mnt):  # a fresh server: nothing decoded yet
            drop_caches()
            res["first_4k_reads_ms"] = dict(zip(("first", "median", "max"), first_reads(raw, size)))
        with T.Mounted(arch, mnt):
            root = f"{mnt}/2026/11/21/fdntest-bench/vda/p1"
            drop_caches()

            def walk():
                c = 0
                for _, _, fs in os.walk(root):
                    c += len(fs)
                return c

            t, c = timed(walk)
            res["list_files_cold_s"] = round(t, 3)
            res["listed_files"] = c
            t, _ = timed(walk)
            res["list_files_warm_s"] = round(t, 3)
            drop_caches()
            some = sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs)[:200]
            t, nb = timed(lambda: sum(read_all(p) for p in some))
            res["read_200_files_s"] = round(t, 3)

        # a tree of many days: one catalog, the same roots under --days times
        from foundation.catalog import Snapshot
        from foundation.store import Store

        with Store.open(arch.store_path, key_file=arch.key_file, writable=True) as s:
            cat = Catalog.load(s)
            base = cat.find("fdntest-bench")
            for i in range(1, a.days):
                cat.add(Snapshot(id=None, name="fdntest-bench", uuid=base.uuid,
                                 time=T.utc(2026, 11, 21) - dt.timedelta(days=i), disks=base.disks, meta=base.meta))
            cat.commit(s)
        with T.Mounted(arch, mnt):
            def top():
                n = 0
                for y in os.listdir(mnt):
                    if y.isdigit():
                        for m in os.listdir(f"{mnt}/{y}"):
                            n += len(os.listdir(f"{mnt}/{y}/{m}"))
                return n

            t, ndays = timed(top)
            res["list_tree_days"] = ndays
            res["list_tree_s"] = round(t, 3)

            if not a.no_boot:
                res.update(bench_boot(mnt, work))
    finally:
        if not a.dir:
            shutil.rmtree(work, ignore_errors=True)
    for k, v in res.items():
        print(f"{k:22} {v}")
    os.makedirs(os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"), exist_ok=True)
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "bench_read.json"), "w") as f:
        json.dump(res, f, indent=1)


def bench_boot(mnt, work):
    try:
        import libvirt
    except ImportError:
        return {"boot_start_s": "skipped: no libvirt-python"}
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if subprocess.run(["bash", os.path.join(repo, "scripts", "libvirt.sh")], capture_output=True).returncode:
        return {"boot_start_s": "skipped: libvirtd did not start"}
    clones = os.path.join(work, "clones")
    os.makedirs(clones)
    os.chmod(work, 0o755)
    name = "fdntest-bench@2026-11-21"
    cmd = [sys.executable, "-m", "foundation", "boot", "fdntest-bench", "2026-11-21", "--start",
           "--mountpoint", mnt, "--clones-dir", clones]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    conn = libvirt.open("qemu:///system")
    try:
        if r.returncode != 0:
            return {"boot_start_s": f"failed: {r.stderr.strip()}"}
        dom = conn.lookupByName(name)
        while not dom.isActive():
            time.sleep(0.01)
        t = time.perf_counter() - t0
        return {"boot_start_s": round(t, 2)}
    finally:
        subprocess.run([sys.executable, "-m", "foundation", "boot", "--remove", name, "--force"],
                       capture_output=True)
        conn.close()


if __name__ == "__main__":
    main()
