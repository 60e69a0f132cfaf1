#!/usr/bin/env python3
"""Run slices (codec 2): the 8 days of the standard workload into a new store per setting.

For each configuration, a code tree and the `init --run N` it is given
(none: the tree's default; a tree before runs knows no --run), in
alternated rounds: `init`, then `import-image` of day0.raw .. day7.raw of
compare_tools.py's workload (days 1-7 with their `--changed` ranges, as
compare_tools does), then `restore` of day 7, page cache dropped before
day 0 and before the restore. Wall and CPU seconds (user + sys, GNU time)
of each step, the load average, the arenas' bytes after day 0 and after
day 7, and (first round) the restored image's SHA-256 against the
manifest's.

    sudo python benchmarks/bench_runs.py --config base=/var/tmp/runs/base \\
        --config run1=.:1 --config run16=.:16 --config run64=.:64 [--rounds 2]

Results go to stdout and benchmarks/results/runs-<time>.json.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DAYS = "/var/tmp/foundation-compare/days-2147483648-8-1"


sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import measure  # noqa: E402
from workload import sha256_file  # noqa: E402


def drop_caches():
    if not measure.drop_caches():
        sys.exit("bench_runs: dropping the page cache needs root (the days are measured cold)")


def step(tree, store, key, *args):
    """(wall, cpu) of one foundation command under GNU time."""
    timing = store + ".time"
    env = dict(os.environ, PYTHONPATH=tree, PYTHONDONTWRITEBYTECODE="")
    cmd = ["/usr/bin/time", "-f", "%e %U %S", "-o", timing, sys.executable, "-m", "foundation",
           "--store", store, "--key-file", key, *args]
    subprocess.run(cmd, cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL)
    with open(timing) as f:
        wall, user, sys_ = f.read().split()[-3:]
    return float(wall), round(float(user) + float(sys_), 2)


def arena_bytes(store):
    d = os.path.join(store, "arenas")
    return sum(os.path.getsize(os.path.join(d, x)) for x in os.listdir(d))


def one(tree, run, work, check):
    store, key = os.path.join(work, "store"), os.path.join(work, "key")
    shutil.rmtree(store, ignore_errors=True)
    if os.path.exists(key):
        os.unlink(key)
    subprocess.run([sys.executable, "-m", "compileall", "-q", "foundation"], cwd=tree, check=True)
    step(tree, store, key, "init", store, "--mode", "hash", *(["--run", str(run)] if run else []))
    with open(os.path.join(DAYS, "manifest.json")) as f:
        man = json.load(f)
    got = {"load1": round(os.getloadavg()[0], 2), "days": []}
    for d, entry in enumerate(man["day"]):
        args = ["import-image", "bench", os.path.join(DAYS, entry["image"]), "--at", f"2024-01-{d + 1:02d}T03:00:00Z"]
        if "changed" in entry:
            args += ["--changed", os.path.join(DAYS, entry["changed"])]
        if d == 0:
            drop_caches()
        wall, cpu = step(tree, store, key, *args)
        got["days"].append({"wall_s": wall, "cpu_s": cpu, "arena_bytes": arena_bytes(store)})
    out = os.path.join(work, "restored.raw")
    drop_caches()
    wall, cpu = step(tree, store, key, "restore", "bench@2024-01-08T03:00:00Z", out)
    got["restore"] = {"wall_s": wall, "cpu_s": cpu}
    if check:
        got["restored_identical"] = sha256_file(out) == man["day"][-1]["sha256"]
    os.unlink(out)
    got["day0_arena_bytes"] = got["days"][0]["arena_bytes"]
    got["day7_arena_bytes"] = got["days"][-1]["arena_bytes"]
    got["day0_cpu_s"], got["day0_wall_s"] = got["days"][0]["cpu_s"], got["days"][0]["wall_s"]
    got["later_cpu_s"] = round(sum(x["cpu_s"] for x in got["days"][1:]), 2)
    got["later_wall_s"] = round(sum(x["wall_s"] for x in got["days"][1:]), 2)
    got["restore_cpu_s"], got["restore_wall_s"] = cpu, wall
    shutil.rmtree(store, ignore_errors=True)
    return got


FIELDS = ("day0_wall_s", "day0_cpu_s", "later_wall_s", "later_cpu_s", "restore_wall_s", "restore_cpu_s",
          "day0_arena_bytes", "day7_arena_bytes")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", action="append", required=True, help="NAME=TREE[:RUN]")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--work", default="/var/tmp/runs/bench")
    p.add_argument("--note", default="")
    a = p.parse_args()
    configs = []
    for c in a.config:
        name, _, rest = c.partition("=")
        tree, _, run = rest.partition(":")
        configs.append((name, os.path.abspath(tree), int(run) if run else None))
    os.makedirs(a.work, exist_ok=True)
    runs = {n: [] for n, _, _ in configs}
    for r in range(a.rounds):
        for name, tree, run in configs:
            got = one(tree, run, a.work, r == 0)
            runs[name].append(got)
            print(f"round {r + 1} {name}: " + json.dumps({k: got[k] for k in FIELDS + ('load1',)}
                                                         | {"ok": got.get("restored_identical")}), flush=True)
    medians = {n: {f: statistics.median(x[f] for x in runs[n]) for f in FIELDS} for n in runs}
    commits = {n: subprocess.run(["git", "-C", t, "rev-parse", "--short", "HEAD"], capture_output=True,
                                 text=True).stdout.strip() for n, t, _ in configs}
    out = {"what": "8 days of the 2 GiB standard workload (days 1-7 with --changed) into a new encrypted hash "
                   "store per configuration, then restore of day 7; page cache dropped before day 0 and the "
                   "restore; GNU time; configurations alternated",
           "configs": {n: {"tree": t, "run": r, "commit": commits[n]} for n, t, r in configs},
           "rounds": a.rounds, "note": a.note, "medians": medians, "runs": runs}
    for n in runs:
        print(n, json.dumps(medians[n]))
    print("results:", measure.save("runs", out))


if __name__ == "__main__":
    main()
