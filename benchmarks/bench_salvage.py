#!/usr/bin/env python3
"""Salvage rebuild: seconds, MB/s of arenas scanned and peak memory of `foundation rebuild --salvage`.

Builds the standard store (benchmarks/workload.py: DAYS days of a SIZE
image, imported with their changed ranges), then, as after a disk fault
that took the derived files, deletes every summary, the index and the
Bloom filter, zeroes a 4 KiB page in a middle arena, and times
`foundation rebuild --salvage` in a child (GNU time for its CPU seconds and peak RSS):
every arena is read and scanned once, stepping over the damaged page.
The scan alone is timed too (in process, caches dropped only by the
kernel's own eviction), and so is naming the lost days alone (in process,
this tree's code): the rest of a rebuild writes the index and the Bloom
filter (sized for the records found) and names the lost days (a walk of
every day's tree, each subtree the days share looked at once). The load
average is recorded before each run: the machine is shared.
Results go to stdout and benchmarks/results/salvage-<size>-<time>.json.

    python benchmarks/bench_salvage.py [--size 2G] [--days 8] [--keep DIR] [--tree DIR ...] [--rounds N]
"""

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import measure  # noqa: E402
from workload import Workload, parse_size  # noqa: E402

from foundation.cli import main as cli  # noqa: E402


def build(store, work, size, days):
    """Import `days` days of the workload into a new unencrypted store -> seconds."""
    os.makedirs(store)
    assert cli(["init", store, "--no-encrypt"]) == 0
    image = os.path.join(work, "disk.raw")
    t0 = time.perf_counter()
    for d, changed in Workload(size).days(image, days):
        args = ["--store", store, "import-image", "vm", image, "--at", f"2026-11-{d + 1:02d}T01:00:00Z"]
        if changed is not None:
            cj = os.path.join(work, "changed.json")
            with open(cj, "w") as f:
                json.dump(changed, f)
            args += ["--changed", cj]
        assert cli(args) == 0
    os.unlink(image)
    return time.perf_counter() - t0


def damage(store):
    """Delete the derived files and zero a page in a middle arena -> bytes of arenas to scan."""
    for name in ("index", "bloom", "bloom.json"):
        if os.path.exists(os.path.join(store, name)):
            os.unlink(os.path.join(store, name))
    shutil.rmtree(os.path.join(store, "summaries"))
    os.makedirs(os.path.join(store, "summaries"))
    arenas = sorted(os.listdir(os.path.join(store, "arenas")))
    with open(os.path.join(store, "arenas", arenas[len(arenas) // 2]), "r+b") as f:
        f.seek(1 << 20)
        f.write(bytes(4096))
    return sum(os.path.getsize(os.path.join(store, "arenas", a)) for a in arenas), len(arenas)


def scan_seconds(store):
    """Seconds for the salvage scan alone (read and check every record of every arena, in process)."""
    from foundation.store import Store
    from foundation.store.rebuild import scan_arena
    with Store.open(store) as s:
        t0 = time.perf_counter()
        for n in range(s.log.open.n):
            scan_arena(s, n)
        return time.perf_counter() - t0


def naming_seconds(store):
    """(seconds, lines) of naming the lost days alone, in process, on the store just salvaged."""
    from foundation.catalog.salvage import days_affected
    from foundation.store import Store
    with Store.open(store) as s:
        t0 = time.perf_counter()
        lines = days_affected(s)
        return time.perf_counter() - t0, lines


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=parse_size, default=2 << 30, help="image size (default 2G)")
    ap.add_argument("--days", type=int, default=8)
    ap.add_argument("--keep", help="build the store here and keep it (default: a temporary directory)")
    ap.add_argument("--tree", action="append", help="a source tree whose `rebuild --salvage` is timed (default: "
                    "this one; give several to compare them on the same store, each run after a fresh damage)")
    ap.add_argument("--rounds", type=int, default=1, help="runs per tree, trees alternated")
    a = ap.parse_args()
    trees = [os.path.abspath(t) for t in a.tree or [ROOT]]
    work = a.keep or tempfile.mkdtemp(prefix="bench-salvage-", dir=os.environ.get("TMPDIR", "/var/tmp"))
    store = os.path.join(work, "store")
    try:
        built = build(store, work, a.size, a.days)
        runs = {t: [] for t in trees}
        for _ in range(a.rounds):
            for tree in trees:
                scanned, arenas = damage(store)
                load = os.getloadavg()
                t, out = measure.timed([sys.executable, "-m", "foundation", "--store", store, "rebuild", "--salvage"],
                                       cwd=tree, env=dict(PYTHONPATH=tree), ok=(0, 1))
                t["mb_per_s"] = round(scanned / 1e6 / t["wall_s"], 1)
                lines = out.decode().strip().splitlines()
                t["report"] = lines[-3:]
                t["lost_days"] = [x for x in lines if x.startswith("LOST")]   # the same in every tree
                t["load_before"] = [round(x, 2) for x in load]
                runs[tree].append(t)
                print(tree, t, flush=True)
        for tree in trees:
            for key in ("wall_s", "cpu_s", "peak_rss_mib", "mb_per_s"):
                runs[tree + " median " + key] = statistics.median(t[key] for t in runs[tree])
        named, lines = naming_seconds(store)
        scan = scan_seconds(store)
        res = {"image_bytes": a.size, "days": a.days, "arenas": arenas, "arena_bytes": scanned,
               "import_seconds": round(built, 1), "load": os.getloadavg(), "salvage": runs,
               "scan_only_seconds": round(scan, 2), "scan_only_mb_per_s": round(scanned / 1e6 / scan, 1),
               "naming_only_seconds": round(named, 2), "named": lines}
        measure.save(f"salvage-{a.size >> 20}M", res)
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
