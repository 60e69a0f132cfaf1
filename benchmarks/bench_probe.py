#!/usr/bin/env python3
"""Opening an archived disk's volumes, cold: what a first file listing reads before any file.

The raw image given is archived once into a new encrypted store; then, for
each code tree in alternated rounds, the page cache dropped first, one
process opens the store and asks `DiskFiles(...).volumes()` of the day's
disk: the partition table and each partition's file system found, read
from the store. Printed and recorded: milliseconds and CPU ms of that call,
the reads it made (of 64 KiB chunks: guestfs/sources.py's DiskBytes reads
the disk so) and the volumes it found, which must agree between trees.

    sudo python benchmarks/bench_probe.py IMAGE --tree /work/base --tree . [--rounds 3]

IMAGE: e.g. tests/lab's Debian disk (/var/cache/foundation/lab/*/disk.raw)
or a disk of random bytes (no table, no file system). Results: stdout and
benchmarks/results/probe-TIME.json.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from measure import drop_caches, save  # noqa: E402

AT = "2024-01-01T03:00:00Z"

ONE = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
from foundation.store import Store
from foundation.catalog import Catalog
from foundation.snapshotfs.changes import TreeSource
from foundation.guestfs.disk import DiskFiles
import foundation.guestfs.tsk  # the readers imported before the clock starts: reads, not imports
assert foundation.guestfs.tsk.__file__.startswith(sys.argv[1]), foundation.guestfs.tsk.__file__
with Store.open(sys.argv[2], key_file=sys.argv[3]) as s:
    snap = Catalog.load(s).snapshots()[0]
    src = TreeSource(s, snap.disks["vda"], record=True)
    t, c = time.perf_counter(), time.process_time()
    vols = DiskFiles(src, "bench").volumes()
    ms, cpu = 1e3 * (time.perf_counter() - t), 1e3 * (time.process_time() - c)
print(json.dumps(dict(ms=ms, cpu_ms=cpu, reads=len(src.seen), volumes={k: v.type_name for k, v in vols.items()})))
"""


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("image")
    p.add_argument("--tree", action="append", required=True)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    work = tempfile.mkdtemp(prefix="bench-probe-", dir="/var/tmp")
    store, key = os.path.join(work, "store"), os.path.join(work, "key")
    cli = [sys.executable, "-m", "foundation", "--store", store, "--key-file", key]
    subprocess.run([*cli, "init", store, "--mode", "hash"], check=True, stdout=subprocess.DEVNULL)
    subprocess.run([*cli, "import-image", "bench", a.image, "--at", AT], check=True, stdout=subprocess.DEVNULL)
    runs = []
    try:
        for r in range(a.rounds):
            for tree in (a.tree if r % 2 == 0 else a.tree[::-1]):
                drop_caches()
                out = subprocess.run([sys.executable, "-c", ONE, os.path.abspath(tree), store, key],
                                     capture_output=True, text=True, check=True).stdout
                got = dict(json.loads(out), tree=tree, round=r, load=os.getloadavg()[0])
                runs.append(got)
                print(f"{tree} round {r}: {got['ms']:.1f} ms ({got['cpu_ms']:.1f} CPU ms), "
                      f"{got['reads']} reads, {got['volumes']}")
    finally:
        subprocess.run(["rm", "-rf", work])
    found = {json.dumps(x["volumes"], sort_keys=True) for x in runs}
    if len(found) != 1:
        print(f"the trees found different volumes: {found}")
    medians = {t: {k: statistics.median(x[k] for x in runs if x["tree"] == t) for k in ("ms", "cpu_ms", "reads")}
               for t in a.tree}
    for t, m in medians.items():
        print(f"{t}: median {m['ms']:.1f} ms, {m['cpu_ms']:.1f} CPU ms, {m['reads']:.0f} reads")
    print(save("probe", dict(image=a.image, trees=a.tree, runs=runs, medians=medians, same_volumes=len(found) == 1,
                             time=time.strftime("%Y-%m-%d %H:%M:%S"))))
    return 0 if len(found) == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
