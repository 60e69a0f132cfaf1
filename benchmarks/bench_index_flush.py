"""One index flush alone: N sorted fresh entries merged into an index of B buckets (filled to 55 %,
as after a few nights of archive_profile.py's domain), warm page cache, each round on a fresh copy
of the same index -> CPU s, wall s (medians) and the process's peak RSS. Run it once per tree:

    PYTHONPATH=TREE python3 benchmarks/bench_index_flush.py [--buckets 15321] [--entries 30000] [--rounds 7] [--work DIR]
"""

import argparse
import json
import os
import resource
import shutil
import statistics
import time

from foundation import native
from foundation.store import index as I
from foundation.store.disk import Disk


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--buckets", type=int, default=15321)
    p.add_argument("--entries", type=int, default=30000)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--work", default="/var/tmp/bench-index-flush")
    a = p.parse_args()
    os.makedirs(a.work, exist_ok=True)
    disk, uuid, src = Disk(a.work), b"u" * 16, os.path.join(a.work, f"index-{a.buckets}.src")
    if not os.path.exists(src):
        idx = I.Index.create(src + ".tmp", disk, 32, a.buckets, a.buckets, uuid)
        ents = bytearray(os.urandom(40 * int(a.buckets * 102 * 0.55)))
        native.sort_entries(ents, 40, 32)
        idx.flush(ents, 1)
        idx.install(src + ".tmp")
        idx.close()
        os.replace(src + ".tmp", src)
    cpu, wall = [], []
    for _ in range(a.rounds):
        shutil.copyfile(src, os.path.join(a.work, "index"))
        idx = I.Index.open(os.path.join(a.work, "index"), disk, 32, uuid, True)
        ents = bytearray(os.urandom(40 * a.entries))
        native.sort_entries(ents, 40, 32)
        c0, w0 = time.process_time(), time.perf_counter()
        idx.flush(ents, 2)
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
        idx.close()
    print(json.dumps({"tree": os.path.dirname(os.path.dirname(os.path.dirname(I.__file__))),
                      "buckets": a.buckets, "entries": a.entries, "rounds": a.rounds,
                      "cpu_s": round(statistics.median(cpu), 4), "wall_s": round(statistics.median(wall), 4),
                      "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))


if __name__ == "__main__":
    main()
