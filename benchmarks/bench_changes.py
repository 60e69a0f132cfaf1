#!/usr/bin/env python3
"""`diff` and `find` time against disk size, size of the change, and number of days.

Disk size and change: for each disk size (sparse files up to 64 GiB, GPT
with one ext4 partition filling the disk, FILES small files plus one large
one) day 0 is archived, then one day per change size rewrites that many MB
of the large file in place and adds and removes a few files (debugfs), and
one day changes only free space; `foundation diff` between each day and the
one before is timed (a fresh process's work: store opened, catalog loaded).

Days: a year of nightly snapshots of one disk, simulated cheaply: each
night rewrites a few small files in place (the changed ranges are known, so
archiving a night writes only them). Then
`find` is timed on first use (indexing every night), again (search only),
and `diff` between the first and the last night.

Results go to stdout and benchmarks/results/changes-<time>.json.

    python benchmarks/bench_changes.py [--gib 1 16 64] [--change-mb 1 60 500] [--days 365] [--files 5000]
"""

import argparse
import contextlib
import io
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

from foundation.catalog import Catalog, DiskEntry, Snapshot  # noqa: E402
from foundation.cli import main as cli  # noqa: E402
from foundation.image import write_image  # noqa: E402
from foundation.image.source import RawSource  # noqa: E402
from foundation.store import Store  # noqa: E402

MIB, GIB = 1 << 20, 1 << 30
PART = 1 * MIB              # the partition's offset in the disk


def noise(rng, n):
    return b"".join(rng.randbytes(min(MIB, n - i)) for i in range(0, n, MIB))


def tree(files, seed, big_mb):
    """{relpath: bytes}: `files` small files in 100 directories and one large file."""
    rng = random.Random(seed)
    out = {f"dir{i % 100:03d}/file{i:06d}.txt": rng.randbytes(rng.choice((600, 3000, 9000, 30000)))
           for i in range(files)}
    out["data/big.bin"] = noise(rng, big_mb * MIB)
    return out


def make_disk(work, gib, files, big_mb):
    """A sparse GPT disk of `gib` GiB with one ext4 partition at PART -> (disk path, partition size)."""
    disk = os.path.join(work, "disk.raw")
    fs_size = gib * GIB - 2 * PART
    with open(disk, "wb") as f:
        f.truncate(gib * GIB)
    subprocess.run(["sfdisk", "-q", disk], input=f"label: gpt\nstart=2048, size={fs_size // 512}, type="
                   "0FC63DAF-8483-4772-8E79-3D69D8477DE4\n", text=True, check=True, stdout=subprocess.DEVNULL)
    with tempfile.TemporaryDirectory() as src:
        for rel, data in tree(files, 1, big_mb).items():
            p = os.path.join(src, rel)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "wb") as f:
                f.write(data)
        subprocess.run(["mkfs.ext4", "-q", "-F", "-b", "4096", "-E",
                        f"root_owner=0:0,lazy_itable_init=1,lazy_journal_init=1,offset={PART}",
                        "-d", src, disk, f"{fs_size // 1024}k"], check=True)
    return disk, fs_size


class Archive:
    """Days of one disk in an unencrypted hash-mode store, committed in batches."""

    def __init__(self, path):
        self.path = path
        os.makedirs(path)
        Store.create(path, mode="hash", encrypt=False, arena_size=16 * MIB, max_log_size=8 * GIB)
        self.prev = None

    def add(self, store, cat, disk, when, changed=None):
        src = RawSource(disk)
        try:
            root = write_image(store, src, src.size, prev=self.prev, changed=changed if self.prev else None)
        finally:
            src.close()
        self.prev = root
        cat.add(Snapshot(id=None, name="vm", uuid="00000000-0000-0000-0000-000000000001", time=when,
                         disks={"vda": DiskEntry(root=root, size=root.size)}, meta={}, added_bytes=0))


def timed_cli(*argv):
    out = io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(out):
        code = cli(list(argv))
    dt = time.perf_counter() - t0
    if code != 0:
        raise RuntimeError(f"foundation {' '.join(argv)} exited {code}")
    return dt, out.getvalue().splitlines()


