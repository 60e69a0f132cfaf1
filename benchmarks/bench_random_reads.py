#!/usr/bin/env python3
"""Random single-block reads of a day-0 store: what a run costs a reader that wants one block.

For each (code tree, store) pair given, in alternated rounds: open the
store read-only in a child process, read N blocks of the image named
bench@2024-01-01T03:00:00Z at random block offsets through ImageReader
(page cache warm: the arenas read once before; the block cache of the
store kept small), and report CPU seconds (process time) and wall per
block. A store with runs decodes a whole run (k blocks) for each.

    python benchmarks/bench_random_reads.py --case base=/tree/a:/store/a:/key/a \\
        --case runs=/tree/b:/store/b:/key/b [--blocks 2000] [--rounds 3]

Results: stdout and benchmarks/results/random-reads-TIMESTAMP.json.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import measure  # noqa: E402

CHILD = r"""
import os, random, sys, time, json
from foundation.store import Store
from foundation.store.cache import Tuning
from foundation.catalog import Catalog
from foundation.image import ImageReader
store, key, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
s = Store.open(store, key_file=key, writable=False, tuning=Tuning(block_cache_bytes=1 << 20))
snap = Catalog.load(s).snapshots("bench")[0]
r = ImageReader(s, snap.disks[next(iter(snap.disks))].root, readahead=0)  # one block a read
rng = random.Random(7)
offs = [rng.randrange(r.size // 4096) * 4096 for _ in range(n)]
for o in offs[:50]:
    r.read(o, 4096)
c0, t0 = time.process_time(), time.perf_counter()
for o in offs:
    r.read(o, 4096)
print(json.dumps({"cpu_s": time.process_time() - c0, "wall_s": time.perf_counter() - t0}))
"""


def warm(store):
    d = os.path.join(store, "arenas")
    for x in os.listdir(d):
        with open(os.path.join(d, x), "rb") as f:
            while f.read(8 << 20):
                pass


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--case", action="append", required=True, help="NAME=TREE:STORE:KEY")
    p.add_argument("--blocks", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    cases = []
    for c in a.case:
        name, _, rest = c.partition("=")
        tree, store, key = rest.split(":")
        cases.append((name, tree, store, key))
    runs = {n: [] for n, *_ in cases}
    for r in range(a.rounds):
        for name, tree, store, key in cases:
            warm(store)
            out = subprocess.run([sys.executable, "-c", CHILD, store, key, str(a.blocks)], cwd=tree, check=True,
                                 env=dict(os.environ, PYTHONPATH=tree), capture_output=True, text=True).stdout
            got = json.loads(out.strip().splitlines()[-1])
            got["load1"] = round(os.getloadavg()[0], 2)
            runs[name].append(got)
            print(f"round {r + 1} {name}: {got}", flush=True)
    med = {n: {f: round(statistics.median(x[f] for x in v), 4) for f in ("cpu_s", "wall_s")} for n, v in runs.items()}
    for n, m in med.items():
        print(n, m, f"{1e6 * m['cpu_s'] / a.blocks:.0f} µs CPU a block")
    out = {"what": f"{a.blocks} random 4 KiB reads of a day-0 image through ImageReader, arenas in the page "
                   "cache, block cache 1 MiB, child process time", "cases": {n: {"tree": t, "store": s}
                                                                          for n, t, s, _ in cases},
           "blocks": a.blocks, "medians": med, "runs": runs}
    print("results:", measure.save("random-reads", out))


if __name__ == "__main__":
    main()
