#!/usr/bin/env python3
"""The write path: day 0, a later day and a day with no change, on the 2 GiB workload and on a 64 GiB disk.

For each code tree given (a checkout of another branch, to compare; this
tree by default), in alternated rounds: a fresh encrypted compare-by-hash
store (`init --max-log-size 16G`, as compare_tools.py makes it), then
`import-image` of day 0 of `benchmarks/workload.py`, of day 1 with
`--changed`, and of the same image again with an empty `--changed` (a day
with no change); the same three on a 64 GiB sparse disk holding the same
bytes at its start (so the data and the change are those of the 2 GiB disk,
only the disk is 32 times larger). The page cache is dropped before each
run; wall seconds, CPU seconds (user + sys, of the process and its
children) and peak memory come from GNU time. Day 1 of the first round is
restored and compared byte for byte.

    python benchmarks/bench_writepath.py [--work DIR] [--tree PATH ...] [--rounds 3] [--no-big]

Results go to stdout and benchmarks/results/writepath-<time>.json.
"""

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GIB = 1 << 30


def drop_caches():
    subprocess.run(["sync"], check=True)
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError:
        pass  # not root: the runs are warm, and the notes must say so


def timed(tree, args):
    """Run `python -m foundation ARGS` from `tree` -> {wall_s, cpu_s, peak_rss_kb}."""
    out = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"writepath-time-{os.getpid()}")
    cmd = ["/usr/bin/time", "-f", "%e %U %S %M", "-o", out, sys.executable, "-m", "foundation", *args]
    p = subprocess.run(cmd, cwd=tree, env=dict(os.environ, PYTHONPATH=tree), capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(f"{' '.join(args)} failed in {tree}: {p.stderr[-2000:]}")
    wall, user, sys_, rss = open(out).read().split()[-4:]
    os.unlink(out)
    return {"wall_s": float(wall), "cpu_s": round(float(user) + float(sys_), 2), "peak_rss_kb": int(rss)}


def sha256(path, size=None):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        left = size
        while left is None or left > 0:
            b = f.read(16 << 20 if left is None else min(16 << 20, left))
            if not b:
                break
            h.update(b)
            if left is not None:
                left -= len(b)
    return h.hexdigest()


def big_images(work, size):
    """day0/day1 of the workload at the start of `size`-byte sparse files (made once)."""
    d0, d1 = os.path.join(work, "big0.raw"), os.path.join(work, "big1.raw")
    if not (os.path.exists(d0) and os.path.getsize(d0) == size):
        for src, dst in (("day0.raw", d0), ("day1.raw", d1)):
            subprocess.run(["cp", "--sparse=always", os.path.join(work, src), dst], check=True)
            os.truncate(dst, size)
    return d0, d1


def day_runs(tree, store, key, images, changed, empty, label, out):
    """Init a store, import day 0, day 1 with --changed, then a day with no change."""
    shutil.rmtree(store, ignore_errors=True)
    base = ["--store", store, "--key-file", key]
    if os.path.exists(key):
        os.unlink(key)
    subprocess.run([sys.executable, "-m", "foundation", *base, "init", store, "--max-log-size", "16G"],
                   cwd=tree, env=dict(os.environ, PYTHONPATH=tree), check=True, capture_output=True)
    for day, image, extra in ((0, images[0], []), (1, images[1], ["--changed", changed]),
                              (2, images[1], ["--changed", empty])):
        drop_caches()
        r = timed(tree, [*base, "import-image", "bench", image, "--at", f"2024-01-0{day + 1}T03:00:00Z", *extra])
        out.setdefault(f"{label}day{day}", []).append(r)
        print(f"  {label}day{day}: {r}", flush=True)
    return base


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", default="/var/tmp/writepath", help="scratch directory (the workload is made there once)")
    p.add_argument("--tree", action="append", help="code tree to run (repeat to compare; default: this one)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--no-big", action="store_true", help="skip the 64 GiB disk")
    p.add_argument("--note", default="", help="what the machine was doing, for the record")
    a = p.parse_args(argv)
    trees = [os.path.abspath(t) for t in (a.tree or [ROOT])]
    os.makedirs(a.work, exist_ok=True)
    wl = os.path.join(a.work, "w2g")
    if not os.path.exists(os.path.join(wl, "manifest.json")):
        subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "workload.py"), wl, "--size", "2G",
                        "--days", "2"], check=True)
    manifest = json.load(open(os.path.join(wl, "manifest.json")))
    empty = os.path.join(a.work, "empty.json")
    with open(empty, "w") as f:
        f.write("[]")
    images = (os.path.join(wl, "day0.raw"), os.path.join(wl, "day1.raw"))
    changed = os.path.join(wl, "day1.changed.json")
    big = None if a.no_big else big_images(wl, 64 * GIB)
    runs = {}
    for rnd in range(a.rounds):
        for t in (trees if rnd % 2 == 0 else trees[::-1]):
            name = os.path.basename(t.rstrip("/"))
            print(f"round {rnd + 1}, {t}: load average {os.getloadavg()[0]:.2f}", flush=True)
            res = runs.setdefault(name, {})
            store, key = os.path.join(a.work, "store"), os.path.join(a.work, "key")
            base = day_runs(t, store, key, images, changed, empty, "", res)
            if rnd == 0:
                out = os.path.join(a.work, "restored.raw")
                timed(t, [*base, "restore", "bench@2024-01-02T03:00:00Z", out])
                same = sha256(out) == manifest["day"][1]["sha256"]
                os.unlink(out)
                print(f"  restore of day 1 identical: {same}", flush=True)
                if not same:
                    raise SystemExit(f"{t}: the restore of day 1 differs from the image")
            if big:
                day_runs(t, store, key, big, changed, empty, "64G-", res)
            shutil.rmtree(store, ignore_errors=True)
    summary = {name: {k: {"wall_s": statistics.median(r["wall_s"] for r in v),
                          "cpu_s": statistics.median(r["cpu_s"] for r in v),
                          "peak_rss_kb": max(r["peak_rss_kb"] for r in v)} for k, v in res.items()}
               for name, res in runs.items()}
    print(json.dumps(summary, indent=1))
    result = {"note": a.note, "load_average_end": os.getloadavg(), "trees": trees, "rounds": a.rounds,
              "workload": "benchmarks/workload.py 2 GiB seed 1 (1.37 GB of data); 64G-: the same bytes at the "
                          "start of a 64 GiB sparse file", "medians": summary, "runs": runs}
    path = os.path.join(ROOT, "benchmarks", "results", f"writepath-{time.strftime('%Y%m%d-%H%M%S')}.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    print(path)


if __name__ == "__main__":
    main()
