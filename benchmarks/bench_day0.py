#!/usr/bin/env python3
"""Day 0 of the standard workload: `import-image` of day0.raw into a new encrypted hash store.

For each code tree given (a checkout of another branch, to compare), in
alternated rounds: a new store made by `init` (defaults), then `import-image`
of the 2 GiB day0.raw of compare_tools.py's workload, page cache dropped
before (cold) or the image read once before (warm). Wall seconds, CPU
seconds (user + sys) and peak memory from GNU time, the load average at the
start, the store's allocated size. `--chrt` runs the import under
SCHED_FIFO (`chrt -f 10`), so that other work on the machine takes less of
its two cores (the disk stays shared). With `--check`, the first round's
stores are restored and compared with the image by SHA-256.

    sudo python benchmarks/bench_day0.py --tree /work/main --tree . [--rounds 5] [--warm] [--chrt] [--check]

Results go to stdout and benchmarks/results/day0-<name>-<time>.json.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IMAGE = "/var/tmp/foundation-compare/days-2147483648-8-1/day0.raw"
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
from measure import drop_caches  # noqa: E402
from workload import sha256_file  # noqa: E402


def foundation(tree, store, key, *args, wrap=(), timing=None, py=sys.executable):
    env = dict(os.environ, PYTHONPATH=tree, PYTHONDONTWRITEBYTECODE="")
    cmd = [*wrap, py, "-m", "foundation", "--store", store, "--key-file", key, *args]
    if timing:
        cmd = ["/usr/bin/time", "-f", "%e %U %S %M", "-o", timing, *cmd]
    subprocess.run(cmd, cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL)


def run(tree, work, mode, chrt, check, py=sys.executable):
    store, key, timing = (os.path.join(work, n) for n in ("store", "key", "time"))
    shutil.rmtree(store, ignore_errors=True)
    if os.path.exists(key):
        os.unlink(key)
    foundation(tree, store, key, "init", store, "--mode", "hash", py=py)
    if mode == "cold":
        drop_caches()
    else:
        with open(IMAGE, "rb") as f:
            while f.read(8 << 20):
                pass
    load = os.getloadavg()[0]
    foundation(tree, store, key, "import-image", "bench", IMAGE, "--at", "2024-01-01T03:00:00Z",
               wrap=("chrt", "-f", "10") if chrt else (), timing=timing, py=py)
    with open(timing) as f:
        wall, user, sys_, rss = f.read().split()[-4:]
    du = subprocess.run(["du", "-sB1", store], capture_output=True, text=True, check=True).stdout.split()[0]
    got = {"wall_s": float(wall), "cpu_s": round(float(user) + float(sys_), 2), "user_s": float(user),
           "sys_s": float(sys_), "peak_rss_mb": int(rss) // 1024, "peak_rss_kb": int(rss), "load1": round(load, 2), "store_bytes": int(du)}
    if check:
        out = os.path.join(work, "restored.raw")
        foundation(tree, store, key, "restore", "bench@2024-01-01T03:00:00Z", out, py=py)
        got["restored_identical"] = sha256_file(out) == sha256_file(IMAGE)
        os.unlink(out)
    return got


def median(runs, field):
    return round(statistics.median(r[field] for r in runs), 3)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tree", action="append", required=True, help="code tree to run (repeat to compare)")
    p.add_argument("--name", action="append", help="a name per tree (default: its directory's name)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warm", action="store_true", help="a warm run after each cold one")
    p.add_argument("--chrt", action="store_true", help="the import under SCHED_FIFO (chrt -f 10)")
    p.add_argument("--check", action="store_true", help="restore the first round's stores and compare")
    p.add_argument("--python", action="append", help="the interpreter that runs each tree (in --tree's order; "
                   "default: this one)")
    p.add_argument("--work", default="/var/tmp/bench-day0")
    p.add_argument("--note", default="")
    a = p.parse_args()
    trees = [os.path.abspath(t) for t in a.tree]
    names = a.name or [os.path.basename(t.rstrip("/")) for t in trees]
    pys = a.python or [sys.executable] * len(trees)
    if len(pys) != len(trees):
        p.error("give one --python per --tree, or none")
    os.makedirs(a.work, exist_ok=True)
    commits = {n: subprocess.run(["git", "-C", t, "rev-parse", "--short", "HEAD"], capture_output=True,
                                 text=True).stdout.strip() for n, t in zip(names, trees)}
    modes = ["cold", "warm"] if a.warm else ["cold"]
    runs = {n: {m: [] for m in modes} for n in names}
    for r in range(a.rounds):
        for n, t, py in zip(names, trees, pys):
            for m in modes:
                got = run(t, a.work, m, a.chrt, a.check and r == 0 and m == "cold", py)
                runs[n][m].append(got)
                print(f"round {r + 1} {n:>8} {m}: {json.dumps(got)}", flush=True)
    shutil.rmtree(os.path.join(a.work, "store"), ignore_errors=True)
    medians = {n: {m: {f: median(runs[n][m], f) for f in ("wall_s", "cpu_s", "user_s", "sys_s", "peak_rss_mb", "peak_rss_kb")}
                   for m in modes} for n in names}
    out = {"what": f"day 0 of the 2 GiB standard workload ({IMAGE}), import-image into a new encrypted hash store "
                   "made by init (defaults); cold = page cache dropped before; GNU time; trees alternated"
                   + ("; import under chrt -f 10" if a.chrt else ""),
           "trees": dict(zip(names, trees)), "pythons": dict(zip(names, pys)), "commits": commits,
           "rounds": a.rounds, "note": a.note,
           "medians": medians, "runs": runs}
    for n in names:
        print(n, json.dumps(medians[n]))
    path = os.path.join(ROOT, "benchmarks", "results",
                        f"day0-{'-'.join(names)}-{time.strftime('%Y%m%d-%H%M%S')}.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    print("results:", path)


if __name__ == "__main__":
    main()
