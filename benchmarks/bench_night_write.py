#!/usr/bin/env python3
"""The store's write of a night, alone: 64 MiB of a day's changed blocks into a fresh store, pipelined.

A night of `foundation archive` spends most of its time in the store's write
of what changed (64 MiB in the virtnbdbackup comparison); this times that write
in process, without libvirt, QEMU or the imports around it. Each run is a
child process (`--tree`: the code tree on its PYTHONPATH) that reads the first
64 MiB of `dayN.raw`'s changed ranges (the compare workload's day images) into
memory, opens a fresh copy of an empty encrypted compare-by-hash store, and
writes the blocks in batches of `--batch` KiB through `pipelined()` /
`write_blocks`, as vm/sink.py does; wall and CPU seconds (user + sys of the
whole process, all threads) of the write scope alone, and the peak RSS. The
variants (trees x batch sizes x fill threads) are run in turn each round.

    python benchmarks/bench_night_write.py --tree /work/main --tree . [--batch 1024 --batch 2048]
        [--fill-threads 0 --fill-threads 1] [--rounds 6]

Results go to stdout and benchmarks/results/night-write-<time>.json.
"""

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import measure  # noqa: E402
DAYS = "/var/tmp/foundation-compare/days-2147483648-8-1"

CHILD = r'''
import json, os, resource, shutil, sys, time
from foundation.store.store import Store
import foundation.store.dedup as dd
days, work, batch, day, fill = sys.argv[1], sys.argv[2], int(sys.argv[3]) << 10, int(sys.argv[4]), int(sys.argv[5])
if fill:  # the fill thread's native.fill on this many threads (the rest of the write as it is)
    cls = next(c for c in vars(dd).values() if isinstance(c, type) and "_fill" in vars(c))
    orig = cls._fill
    def _fill(self, data, bs, btype=dd.DATA):
        t, self.tuning.threads = self.tuning.threads, fill
        try:
            return orig(self, data, bs, btype)
        finally:
            self.tuning.threads = t
    cls._fill = _fill
tmpl, kf = os.path.join(work, "empty"), os.path.join(work, "key")
if not os.path.exists(tmpl):
    os.mkdir(tmpl)
    Store.create(tmpl, key_file=kf)
data = bytearray()
with open(f"{days}/day{day}.raw", "rb") as f:
    for off, ln in json.load(open(f"{days}/day{day}.changed.json")):
        data += os.pread(f.fileno(), ln, off)
        if len(data) >= 64 << 20:
            break
del data[64 << 20:]
bufs = [bytearray(data[i:i + batch]) for i in range(0, len(data), batch)]
del data
dst = os.path.join(work, "s")
shutil.rmtree(dst, ignore_errors=True)
shutil.copytree(tmpl, dst)
s = Store.open(dst, key_file=kf, writable=True)
r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
with s.pipelined(expect=sum(map(len, bufs)) // s.block_size):
    for b in bufs:
        s.write_blocks(b)
t1 = time.perf_counter()
r1 = resource.getrusage(resource.RUSAGE_SELF)
s.close()
shutil.rmtree(dst)
print(json.dumps({"wall": t1 - t0, "cpu": r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime,
                  "maxrss_mb": r1.ru_maxrss / 1024}))
'''


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tree", action="append", help="code tree (repeat to compare; default: this one)")
    p.add_argument("--batch", action="append", type=int, help="batch KiB (repeat; default 1024, a night's)")
    p.add_argument("--fill-threads", action="append", type=int,
                   help="threads of the fill thread's native.fill, 0 = the store's own (repeat; default 0)")
    p.add_argument("--day", type=int, default=1)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--work", default="/var/tmp/night-write")
    p.add_argument("--note", default="")
    a = p.parse_args(argv)
    os.makedirs(a.work, exist_ok=True)
    variants = list(itertools.product([os.path.abspath(t) for t in a.tree or [ROOT]], a.batch or [1024],
                                      a.fill_threads or [0]))
    runs = {v: [] for v in variants}
    for r in range(a.rounds):
        for v in (variants if r % 2 == 0 else variants[::-1]):  # alternated: neither always first
            tree, batch, fill = v
            env = dict(os.environ, PYTHONPATH=tree)
            out = subprocess.run([sys.executable, "-c", CHILD, DAYS, a.work, str(batch), str(a.day), str(fill)],
                                 env=env, check=True, capture_output=True, text=True).stdout
            got = json.loads(out.splitlines()[-1])
            got["load"] = os.getloadavg()[0]
            runs[v].append(got)
            print(r, tree, batch, fill, {k: round(x, 4) for k, x in got.items()}, flush=True)
    summary = []
    for (tree, batch, fill), rs in runs.items():
        med = {k: round(statistics.median(x[k] for x in rs), 4) for k in ("wall", "cpu", "maxrss_mb")}
        summary.append({"tree": tree, "batch_kib": batch, "fill_threads": fill, "median": med, "runs": rs})
        print(tree, batch, fill, med)
    res = {"when": time.strftime("%Y%m%d-%H%M%S"), "day": a.day, "rounds": a.rounds, "note": a.note,
           "cpus": os.cpu_count(), "variants": summary}
    print("results:", measure.save("night-write", res))


if __name__ == "__main__":
    main()
