"""The restore's sweep alone (native.plan_sweep): the records of a year's arenas' summaries looked up
in a window's table of keys, as a newest day's restore does (120 arenas of 4,000 records, one in
eight a key of the 64 Ki-key table). Best of --rounds, in a child process per source tree given
(its C core built; run in the tree, so that its `foundation` is the one imported): its wall ms and
records a second.

    python3 benchmarks/bench_sweep.py --tree /work/base --tree . [--rounds 5]
"""

import argparse
import json
import os
import subprocess
import sys

ONE = """
import array, json, random, sys, time
from foundation import native
rng = random.Random(1)
keys = [rng.randbytes(32) for _ in range({nkeys})]
t = native.Table(32, len(keys))
t.add(b"".join(keys), array.array("Q", range(len(keys))))
recs = [rng.randbytes(32) for _ in range({arenas} * {per})]
for i in range(0, len(recs), 8):
    recs[i] = keys[(i // 8) % len(keys)]
ak, aa, per = b"".join(recs), array.array("Q", range(len(recs))), {per}
best = None
for r in range({rounds}):
    found, done = array.array("Q", bytes(8 * len(keys))), bytearray(len(keys))
    t0 = time.perf_counter()
    for a in range({arenas}):
        native.plan_sweep(t, ak[a * per * 32:(a + 1) * per * 32], aa[a * per:(a + 1) * per], found, done)
    dt = time.perf_counter() - t0
    best = dt if best is None else min(best, dt)
    assert sum(done) == min(len(keys), len(recs) // 8)
print(json.dumps({{"records": len(recs), "ms": best * 1e3}}))
"""


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tree", action="append", required=True)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--keys", type=int, default=65536)
    p.add_argument("--arenas", type=int, default=120)
    p.add_argument("--per", type=int, default=4000)
    a = p.parse_args()
    code = ONE.format(nkeys=a.keys, arenas=a.arenas, per=a.per, rounds=a.rounds)
    for tree in a.tree:
        out = subprocess.run([sys.executable, "-c", code], cwd=os.path.abspath(tree),
                             env={**os.environ, "PYTHONPATH": os.path.abspath(tree)},
                             capture_output=True, text=True, check=True).stdout
        r = json.loads(out)
        print(f"{tree}: {r['records']:,} records swept in {r['ms']:.1f} ms ({r['records'] / r['ms'] / 1e3:.1f} M a second)")


if __name__ == "__main__":
    main()
