#!/usr/bin/env python3
"""A real Debian system disk built up over days by package installs, and the stores it makes.

The one decision: the days are made the way a user makes them, by apt in
the disk itself. Day 0 is a Debian 12 root tree from mmdebstrap turned into
a 4 GiB ext4 image by `mkfs.ext4 -d` (no partition table); each later day
copies the day before, loop-mounts it in a mount namespace of its own,
runs `apt-get update` and `apt-get install` of that day's packages in a
chroot (services kept from starting by a policy-rc.d), then `apt-get
clean`, and unmounts. The raw image is the day. ext4 places the new files
itself, so a day changes the blocks a real install changes: new files, the
dpkg database, the journal, bitmaps and inodes.

The days are cached under a key made of this file's recipe (suite, package
lists, size): `python3 benchmarks/osdisk.py build` prints the directory.
Deterministic enough: fixed UUID and hash seed, SOURCE_DATE_EPOCH; the
packages are whatever the mirror serves for bookworm that day.

    python3 benchmarks/osdisk.py build                 the days, cached
    python3 benchmarks/osdisk.py stores [--days N]     Foundation and restic, per day
        [--compression zstd:N ...] [--block-size N ...] [--run N ...] [--images DIR]
        [--no-restic] [--check]

`stores` imports every day into a fresh encrypted Foundation store
(by-hash mode; each day imported whole, compare-by-hash keeps the new
blocks) for each `--compression`, `--block-size` and `--run` given
(every combination), and backs the same files up with
restic (`restic init` defaults: repository v2, zstd "auto"), then prints
and records each store's size after each day in benchmarks/results/.
It prints Foundation's arenas (the log) and its whole store (with the
derived index and Bloom filter) against restic's whole repository
directory. `--check` restores every day from each Foundation store and
compares it with its image.
"""

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import measure  # noqa: E402
from workload import sha256_file  # noqa: E402

CACHE = os.environ.get("FOUNDATION_OSDISK_CACHE", "/var/cache/foundation/osdisk")
SUITE = "bookworm"
SIZE = "4G"
UUID = "6c0d1a7e-3b1f-4c55-9a51-0ce5d15c0001"
HASH_SEED = "6c0d1a7e-3b1f-4c55-9a51-0ce5d15c0002"
EPOCH = "1700000000"
BASE = ["linux-image-amd64", "systemd-sysv", "udev", "dbus", "openssh-server", "locales", "less",
        "vim-tiny", "ca-certificates", "curl", "man-db", "cron", "rsyslog"]
DAYS = [  # what the user installs each later day
    ["python3", "python3-pip", "python3-venv", "git"],
    ["build-essential", "gdb"],
    ["nginx", "postgresql"],
    ["perl-doc", "vim", "tmux", "htop", "rsync"],
    ["default-jdk-headless"],
    ["golang-go"],
    ["texinfo", "imagemagick"],
]
POLICY = "#!/bin/sh\n# services are not started while the benchmark installs packages\nexit 101\n"
PASSWORD = "benchmark-password"


def key():
    h = hashlib.sha256(json.dumps([SUITE, SIZE, UUID, HASH_SEED, EPOCH, BASE, DAYS, POLICY]).encode())
    return h.hexdigest()[:16]


def sh(*argv, **kw):
    p = subprocess.run(argv, capture_output=True, text=True, **kw)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:4])}... failed ({p.returncode}): {(p.stderr or p.stdout)[-2000:]}")
    return p.stdout


