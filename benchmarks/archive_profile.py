"""Where Foundation's VM archive spends its time: one running TCG domain, a full backup and nights, each restored.

The domain is benchmarks/peer_domains.py's (a 2 GiB qcow2 of workload
content, no guest OS, the nights' 1 MiB pieces written through QEMU's
monitor); only Foundation's half of the pair is started. Each archive runs
cold, measured (wall, CPU, peak RSS), and with `--profile DIR` also once
under cProfile instead (its figures then include the profiler's cost). Every night is restored and checked byte for byte against the
reference image. With two `--tree DIR` (source trees of Foundation, e.g.
main and a branch) the nights alternate between them two by two, A A B B
A A ..., each `foundation archive` run from its tree on the same domain
and store (the full backup from the first); the medians per tree are
printed over the second night of each pair, so that each figure is a night
after a night of the same code (what a tree keeps for the next night, such
as the file listings' `looked` ranges, is then its own).

    python3 benchmarks/archive_profile.py WORK [--nights 3] [--label before] [--profile DIR]
    python3 benchmarks/archive_profile.py WORK --nights 20 --tree /work/main --tree . --label night
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
    p.add_argument("--nights", type=int, default=3)
    p.add_argument("--size", type=int, default=2 * GIB)
    p.add_argument("--data", type=int, default=3 * GIB // 2)
    p.add_argument("--change", type=int, default=64 * MIB)
    p.add_argument("--label", default="run")
    p.add_argument("--profile", help="directory for cProfile dumps of a full and a night archive")
    p.add_argument("--tree", action="append", default=[],
                   help="a Foundation source tree to run `archive` from (repeat: nights alternate A B B A ...)")
    a = p.parse_args()
    trees = [os.path.abspath(t) for t in a.tree]
    work = os.path.join(a.work, "domains")
    subprocess.run(["rm", "-rf", work], check=True)
    os.makedirs(work)
    pair = peer_domains.Pair(work, a.size, a.data, print)
    pair.names = {"foundation": f"fdnprof-{os.getpid()}"}
    res = {"label": a.label, "size": a.size, "data": a.data, "change": a.change, "runs": []}
    try:
        pair.setup()
        name = pair.names["foundation"]
        for n in range(a.nights + 1):
            ref = sha256_file(pair.ref) if n == 0 else pair.night(n, a.change)
            if a.profile:
                os.makedirs(a.profile, exist_ok=True)
                cmd = pair.fdn("archive")
                prof = os.path.join(a.profile, f"{a.label}-night{n}.prof")
                m = measure.op([cmd[0], "-m", "cProfile", "-o", prof, *cmd[1:]])
            elif trees:
                tree = trees[0] if n == 0 else trees[(n - 1) // 2 % len(trees)]      # A A B B A A ...
                # run from the tree: `python -m` puts the working directory before PYTHONPATH
                m = measure.op(pair.fdn("archive"), cwd=tree, env={"PYTHONPATH": tree})
                m["tree"], m["second"] = tree, n > 0 and (n - 1) % 2 == 1
            else:
                m = pair.backup("foundation", n)
            m["night"] = n
            out = os.path.join(work, "restore.raw")
            snaps = sorted(json.loads(subprocess.run(pair.fdn("list", "--json", name), capture_output=True,
                                                     check=True).stdout), key=lambda s: s["time"])
            subprocess.run(pair.fdn("restore", f"{name}@{snaps[n]['time']}", out), check=True,
                           capture_output=True)
            m["restored_equal"] = sha256_file(out) == ref
            os.unlink(out)
            print(json.dumps(m), flush=True)
            res["runs"].append(m)
            if not m["restored_equal"]:
                raise SystemExit(f"night {n}: the restore differs from the reference")
        for t in trees:
            # `find` afterwards: listings already up to date (what archive left), and from scratch
            env = {"PYTHONPATH": t}
            scratch = os.path.join(work, "find-state")
            res.setdefault("find", {})[t] = {
                "up_to_date": [measure.op(pair.fdn("find", "*.none"), cwd=t, env=env) for _ in range(3)],
                "from_scratch": [measure.op(pair.fdn("find", "--state-dir", scratch, "--rebuild", "*.none"),
                                            cwd=t, env=env)]}
            subprocess.run(["rm", "-rf", scratch], check=True)
            print(t, "find:", json.dumps(res["find"][t]), flush=True)
        res["load"] = os.getloadavg()
    finally:
        pair.close()
    for t in trees:
        ns = [r for r in res["runs"] if r.get("tree") == t and r.get("second")]
        if ns:
            res.setdefault("medians", {})[t] = med = {
                k: statistics.median(r[k] for r in ns) for k in ("seconds", "cpu_seconds", "peak_rss")}
            print(f"{t}: {len(ns)} nights, median {med['seconds']:.3f} s wall, {med['cpu_seconds']:.3f} CPU s, "
                  f"{med['peak_rss'] / 1e6:.0f} MB peak")
    print(measure.save(f"archive-profile-{a.label}", res))


if __name__ == "__main__":
    main()
