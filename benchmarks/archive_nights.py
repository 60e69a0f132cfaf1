"""Nights of `foundation archive` from two source trees, paired: two identical running domains, one per tree.

The domains are benchmarks/peer_domains.py's pair (2 GiB qcow2 of
workload content, no guest OS), each with a store, config and state
directory of its own: tree A archives the first, tree B the second. Each
night the same 64 × 1 MiB is written into both (through QEMU's monitor),
then both trees archive it (A first two nights, then B first two: each tree first and
second on cold and on warm nights), the page
cache dropped before each archive (`--warm`: every other night not
dropped, for both). So both trees see the same nights, including those
whose writes fall where the file listings were read from (those list the
slow way). Each archive is measured (wall, CPU s of the command and its
children, peak RSS) and, with `--timeline`, run through
archive_timeline.py (its per-step ms recorded). Every `--check`-th night
and the last are restored from both stores and compared byte for byte.

    python3 benchmarks/archive_nights.py WORK --tree /var/tmp/base --tree . --nights 10 [--warm] [--timeline]
    python3 benchmarks/archive_nights.py --steps results/archive-nights-X.json   (the step medians again)
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import measure  # noqa: E402
import peer_domains  # noqa: E402
from workload import sha256_file  # noqa: E402

GIB, MIB = 1 << 30, 1 << 20


STEPS = ("domain.Domain.snapshot", "source.SnapshotSource.__init__", "sink.StoreSink.write_disk",
         "tree._Builder.ensure", "sink.StoreSink.read_ahead [prefetch]", "archiver.Archiver._cleanup")


def steps(res):
    """Per tree, cold and warm: the median over the nights of each STEPS' ms (summed over its calls
    in a night), of the gap from the snapshot's end to the write's start, and of the timeline's end."""
    out = {}
    for t in res["trees"]:
        for cold in (True, False):
            nights = [r for r in res["runs"] if r["night"] > 0 and r["tree"] == t and r["cold"] == cold
                      and r.get("timeline")]
            if not nights:
                continue
            per = {}
            for r in nights:
                got = {}
                for line in r["timeline"]:
                    f = line.split(None, 3)
                    if len(f) == 4 and not line.startswith("waits"):
                        got.setdefault(f[3], []).append((float(f[0]), float(f[1])))
                for k in STEPS:
                    per.setdefault(k, []).append(sum(e - s for s, e in got.get(k, [])))
                snap, write = got.get("domain.Domain.snapshot"), got.get("sink.StoreSink.write_disk")
                if snap and write:
                    per.setdefault("snapshot end -> write start", []).append(write[0][0] - snap[0][1])
                per.setdefault("timeline end", []).append(max(e for v in got.values() for _, e in v))
            out.setdefault(t, {})["cold" if cold else "warm"] = {
                k: round(statistics.median(v), 1) for k, v in per.items()}
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("work")
    p.add_argument("--tree", action="append", required=True, help="two source trees (A, then B)")
    p.add_argument("--nights", type=int, default=10)
    p.add_argument("--change", type=int, default=64 * MIB)
    p.add_argument("--warm", action="store_true", help="every other night with the page cache kept")
    p.add_argument("--timeline", action="store_true")
    p.add_argument("--check", type=int, default=5, help="restore and compare every N-th night (and the last)")
    p.add_argument("--label", default="nights")
    p.add_argument("--python", action="append", help="the interpreter that runs each tree (A, then B; default: this one)")
    if sys.argv[1:2] == ["--steps"]:
        for f in sys.argv[2:]:
            with open(f) as fh:
                print(f, json.dumps(steps(json.load(fh)), indent=1))
        return
    a = p.parse_args()
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)   # else each run recompiles every module it imports
    trees = [os.path.abspath(t) for t in a.tree]
    if len(trees) != 2:
        p.error("give two --tree")
    pys = a.python or [sys.executable] * 2
    if len(pys) != 2:
        p.error("give two --python, or none")
    for t, py in zip(trees, pys):
        subprocess.run([py, "-m", "compileall", "-q", "foundation"], cwd=t, check=True)
    work = os.path.join(a.work, "domains")
    subprocess.run(["rm", "-rf", work], check=True)
    os.makedirs(work)
    pair = peer_domains.Pair(work, 2 * GIB, 3 * GIB // 2, print)
    pid = os.getpid()
    pair.names = {"foundation": f"fdnA-{pid}", "virtnbdbackup": f"fdnB-{pid}"}
    res = {"label": a.label, "trees": trees, "pythons": pys, "runs": []}
    try:
        pair.setup()
        # tree B's own store, config and state directory, for the second domain
        confs = [pair.config, os.path.join(work, "b.toml")]
        store_b = os.path.join(work, "store-b")
        key_b = os.path.join(work, "b.key")
        measure.run([pys[1], "-m", "foundation", "--key-file", key_b, "init", store_b], cwd=trees[1])
        with open(confs[1], "w") as f:
            f.write(f'store = "{store_b}"\nkey_file = "{key_b}"\nstate_dir = "{work}/state-b"\n'
                    f'vms = ["{pair.names["virtnbdbackup"]}"]\n')
        names = [pair.names["foundation"], pair.names["virtnbdbackup"]]
        for n in range(a.nights + 1):
            ref = sha256_file(pair.ref) if n == 0 else pair.night(n, a.change)
            cold = n == 0 or not (a.warm and n % 2 == 0)
            order = (0, 1) if n % 4 in (1, 2) else (1, 0)   # who goes first: A A B B, across cold and warm
            for i in order:
                tree, env = trees[i], {"PYTHONPATH": trees[i]}
                cmd = [pys[i], "-m", "foundation", "--config", confs[i], "archive"]
                tl = os.path.join(work, "timeline.txt")
                if a.timeline and n > 0:
                    cmd[1:3] = [os.path.join(HERE, "archive_timeline.py")]
                    env["TIMELINE_ERR"] = tl
                m = measure.op(cmd, cwd=tree, env=env, cold=cold)
                m.update(night=n, tree=tree, cold=cold, first=i == order[0], load=os.getloadavg()[0])
                if a.timeline and n > 0:
                    with open(tl) as f:
                        m["timeline"] = f.read().splitlines()
                if n == 0 or n == a.nights or (a.check and n % a.check == 0):
                    out = os.path.join(work, "restore.raw")
                    base = [pys[i], "-m", "foundation", "--config", confs[i]]
                    snaps = sorted(json.loads(subprocess.run(base + ["list", "--json", names[i]], capture_output=True,
                                                             check=True, cwd=tree, env=dict(os.environ, **env)).stdout),
                                   key=lambda s: s["time"])
                    subprocess.run(base + ["restore", f"{names[i]}@{snaps[n]['time']}", out], check=True,
                                   capture_output=True, cwd=tree, env=dict(os.environ, **env))
                    m["restored_equal"] = sha256_file(out) == ref
                    os.unlink(out)
                    if not m["restored_equal"]:
                        raise SystemExit(f"night {n}, tree {tree}: the restore differs from the reference")
                print(json.dumps({k: v for k, v in m.items() if k != "timeline"}), flush=True)
                res["runs"].append(m)
    finally:
        pair.close()
    for t in trees:
        for cold in (True, False):
            ns = [r for r in res["runs"] if r["night"] > 0 and r["tree"] == t and r["cold"] == cold]
            if ns:
                med = {k: statistics.median(r[k] for r in ns) for k in ("seconds", "cpu_seconds", "peak_rss")}
                res.setdefault("medians", {}).setdefault(t, {})["cold" if cold else "warm"] = dict(med, n=len(ns))
                print(f"{t} {'cold' if cold else 'warm'}: {len(ns)} nights, median {med['seconds']:.3f} s wall, "
                      f"{med['cpu_seconds']:.3f} CPU s, {med['peak_rss'] / 1e6:.1f} MB peak")
    # paired: the night's difference B - A, same night, same content
    diffs = {}
    for n in range(1, a.nights + 1):
        r = {x["tree"]: x for x in res["runs"] if x["night"] == n}
        if len(r) == 2:
            for k in ("seconds", "cpu_seconds", "peak_rss"):
                diffs.setdefault(k, []).append(r[trees[1]][k] - r[trees[0]][k])
    res["paired_median_diff_b_minus_a"] = {k: statistics.median(v) for k, v in diffs.items()}
    print("paired median B - A:", res["paired_median_diff_b_minus_a"])
    if a.timeline:
        res["steps_ms"] = steps(res)
        print(json.dumps(res["steps_ms"], indent=1))
    print(measure.save(f"archive-nights-{a.label}", res))


if __name__ == "__main__":
    main()
