#!/usr/bin/env python3
"""Cold restores of the same day by Foundation and restic, and reads of it through the /snapshot tree.

Runs on the repositories that `compare_tools.py --keep` left in its work
directory (repo-foundation-hash, repo-restic and the workload's manifest):
each round restores the last day with every entry in turn, the page cache
dropped before each restore, and checks each output against the day's
SHA-256. An entry is `restic`, `foundation` (this tree's `restore`),
`foundation=DIR` (the tree at DIR: a before/after pair on one store), or
`fuse` / `fuse=DIR`: `foundation mount` of that tree serves the store, and
the run is `dd bs=1M` of the day's vda.raw to /dev/null, as a user copying
a past disk (its CPU seconds are the server's and dd's; its bytes are
checked once, warm, untimed). Reports per entry the median wall seconds,
median CPU seconds (user+sys of the process and its children) and MB/s of
the image size.

    sudo python benchmarks/bench_restore_peers.py --work /tmp/foundation-bench [--runs 5]
        [--entry foundation --entry restic --entry fuse --entry foundation=/path/to/other/tree]

Results: stdout and benchmarks/results/restore-peers-TIMESTAMP.json.
"""

import argparse
import glob
import hashlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from measure import drop_caches  # noqa: E402  (benchmarks/ is the script's own directory)

from workload import sha256_file  # noqa: E402

PASSWORD = "benchmark-password"   # compare_tools.py's


def children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def proc_cpu(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Mount:
    """`foundation mount` of one tree on the store, for `fuse` entries."""

    def __init__(self, entry, work, day):
        tree = entry.partition("=")[2] or ROOT
        self.mnt = os.path.join(work, "mnt-" + hashlib.sha1(tree.encode()).hexdigest()[:8])
        os.makedirs(self.mnt, exist_ok=True)
        self.p = subprocess.Popen([sys.executable, "-m", "foundation", "--store",
                                   os.path.join(work, "repo-foundation-hash"),
                                   "--key-file", os.path.join(work, "foundation-hash.key"),
                                   "mount", self.mnt, "--utc", "--no-allow-other"],
                                  cwd=tree, env=dict(os.environ, PYTHONPATH=tree))
        self.path = os.path.join(self.mnt, f"2024/01/{day + 1:02d}/bench/vda.raw")
        for _ in range(300):
            if os.path.exists(self.path):
                break
            time.sleep(0.1)
        else:
            self.close()
            raise SystemExit(f"the tree of {tree} did not come up on {self.mnt}")
        self.checked = None

    def close(self):
        self.p.terminate()
        self.p.wait()


def command(entry, work, day, out_dir):
    """(argv, env, path of the restored image) of one entry."""
    if entry == "restic":
        env = {"RESTIC_PASSWORD": PASSWORD, "RESTIC_CACHE_DIR": os.path.join(work, "restic-cache")}
        img = os.path.join(work, "current", "disk.raw")
        return (["restic", "-r", os.path.join(work, "repo-restic"), "restore", "latest", "--target", out_dir, "-q"],
                env, os.path.join(out_dir, img.lstrip("/")))
    tree = entry.partition("=")[2] or ROOT
    out = os.path.join(out_dir, "disk.raw")
    return ([sys.executable, "-m", "foundation", "--store", os.path.join(work, "repo-foundation-hash"),
             "--key-file", os.path.join(work, "foundation-hash.key"), "restore",
             f"bench@2024-01-{day + 1:02d}T03:00:00Z", out], {"PYTHONPATH": tree, "PWD": tree}, out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", default="/tmp/foundation-bench", help="compare_tools.py's --work (run with --keep)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--entry", action="append", help="restic, foundation or foundation=TREE (repeatable)")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    a = ap.parse_args()
    entries = a.entry or ["foundation", "restic"]
    days = sorted(glob.glob(os.path.join(a.work, "days-*", "manifest.json")), key=os.path.getmtime)
    if not days:
        sys.exit(f"no workload manifest under {a.work}: run compare_tools.py --keep --work {a.work} first")
    with open(days[-1]) as f:
        man = json.load(f)
    day = len(man["day"]) - 1
    load0 = os.getloadavg()
    want, size = man["day"][day]["sha256"], man["size"]
    out_dir = os.path.join(a.work, "restore-peers")
    res = {e: [] for e in entries}
    mounts = {e: Mount(e, a.work, day) for e in entries if e.startswith("fuse")}
    try:
        measure(a, entries, mounts, res, day, want, size, out_dir)
    finally:
        for m in mounts.values():
            m.close()
    summary = {}
    for e, rs in res.items():
        w = statistics.median(r["wall_s"] for r in rs)
        summary[e] = {"wall_s": w, "cpu_s": statistics.median(r["cpu_s"] for r in rs),
                      "MBps": round(size / w / 1e6, 1), "correct": all(r["correct"] for r in rs)}
        print(f"{e}: median {w:.2f} s wall, {summary[e]['cpu_s']:.2f} s CPU, {summary[e]['MBps']} MB/s")
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, f"restore-peers-{time.strftime('%Y%m%d-%H%M%S')}.json")
    with open(path, "w") as f:
        json.dump({"size": size, "day": day, "runs": a.runs, "load_before": load0, "load_after": os.getloadavg(),
                   "summary": summary, "raw": res}, f, indent=1)
    print(f"results: {path}")


def measure(a, entries, mounts, res, day, want, size, out_dir):
    for k in range(a.runs):
        order = entries if k % 2 == 0 else entries[::-1]
        for e in order:
            shutil.rmtree(out_dir, ignore_errors=True)
            os.makedirs(out_dir)
            if e.startswith("fuse"):
                m = mounts[e]
                drop_caches()
                s0, c0, t0 = proc_cpu(m.p.pid), children_cpu(), time.perf_counter()
                subprocess.run(["dd", f"if={m.path}", "of=/dev/null", "bs=1M"], check=True,
                               stderr=subprocess.DEVNULL)
                wall = time.perf_counter() - t0
                cpu = children_cpu() - c0 + proc_cpu(m.p.pid) - s0
                if m.checked is None:
                    m.checked = sha256_file(m.path) == want
                ok = m.checked
            else:
                argv, env, path = command(e, a.work, day, out_dir)
                drop_caches()
                c0, t0 = children_cpu(), time.perf_counter()
                subprocess.run(argv, env=dict(os.environ, **env), cwd=env.get("PWD", out_dir), check=True,
                               stdout=subprocess.DEVNULL)
                wall, cpu = time.perf_counter() - t0, children_cpu() - c0
                ok = sha256_file(path) == want
            res[e].append({"wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "correct": ok})
            print(f"  run {k} {e}: {wall:.2f} s wall, {cpu:.2f} s CPU, {size / wall / 1e6:.0f} MB/s, correct={ok}",
                  flush=True)
    shutil.rmtree(out_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