def at(day):
    import datetime as dt

    return dt.datetime(2025, 1, 1, 2, 0, tzinfo=dt.timezone.utc) + dt.timedelta(days=day)


def debugfs_at(disk, *cmds):
    """debugfs -w on the partition inside the disk image."""
    with tempfile.NamedTemporaryFile("w", suffix=".cmds") as f:
        f.write("\n".join(cmds) + "\n")
        f.flush()
        subprocess.run(["debugfs", "-w", "-f", f.name, f"{disk}?offset={PART}"],
                       check=True, capture_output=True)


def bench_sizes(work, gib, files, change_mbs):
    disk, fs_size = make_disk(work, gib, files, max(change_mbs))
    store_path = os.path.join(work, "store")
    arch = Archive(store_path)
    rows = []
    with Store.open(store_path, writable=True) as s:
        cat = Catalog.load(s)
        t0 = time.perf_counter()
        arch.add(s, cat, disk, at(0))
        cat.commit(s)
        first = time.perf_counter() - t0
    print(f"{gib} GiB disk, {files} files: day 0 archived in {first:.1f} s", flush=True)
    rng = random.Random(5)
    days = [("free space only", 0)] + [(f"{mb} MB rewritten in place, 10 files added, 10 removed", mb)
                                       for mb in change_mbs]
    big = extents_of(disk, "data/big.bin")
    for i, (what, mb) in enumerate(days, start=1):
        fd = os.open(disk, os.O_WRONLY)
        if mb:
            start = rng.randrange(0, max(1, max(change_mbs) - mb + 1)) * MIB
            write_file_range(fd, big, start, noise(rng, mb * MIB))
        else:
            os.pwrite(fd, rng.randbytes(8 * MIB), PART + fs_size - 64 * MIB)    # high, unused blocks
        os.close(fd)
        if mb:
            with tempfile.NamedTemporaryFile() as t:
                t.write(b"new file\n" * 100)
                t.flush()
                cmds = [f"write {t.name} /dir{k:03d}/new-{i}-{k}.txt" for k in range(10)]
                cmds += [f"rm /dir{k:03d}/file{k + 100 * i:06d}.txt" for k in range(10)]
                debugfs_at(disk, *cmds)
        with Store.open(store_path, writable=True) as s:
            cat = Catalog.load(s)
            t0 = time.perf_counter()
            arch.add(s, cat, disk, at(i))          # no change list: reads the data regions, holes skipped
            cat.commit(s)
            arch_s = time.perf_counter() - t0
        secs, lines = timed_cli("--store", store_path, "diff", f"vm@{at(i - 1).isoformat()}",
                                f"vm@{at(i).isoformat()}", "--json")
        changed = sum(json.loads(x)["size_after"] or 0 for x in lines)
        row = {"disk_gib": gib, "files": files, "day": what, "change_mb": mb, "archive_s": round(arch_s, 2),
               "diff_s": round(secs, 3), "entries_listed": len(lines), "bytes_listed_after": changed}
        print(f"  {what}: diff {secs:.2f} s, {len(lines)} entries (archiving the day took {arch_s:.1f} s)",
              flush=True)
        rows.append(row)
    shutil.rmtree(store_path)
    os.unlink(disk)
    return rows


def extents_of(disk, rel):
    """[(disk offset, length)] of a file of the partition, in file order."""
    import pytsk3

    from foundation.snapshotfs.volumes import DiskFiles

    class Src:
        size = os.path.getsize(disk)

        def __init__(self):
            self.fd = os.open(disk, os.O_RDONLY)

        def read(self, o, n):
            return os.pread(self.fd, n, o)

    vol = DiskFiles(Src()).volumes()["p1"]
    f = vol.fs.open("/" + rel)
    bs = vol.fs.info.block_size
    return [(PART + r.addr * bs, r.len * bs) for a in f if a.info.type == pytsk3.TSK_FS_ATTR_TYPE_DEFAULT
            for r in a if r.len and not int(r.flags) & 3]


