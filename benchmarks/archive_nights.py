"""Nights of `foundation archive` from two source trees on one running domain, cold and warm, A A B B.

The domain is benchmarks/peer_domains.py's (2 GiB qcow2 of workload
content, no guest OS, each night 64 × 1 MiB written through QEMU's
monitor); only Foundation's half of the pair is started. After the full
backup (from the first tree), the nights go to the trees two by two
(A A B B ...), so each tree's second night follows one of its own; the
page cache is dropped before each night unless the schedule says warm
(`--warm`: every other block of four nights runs warm: the store and the
libraries then stay cached from the night before, as on a host that
archives often). Each night is measured (wall, CPU s of the command and
its children, peak RSS) and, with `--timeline`, run through
archive_timeline.py (its per-step ms recorded). The last night of each
tree, and every `--check`-th night, is restored and compared byte for byte.

    python3 benchmarks/archive_nights.py WORK --tree /var/tmp/base --tree . --nights 16 [--warm] [--timeline]
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


def main():
    p = argparse.ArgumentParser()
    p.add_argument("work")
    p.add_argument("--tree", action="append", required=True)
    p.add_argument("--nights", type=int, default=16)
    p.add_argument("--change", type=int, default=64 * MIB)
    p.add_argument("--warm", action="store_true")
    p.add_argument("--timeline", action="store_true")
    p.add_argument("--check", type=int, default=4, help="restore and compare every N-th night (0: the last ones)")
    p.add_argument("--label", default="nights")
    a = p.parse_args()
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    trees = [os.path.abspath(t) for t in a.tree]
    for t in trees:
        subprocess.run([sys.executable, "-m", "compileall", "-q", "foundation"], cwd=t, check=True)
    work = os.path.join(a.work, "domains")
    subprocess.run(["rm", "-rf", work], check=True)
    os.makedirs(work)
    pair = peer_domains.Pair(work, 2 * GIB, 3 * GIB // 2, print)
    pair.names = {"foundation": f"fdnnight-{os.getpid()}"}
    res = {"label": a.label, "trees": trees, "runs": []}
    env0 = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    try:
        pair.setup()
        name = pair.names["foundation"]
        for n in range(a.nights + 1):
            ref = sha256_file(pair.ref) if n == 0 else pair.night(n, a.change)
            tree = trees[0] if n == 0 else trees[(n - 1) // 2 % len(trees)]
            cold = n == 0 or not (a.warm and (n - 1) // (2 * len(trees)) % 2 == 1)
            cmd = pair.fdn("archive")
            env = dict(env0, PYTHONPATH=tree)
            tl = os.path.join(work, "timeline.txt")
            if a.timeline and n > 0:
                cmd[1:3] = [os.path.join(HERE, "archive_timeline.py")]
                env["TIMELINE_ERR"] = tl
            m = measure.op(cmd, cwd=tree, env=env, cold=cold)
            m.update(night=n, tree=tree, cold=cold, second=n > 0 and (n - 1) % 2 == 1, load=os.getloadavg()[0])
            if a.timeline and n > 0:
                with open(tl) as f:
                    m["timeline"] = f.read().splitlines()
            last = n > a.nights - 2 * len(trees)
            if n == 0 or last or (a.check and n % a.check == 0):
                out = os.path.join(work, "restore.raw")
                snaps = sorted(json.loads(subprocess.run(pair.fdn("list", "--json", name), capture_output=True,
                                                         check=True, cwd=tree, env=env).stdout),
                               key=lambda s: s["time"])
                subprocess.run(pair.fdn("restore", f"{name}@{snaps[n]['time']}", out), check=True,
                               capture_output=True, cwd=tree, env=env)
                m["restored_equal"] = sha256_file(out) == ref
                os.unlink(out)
                if not m["restored_equal"]:
                    raise SystemExit(f"night {n}: the restore differs from the reference")
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
    print(measure.save(f"archive-nights-{a.label}", res))


if __name__ == "__main__":
    main()
