"""Does a quiet period before a full backup change it? Both tools of peer_domains.py's pair, on
domains set up afresh each round (their images copied just before, as compare_tools does), order
alternated, with and without `peer_domains.settle` before each tool's full backup.

    python3 benchmarks/bench_settle.py [--rounds 4] [--settle 20]

Results go to stdout and benchmarks/results/settle-ab-TIME.json (benchmarks/README.md, wave 12).
"""

import argparse
import json
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import measure  # noqa: E402
import peer_domains  # noqa: E402

GIB = 1 << 30


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=4, help="fresh pairs: unsettled, settled, settled, unsettled, ...")
    p.add_argument("--settle", type=float, default=peer_domains.SETTLE)
    p.add_argument("--work", default="/var/tmp/foundation-settle")
    a = p.parse_args()
    runs = []
    for r in range(a.rounds):
        quiet = a.settle if r % 4 in (1, 2) else 0
        work = os.path.join(a.work, "domains")
        shutil.rmtree(a.work, ignore_errors=True)
        os.makedirs(work)
        os.chmod(a.work, 0o755)
        os.chmod(work, 0o755)
        pair = peer_domains.Pair(work, 2 * GIB, 1536 << 20, print)
        try:
            pair.setup()
            order = peer_domains.ORDER if r % 2 == 0 else peer_domains.ORDER[::-1]
            for tool in order:
                if quiet:
                    peer_domains.settle(quiet)
                m = pair.backup(tool, 0)
                row = dict(round=r, settle=quiet, tool=tool, first=tool == order[0],
                           seconds=m["seconds"], cpu_seconds=m["cpu_seconds"])
                print(json.dumps(row), flush=True)
                runs.append(row)
        finally:
            pair.close()
    shutil.rmtree(a.work, ignore_errors=True)
    print(measure.save("settle-ab", {"settle": a.settle, "runs": runs}))


if __name__ == "__main__":
    main()
