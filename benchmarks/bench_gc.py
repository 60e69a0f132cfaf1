#!/usr/bin/env python3
"""Garbage collection: time and peak memory against store size and the share of garbage.

For each image size and garbage share, imports DAYS snapshots of one image
in which every other day writes a fresh region (a large file) that the
next day deletes, forgets enough of those days to make about the wanted
share of the log unreachable, and runs `foundation gc --json` in a child
process: wall time, peak RSS of the child (GNU time), the bytes the sweep
found unreachable and the bytes actually given back. Both modes. Results
go to stdout and benchmarks/results/gc-<time>.json.

    python benchmarks/bench_gc.py [--mb 64 256] [--garbage 10 50] [--modes hash value]
"""

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from foundation.catalog import Catalog  # noqa: E402
from foundation.cli import main as cli  # noqa: E402
import measure  # noqa: E402
from foundation.store import Store  # noqa: E402

MIB = 1 << 20
DAYS = 6
ARENA = 4 * MIB   # small arenas: the open arena (never rewritten) holds little of the garbage


def build(path, mode, mb, garbage, seed=1):
    """A store whose forgotten days hold about `garbage` of its bytes -> log bytes."""
    Store.create(path, mode=mode, encrypt=False, arena_size=ARENA)
    rng = random.Random(seed)
    base = mb * MIB
    # Region written on even days, deleted on odd ones: sized so that the
    # forgotten even days hold about `garbage` of the log.
    region = int(base * garbage / max(1e-9, (1 - garbage)) / (DAYS // 2 - 1)) // 4096 * 4096 if garbage else 0
    img = bytearray(b"".join(rng.randbytes(MIB) for _ in range(mb)) + bytes(region))
    image = os.path.join(os.path.dirname(path), "disk.raw")
    for d in range(1, DAYS + 1):
        for _ in range(16):
            o = rng.randrange(0, base // 4096) * 4096
            img[o:o + 4096] = rng.randbytes(4096)
        if region:
            img[base:] = b"".join(rng.randbytes(MIB) for _ in range(region // MIB)) + rng.randbytes(
                region % MIB) if d % 2 == 0 else bytes(region)
        with open(image, "wb") as f:
            f.write(img)
        assert cli(["--store", path, "import-image", "vm", image, "--at", f"2026-11-{d:02d}T01:00:00Z"]) == 0
    os.unlink(image)
    with Store.open(path, writable=True) as s:  # forget every even day but the last
        cat = Catalog.load(s)
        cat.forget([x.id for x in cat.snapshots() if x.time.day % 2 == 0 and x.time.day != DAYS])
        cat.commit(s)
    return log_bytes(path)


def log_bytes(path):
    d = os.path.join(path, "arenas")
    return sum(os.path.getsize(os.path.join(d, x)) for x in os.listdir(d))


def run_gc(path):
    """`foundation gc --json` in a child -> (seconds, peak RSS, report)."""
    secs, peak, out = measure.run([sys.executable, "-m", "foundation", "--store", path, "gc", "--min-garbage", "0",
                                   "--json"], env=dict(PYTHONPATH=ROOT), capture=True)
    return secs, peak, json.loads(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=int, nargs="+", default=[64, 256], help="image sizes in MiB")
    ap.add_argument("--garbage", type=int, nargs="+", default=[10, 50], help="garbage shares in percent")
    ap.add_argument("--modes", nargs="+", default=["hash", "value"])
    ap.add_argument("--dir", default=None, help="scratch directory (default: a temp dir)")
    args = ap.parse_args()
    rows = []
    print(f"{'mode':5} {'MiB':>5} {'garb%':>5} {'log MB':>8} {'unreach MB':>10} {'freed MB':>8} "
          f"{'secs':>6} {'MB/s':>6} {'peak MB':>7}")
    for mode in args.modes:
        for mb in args.mb:
            for g in args.garbage:
                tmp = tempfile.mkdtemp(dir=args.dir)
                try:
                    path = os.path.join(tmp, "store")
                    os.mkdir(path)
                    size = build(path, mode, mb, g / 100)
                    secs, peak, rep = run_gc(path)
                    row = dict(mode=mode, image_mib=mb, garbage_target=g / 100, log_bytes=size,
                               unreachable=rep["garbage"], reclaimed=rep["reclaimed"], seconds=secs,
                               mb_per_s=size / secs / 1e6, peak_rss=peak, rewritten=len(rep["rewritten"]),
                               arenas=rep["arenas"])
                    rows.append(row)
                    print(f"{mode:5} {mb:5} {g:5} {size / 1e6:8.1f} {rep['garbage'] / 1e6:10.1f} "
                          f"{rep['reclaimed'] / 1e6:8.1f} {secs:6.2f} {row['mb_per_s']:6.0f} {peak / 1e6:7.0f}")
                finally:
                    shutil.rmtree(tmp)
    os.makedirs(os.path.join(ROOT, "benchmarks", "results"), exist_ok=True)
    out = os.path.join(ROOT, "benchmarks", "results", time.strftime("gc-%Y%m%d-%H%M%S.json"))
    with open(out, "w") as f:
        json.dump({"host_cores": os.cpu_count(), "days": DAYS, "arena_size": ARENA, "rows": rows}, f, indent=1)
    print(f"results: {out}")


if __name__ == "__main__":
    main()