def write_file_range(fd, extents, offset, data):
    """pwrite `data` at file offset `offset` through the file's extents -> [(disk offset, length)] written."""
    pos, out = 0, []
    for off, n in extents:
        lo, hi = max(offset, pos), min(offset + len(data), pos + n)
        if lo < hi:
            os.pwrite(fd, data[lo - offset:hi - offset], off + lo - pos)
            out.append((off + lo - pos, hi - lo))
        pos += n
    return out


def bench_days(work, ndays, files):
    gib = 4
    disk, _ = make_disk(work, gib, files, 8)
    store_path = os.path.join(work, "store")
    state = os.path.join(work, "state")
    arch = Archive(store_path)
    rng = random.Random(7)
    smalls = [f"dir{i % 100:03d}/file{i:06d}.txt" for i in range(files)]
    ext = {}
    t0 = time.perf_counter()
    with Store.open(store_path, writable=True) as s:
        cat = Catalog.load(s)
        arch.add(s, cat, disk, at(0))
        for d in range(1, ndays):
            fd = os.open(disk, os.O_WRONLY)
            changed = []
            for rel in rng.sample(smalls, 5):           # five files rewritten in place each night
                if rel not in ext:
                    ext[rel] = extents_of(disk, rel)
                n = sum(x[1] for x in ext[rel])
                changed += write_file_range(fd, ext[rel], 0, rng.randbytes(min(n, 600)))
            os.close(fd)
            arch.add(s, cat, disk, at(d), changed=changed)
            if d % 30 == 0:
                cat.commit(s)
        cat.commit(s)
    build = time.perf_counter() - t0
    print(f"{ndays} nights of a {gib} GiB disk with {files} files archived in {build:.0f} s", flush=True)
    first, lines = timed_cli("--store", store_path, "find", "file00001*.txt", "--json", "--state-dir", state)
    again, lines2 = timed_cli("--store", store_path, "find", "file00001*.txt", "--json", "--state-dir", state)
    many, lines3 = timed_cli("--store", store_path, "find", "*.txt", "--json", "--state-dir", state)
    span, dl = timed_cli("--store", store_path, "diff", f"vm@{at(0).isoformat()}", f"vm@{at(ndays - 1).isoformat()}",
                         "--json")
    files = os.path.join(state, "files")
    db = next(os.path.join(files, x) for x in os.listdir(files) if x.endswith(".sqlite"))
    row = {"nights": ndays, "disk_gib": gib, "files": files, "find_first_use_s": round(first, 2),
           "find_s": round(again, 3), "find_rows": len(lines2), "find_all_s": round(many, 2),
           "find_all_rows": len(lines3), "diff_first_last_s": round(span, 2), "diff_entries": len(dl),
           "listing_bytes": os.path.getsize(db)}
    print(f"  find: first use {first:.1f} s (indexing {ndays} nights), then {again:.3f} s for {len(lines2)} rows, "
          f"{many:.1f} s for all {len(lines3)} rows; diff night 1 .. {ndays}: {span:.2f} s, {len(dl)} entries; "
          f"listing {os.path.getsize(db) / 1e6:.1f} MB", flush=True)
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gib", type=int, nargs="+", default=[1, 16, 64], help="disk sizes in GiB (sparse)")
    ap.add_argument("--change-mb", type=int, nargs="+", default=[1, 60, 500], help="sizes of a day's change")
    ap.add_argument("--days", type=int, default=365, help="nights in the find benchmark")
    ap.add_argument("--files", type=int, default=5000, help="small files in the guest file system")
    ap.add_argument("--dir", default=None, help="scratch directory (default: a temporary one)")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="bench-changes-", dir=args.dir)
    res = {"sizes": [], "days": None, "args": vars(args)}
    try:
        for gib in args.gib:
            res["sizes"] += bench_sizes(work, gib, args.files, args.change_mb)
        if args.days:
            res["days"] = bench_days(work, args.days, args.files)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    os.makedirs(os.path.join(ROOT, "benchmarks", "results"), exist_ok=True)
    out = os.path.join(ROOT, "benchmarks", "results", time.strftime("changes-%Y%m%d-%H%M%S.json"))
    with open(out, "w") as f:
        json.dump(res, f, indent=2)
    print(f"results: {out}")


if __name__ == "__main__":
    main()
