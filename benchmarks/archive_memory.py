"""Where `foundation archive`'s peak memory comes from: one running TCG domain (archive_profile.py's),
a full backup and nights, each run from a source tree under memprobe/ (VmRSS every 5 ms, every
thread's stack and the largest mappings at each new high), no restores.

    python3 benchmarks/archive_memory.py WORK [--nights 8] --tree /path/a [--tree /path/b] [--out DIR]

Nights cycle through the trees (A B A B ...); the full backup runs from the first. Prints each run
(wall, CPU, peak RSS by wait4) and the peak's largest mappings; the probes stay in --out.
"""

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import measure  # noqa: E402
import peer_domains  # noqa: E402

GIB, MIB = 1 << 30, 1 << 20


def main():
    p = argparse.ArgumentParser()
    p.add_argument("work")
    p.add_argument("--nights", type=int, default=8)
    p.add_argument("--tree", action="append", required=True)
    p.add_argument("--out", help="directory for the probes (default WORK/probes)")
    a = p.parse_args()
    out = a.out or os.path.join(a.work, "probes")
    os.makedirs(out, exist_ok=True)
    work = os.path.join(a.work, "domains")
    subprocess.run(["rm", "-rf", work], check=True)
    os.makedirs(work)
    pair = peer_domains.Pair(work, 2 * GIB, 3 * GIB // 2, print)
    pair.names = {"foundation": f"fdnmem-{os.getpid()}"}
    runs = []
    try:
        pair.setup()
        for n in range(a.nights + 1):
            if n:
                pair.night(n, 64 * MIB)
            tree = os.path.abspath(a.tree[0] if n == 0 else a.tree[(n - 1) % len(a.tree)])
            probe = os.path.join(out, f"{os.path.basename(tree)}-night{n}.json")
            m = measure.op(pair.fdn("archive"), cwd=tree,
                           env={"PYTHONPATH": f"{tree}:{os.path.join(HERE, 'memprobe')}", "MEMPROBE": probe})
            m.update(night=n, tree=tree, load=os.getloadavg()[0])
            with open(probe) as f:
                highs = json.load(f)["highs"]
            m["top_at_peak"] = highs[-1].get("top") if highs else None
            print(json.dumps(m), flush=True)
            runs.append(m)
    finally:
        pair.close()
        subprocess.run(["rm", "-rf", work])
    print(measure.save("archive-memory", {"runs": runs}))


if __name__ == "__main__":
    main()