def build(days=len(DAYS) + 1, log=print):
    """The cache directory, holding day0.raw .. day{days-1}.raw (each marked done by its own file)."""
    d = os.path.join(CACHE, key())
    os.makedirs(d, exist_ok=True)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive", SOURCE_DATE_EPOCH=EPOCH, LC_ALL="C")
    first = os.path.join(d, "day0.raw")
    if not os.path.exists(first):
        t0 = time.time()
        tree = tempfile.mkdtemp(prefix="osdisk-", dir=d)
        try:
            sh("mmdebstrap", "--variant=apt", f"--include={','.join(BASE)}", SUITE, tree,
               "/etc/apt/sources.list.d/debian.sources", env=env, timeout=3600)
            with open(os.path.join(tree, "usr/sbin/policy-rc.d"), "w") as f:
                f.write(POLICY)
            os.chmod(os.path.join(tree, "usr/sbin/policy-rc.d"), 0o755)
            shutil.copyfile("/etc/apt/sources.list.d/debian.sources",
                            os.path.join(tree, "etc/apt/sources.list.d/debian.sources"))
            tmp = first + ".tmp"
            sh("mkfs.ext4", "-q", "-F", "-L", "root", "-U", UUID, "-E", f"hash_seed={HASH_SEED}",
               "-d", tree, tmp, SIZE, env=env)
            os.rename(tmp, first)
        finally:
            shutil.rmtree(tree, ignore_errors=True)
        log(f"osdisk: day 0 built in {time.time() - t0:.0f} s")
    for day in range(1, days):
        path = os.path.join(d, f"day{day}.raw")
        if os.path.exists(path):
            continue
        t0 = time.time()
        tmp = path + ".tmp"
        sh("cp", "--sparse=always", os.path.join(d, f"day{day - 1}.raw"), tmp)
        mnt = tempfile.mkdtemp(prefix="osdisk-mnt-", dir=d)
        pkgs = " ".join(DAYS[day - 1])
        script = f"""set -e
mount -o loop {tmp} {mnt}
mount -t proc proc {mnt}/proc
mount --bind /dev {mnt}/dev
cp /etc/resolv.conf {mnt}/etc/resolv.conf
chroot {mnt} apt-get update -q
chroot {mnt} apt-get install -y -q {pkgs}
chroot {mnt} apt-get clean
umount {mnt}/dev {mnt}/proc
umount {mnt}
"""
        try:
            sh("unshare", "-m", "--propagation", "private", "sh", "-c", script, env=env, timeout=3600)
        finally:
            os.rmdir(mnt)
        sh("fallocate", "--dig-holes", tmp)     # blocks ext4 zeroed take no room in the cache
        os.rename(tmp, path)
        log(f"osdisk: day {day} (+ {pkgs}) built in {time.time() - t0:.0f} s")
    return d


def allocated(path):
    total = 0
    for d, _, files in os.walk(path):
        for f in files:
            total += os.lstat(os.path.join(d, f)).st_blocks * 512
    return total


def arena_bytes(store):
    d = os.path.join(store, "arenas")
    return sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))


def timed(cmd, env):
    """(wall s, CPU s of the children) of one command."""
    before = os.times()
    wall, _, _ = measure.run(cmd, env=env)
    after = os.times()
    return wall, (after.children_user - before.children_user) + (after.children_system - before.children_system)


def foundation_days(images, work, compression, block_size, run=None, check=False):
    store, keyf = os.path.join(work, "store"), os.path.join(work, "store.key")
    env = {"PYTHONPATH": ROOT}
    base = [sys.executable, "-m", "foundation", "--store", store, "--key-file", keyf]
    init = [*base, "init", store, "--mode", "hash", "--max-log-size", "16G", "--block-size", block_size]
    if compression:
        init += ["--compression", compression]
    if run:
        init += ["--run", run]
    measure.run(init, env=env)
    rows = []
    for day, img in enumerate(images):
        wall, cpu = timed([*base, "import-image", "os", img, "--at", f"2024-01-{day + 1:02d}T03:00:00Z"], env)
        rows.append({"day": day, "log_bytes": arena_bytes(store), "allocated": allocated(store),
                     "wall_s": round(wall, 2), "cpu_s": round(cpu, 2)})
    if check:   # every day restored and compared with its image, after the last day's import
        out = os.path.join(work, "restored.raw")
        for day, img in enumerate(images):
            measure.run([*base, "restore", f"os@2024-01-{day + 1:02d}T03:00:00Z", out, "--force"], env=env)
            same = sha256_file(out) == sha256_file(img)
            os.unlink(out)
            if not same:
                raise SystemExit(f"day {day} restored from {compression or 'default'}/{block_size}/run{run} "
                                 f"differs from {img}")
            rows[day]["restored_identical"] = True
    return rows


