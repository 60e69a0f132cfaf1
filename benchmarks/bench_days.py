#!/usr/bin/env python3
"""Day by day, two source trees side by side: CPU, wall time and peak memory of each import, and the store's size.

Builds the standard workload (benchmarks/workload.py) one day at a time in
one image file and imports each day into one store per tree (`--tree`,
e.g. main and a branch), tree after tree, so the runs alternate on the
same bytes: day 0 whole, later days with `--changed`. Then a day with no
change is imported ROUNDS times into each store, alternated. Every import
runs in a child under GNU time (user + sys CPU seconds, wall seconds, peak
RSS) with the page cache dropped before it and the trees' bytecode
compiled beforehand. A private config names a state directory of the
run's own (the host's record of each store's newest commit). At the end each store's
apparent and allocated size, and its index and Bloom filter, are
reported. Results go to stdout and benchmarks/results/days-<size>-<time>.json.

    python benchmarks/bench_days.py --tree /path/to/main --tree . [--size 2G] [--days 8] [--rounds 3]
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import measure  # noqa: E402
from workload import Workload, parse_size  # noqa: E402

CONFIG = None   # the run's config file: a state directory of its own


def env(tree):
    """The child's environment: this tree first, bytecode cached (as an installed package has it)."""
    e = dict(os.environ, PYTHONPATH=tree, FOUNDATION_CONFIG=CONFIG)
    e.pop("PYTHONDONTWRITEBYTECODE", None)
    return e


def timed(tree, args):
    """Run `python -m foundation ARGS` from `tree` -> dict(wall_s, cpu_s, peak_rss_mib)."""
    measure.drop_caches()
    return measure.timed([sys.executable, "-m", "foundation", *args], cwd=tree, env=env(tree))[0]


def sizes(store):
    """(apparent, allocated) bytes of every file under store, and of index and bloom alone."""
    app = alloc = 0
    for d, _, files in os.walk(store):
        for f in files:
            st = os.lstat(os.path.join(d, f))
            app += st.st_size
            alloc += st.st_blocks * 512
    one = {}
    for name in ("index", "bloom"):
        st = os.lstat(os.path.join(store, name))
        one[name] = dict(apparent=st.st_size, allocated=st.st_blocks * 512)
    return dict(apparent=app, allocated=alloc, **one)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", action="append", required=True, help="a source tree to run (give two or more)")
    ap.add_argument("--size", type=parse_size, default=2 << 30)
    ap.add_argument("--days", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3, help="imports of a day with no change, per tree")
    ap.add_argument("--work", default=os.environ.get("TMPDIR", "/var/tmp"))
    a = ap.parse_args()
    trees = [os.path.abspath(t) for t in a.tree]
    work = tempfile.mkdtemp(prefix="bench-days-", dir=a.work)
    global CONFIG
    CONFIG = os.path.join(work, "foundation.toml")
    with open(CONFIG, "w") as f:
        f.write(f'state_dir = "{work}/state"\n')
    image = os.path.join(work, "disk.raw")
    stores = [os.path.join(work, f"store{i}") for i in range(len(trees))]
    runs = {t: {} for t in trees}
    try:
        for t, s in zip(trees, stores):
            os.makedirs(s)
            subprocess.run([sys.executable, "-m", "compileall", "-q", "foundation"], cwd=t, env=env(t),
                           check=True, capture_output=True)
            subprocess.run([sys.executable, "-m", "foundation", "init", s, "--no-encrypt"], cwd=t,
                           env=env(t), check=True, capture_output=True)
            runs[t]["new store"] = sizes(s)
        cj = os.path.join(work, "changed.json")
        for d, changed in Workload(a.size).days(image, a.days):
            with open(cj, "w") as f:
                json.dump(changed or [], f)
            for t, s in zip(trees, stores):
                args = ["--store", s, "import-image", "vm", image, "--at", f"2026-11-{d + 1:02d}T01:00:00Z"]
                runs[t][f"day{d}"] = timed(t, args + (["--changed", cj] if changed is not None else []))
                print(t, f"day{d}", runs[t][f"day{d}"], flush=True)
        with open(cj, "w") as f:
            json.dump([], f)
        for r in range(a.rounds):
            for t, s in zip(trees, stores):
                args = ["--store", s, "import-image", "vm", image, "--at", f"2026-11-{a.days + r + 1:02d}T01:00:00Z",
                        "--changed", cj]
                runs[t].setdefault("no change", []).append(timed(t, args))
                print(t, "no change", runs[t]["no change"][-1], flush=True)
        for t, s in zip(trees, stores):
            runs[t]["store"] = sizes(s)
            later = [runs[t][f"day{d}"]["cpu_s"] for d in range(1, a.days)]
            runs[t]["later day cpu_s median"] = statistics.median(later) if later else None
            runs[t]["no change cpu_s median"] = statistics.median(r["cpu_s"] for r in runs[t]["no change"])
        res = dict(size=a.size, days=a.days, load=os.getloadavg(), trees=trees, runs=runs)
        measure.save(f"days-{a.size >> 20}M", res)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