def restic_days(images, work):
    repo = os.path.join(work, "restic")
    env = {"RESTIC_PASSWORD": PASSWORD, "RESTIC_CACHE_DIR": os.path.join(work, "restic-cache")}
    measure.run(["restic", "-r", repo, "init"], env=env)
    rows = []
    for day, img in enumerate(images):
        wall, cpu = timed(["restic", "-r", repo, "backup", "--host", "bench", "-q", img], env)
        rows.append({"day": day, "allocated": allocated(repo), "wall_s": round(wall, 2), "cpu_s": round(cpu, 2)})
    return rows


def stores(args):
    d = args.images or build(args.days)
    images = [os.path.join(d, f"day{i}.raw") for i in range(args.days)]
    what = {"images": args.images} if args.images else \
        {"key": key(), "size": SIZE, "base": BASE, "added": DAYS[:args.days - 1]}
    result = {"workload": {**what, "days": args.days, "allocated": [os.stat(p).st_blocks * 512 for p in images]},
              "loadavg": os.getloadavg(), "foundation": {}}
    with tempfile.TemporaryDirectory(prefix="osdisk-stores-", dir=args.work) as work:
        if shutil.which("restic") and not args.no_restic:
            os.makedirs(os.path.join(work, "r"))
            result["restic"] = restic_days(images, os.path.join(work, "r"))
        for c in args.compression:
            for bs in args.block_size:
                for run in args.run:
                    name = (c or "default") + ("" if bs == "4096" else f"/{bs}") + (f"/run{run}" if run else "")
                    w = os.path.join(work, f"f-{name.replace('/', '-')}")
                    os.makedirs(w)
                    result["foundation"][name] = foundation_days(images, w, c, bs, run, args.check)
    result["loadavg_after"] = os.getloadavg()
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    out = os.path.join(HERE, "results", f"osdisk-{time.strftime('%Y%m%d-%H%M%S')}.json")
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    print(table(result))
    print(table(result, "allocated"))
    print(f"recorded {out}")


def table(r, field="log_bytes"):
    """Each store's size after each day: Foundation's arenas (`log_bytes`) or whole store (`allocated`)."""
    lines = [f"{field}:", "day  image used  " +
             "  ".join(f"{n:>14}" for n in ["restic" if "restic" in r else "-", *r["foundation"]])]
    for day in range(r["workload"]["days"]):
        cells = [r["restic"][day]["allocated"]] if "restic" in r else [0]
        cells += [rows[day][field] for rows in r["foundation"].values()]
        lines.append(f"{day:>3}  {r['workload']['allocated'][day] / 1e6:8.0f} MB  " +
                     "  ".join(f"{c / 1e6:11.1f} MB" for c in cells))
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("--days", type=int, default=len(DAYS) + 1)
    s = sub.add_parser("stores")
    s.add_argument("--days", type=int, default=len(DAYS) + 1)
    s.add_argument("--work", default=None, help="scratch directory (default: the system's temporary one)")
    s.add_argument("--block-size", action="append", default=None,
                   help="a Foundation store per block size (repeatable; default 4096)")
    s.add_argument("--images", help="another workload's directory of day0.raw, day1.raw, ... "
                   "(e.g. benchmarks/workload.py's) instead of the OS disk")
    s.add_argument("--no-restic", action="store_true", help="Foundation only (restic's figures are in earlier results)")
    s.add_argument("--compression", action="append", default=None,
                   help="a Foundation store per setting (repeatable); '' = the default")
    s.add_argument("--run", action="append", default=None,
                   help="a Foundation store per `init --run N` (repeatable; default: init's own)")
    s.add_argument("--check", action="store_true",
                   help="restore every day from each Foundation store and compare it with its image (SHA-256)")
    args = p.parse_args(argv)
    if args.cmd == "build":
        print(build(args.days))
    else:
        args.compression = args.compression or [""]
        args.block_size = args.block_size or ["4096"]
        args.run = args.run or [""]
        stores(args)


if __name__ == "__main__":
    main()
