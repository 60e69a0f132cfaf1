#!/usr/bin/env python3
"""Restores after a year of nights: the newest day against a day of the first month.

Builds the workload of issue 18 cheaply: VMS disks of --mb MiB each (random
data; --zeros 0.25, the workload before wave 8, leaves a quarter of each as
zeros, so a year of nights wrote data over them and the newest day held 23 %
more than the first month's), imported whole on the first night,
then --nights nights of `import-image --changed` with --at dates one day
apart, each night rewriting 1 MiB of each disk (eight 128 KiB extents at
random places, as a guest writes files). Then `prune --keep-daily 7
--keep-weekly 8 --keep-monthly 13` and `gc`, as a year of the daemon would
(a gc that rewrites nearly every arena lays the log out again, newest day
first; --relayout collects arena by arena first, measures, then runs
`gc --relayout` and measures again). Night 30's restore is also timed on
the store as it stood that night (young.json).
The store is encrypted, by hash, with default arenas.

Then, cold (page cache dropped before each run), it restores the newest
day of the first VM and the day of the first month that survived the
prune, each --runs times, with today's restore (log order) and, when
--before names a commit that still has the old reader, with that reader
(image order, 8192 leaves per sorted batch). For each: seconds of
restore_image, reads and discontiguous reads of the store's files (arenas,
index, summaries: the store's Disk counters, where a discontiguous read is
one that does not start where the previous one on the disk ended), bytes
read, and whether the output equals the disk.

    sudo python benchmarks/bench_restore.py                 # 365 nights (about 10 minutes)
    sudo python benchmarks/bench_restore.py --nights 60     # the quick variant

Results: stdout and benchmarks/results/restore-NIGHTSn-TIMESTAMP.json.
"""

import argparse
import datetime as dt
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import types

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
from measure import drop_caches  # noqa: E402  (benchmarks/ is the script's own directory)
from workload import sha256_file  # noqa: E402

from foundation.catalog import Catalog  # noqa: E402
from foundation.cli import main as cli  # noqa: E402
from foundation.image import RestoreFailed, restore_image  # noqa: E402
from foundation.store import Store  # noqa: E402

MIB = 1 << 20
EXTENT = 128 << 10
START = dt.date(2025, 1, 1)


def at(night):
    return f"{START + dt.timedelta(days=night)}T01:00:00Z"


def build(work, vms, mb, nights, zeros=0.0, seed=18, young_runs=0, gc=(), gc_every=0):
    """The year of nights, pruned and collected -> {vm: sha256 of each kept night's image}. zeros: the
    part of each disk that starts as zeros (whole MiBs); 0 fills every disk with data on the first
    night, so every day holds the same number of non-null blocks."""
    store, key = os.path.join(work, "store"), os.path.join(work, "keys", "store.key")
    os.makedirs(store)
    base = ["--store", store, "--key-file", key]
    assert cli([*base, "init", "--max-log-size", "64G"]) == 0
    rng = random.Random(seed)
    size = mb * MIB
    digests = {f"vm{v}": {} for v in range(vms)}
    images = {}
    for v in range(vms):
        name = f"vm{v}"
        path = images[name] = os.path.join(work, f"{name}.raw")
        with open(path, "wb") as f:
            for o in range(0, size, MIB):
                f.write(rng.randbytes(MIB) if rng.random() >= zeros else bytes(MIB))
        assert cli([*base, "import-image", name, path, "--at", at(0)]) == 0
        if name == "vm0":
            digests[name][0] = sha256_file(path)
    t0 = time.monotonic()
    ranges = os.path.join(work, "changed.json")
    for night in range(1, nights + 1):
        for name, path in images.items():
            changed = []
            with open(path, "r+b") as f:
                for _ in range(MIB // EXTENT):
                    o = rng.randrange(0, size // EXTENT) * EXTENT
                    os.pwrite(f.fileno(), rng.randbytes(EXTENT), o)
                    changed.append([o, EXTENT])
            with open(ranges, "w") as f:
                json.dump(changed, f)
            assert cli([*base, "import-image", name, path, "--at", at(night), "--changed", ranges]) == 0
            if name == "vm0" and night in (30, nights):  # night 30 is January's last: monthly keeps it
                digests[name][night] = sha256_file(path)
        if night == 30 and young_runs:  # January's last day restored on the store of that night
            young(work, store, key, digests["vm0"][30], young_runs)
        if gc_every and night % gc_every == 0 and night < nights:  # the user's routine: prune and gc now and then
            prune_gc(base, gc)
        if night % 30 == 0:
            print(f"  night {night}/{nights} ({time.monotonic() - t0:.0f} s)", file=sys.stderr)
    prune_gc(base, gc)
    with open(os.path.join(work, "digests.json"), "w") as f:  # what a --reuse run checks against
        json.dump(digests, f)
    return store, key, digests


def prune_gc(base, gc):
    assert cli([*base, "prune", "--keep-daily", "7", "--keep-weekly", "8", "--keep-monthly", "13"]) == 0
    assert cli([*base, "gc", "--min-garbage", "0", "--no-replicate", *gc]) == 0


def young(work, store, key, digest, runs):
    """Cold restores of vm0's night 30 on the store as it stood that night (a month old, nothing
    pruned): the time the same bytes took before a year scattered them -> young.json."""
    out = os.path.join(work, "out.raw")
    got = [restore_once(store, key, "vm0", 30, out, lambda s, r, o: restore_image(s, r, o)) for _ in range(runs)]
    res = dict(median_s=statistics.median(r["seconds"] for r in got),
               median_cpu_s=statistics.median(r["cpu_seconds"] for r in got), runs=got,
               correct=sha256_file(out) == digest)
    with open(os.path.join(work, "young.json"), "w") as f:
        json.dump(res, f, indent=1)
    print(f"  night 30 on the month-old store: {res['median_s']:.3f} s, correct={res['correct']}", file=sys.stderr)


def measure(store, key, nights, first, readers, runs, work, digests, agree, layout):
    """Cold restores of the newest day and the first month's, `runs` of each with each reader -> rows."""
    out = os.path.join(work, "out.raw")
    rows = []
    for label, night in (("newest", nights), ("first month", first)):
        for how, fn in readers.items():
            got = [restore_once(store, key, "vm0", night, out, fn) for _ in range(runs)]
            digest = sha256_file(out)
            if night in digests["vm0"]:
                ok = digest == digests["vm0"][night]
            else:  # no digest of that night: the two readers must agree byte for byte
                ok = digest == agree.setdefault(night, digest)
            alloc = os.stat(out).st_blocks * 512
            med = statistics.median(r["seconds"] for r in got)
            cpu = statistics.median(r["cpu_seconds"] for r in got)
            rows.append(dict(day=label, night=night, reader=how, layout=layout, median_s=med, median_cpu_s=cpu,
                             runs=got, correct=ok, allocated_mb=alloc / 1e6))
            print(f"{layout:9} {label:12} night {night:3}  {how:22} {med:6.3f} s ({cpu:5.2f} s CPU)  "
                  f"{got[0]['reads']:5} reads  {got[0]['discontiguous_reads']:5} discontiguous  "
                  f"{got[0]['mb_read']:7.1f} MB read  correct={ok}", flush=True)
    return rows


def old_restore(commit):
    """restore_image of the reader at `commit` (image order), or None if git cannot show it."""
    p = subprocess.run(["git", "-C", ROOT, "show", f"{commit}:foundation/image/reader.py"],
                       capture_output=True, text=True)
    if p.returncode != 0:
        return None
    mod = types.ModuleType("reader_before")
    mod.RestoreFailedNow = RestoreFailed  # exit codes are registered once: derive the old class from today's
    src = p.stdout.replace("class RestoreFailed(Error):", "class RestoreFailed(RestoreFailedNow):")
    exec(compile(src, f"{commit}:foundation/image/reader.py", "exec"), mod.__dict__)
    return mod.restore_image


def restore_once(store_path, key, name, night, out, how):
    """Cold restore of `name` at `night` -> measurements."""
    if os.path.exists(out):
        os.unlink(out)
    cold = drop_caches()
    t0 = time.perf_counter()
    with Store.open(store_path, key_file=key) as s:
        snap = Catalog.load(s).find(name, dt.datetime.fromisoformat(at(night).replace("Z", "+00:00")))
        root = snap.disks["vda"].root
        for c in s.disk.io.values():  # count the restore's reads only
            c.__init__()
        t1, c1 = time.perf_counter(), time.process_time()
        how(s, root, out)
        t2, c2 = time.perf_counter(), time.process_time()
        io = {k: v.as_dict() for k, v in s.disk.io.items()}
    return dict(seconds=t2 - t1, cpu_seconds=c2 - c1, with_open=t2 - t0, reads=sum(v["reads"] for v in io.values()),
                discontiguous_reads=sum(v["seeks"] for v in io.values()),
                mb_read=sum(v["bytes_read"] for v in io.values()) / 1e6, io=io, cold=cold,
                snapshot=snap.time.isoformat())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nights", type=int, default=365)
    ap.add_argument("--vms", type=int, default=3)
    ap.add_argument("--mb", type=int, default=256, help="disk size of each VM in MiB")
    ap.add_argument("--zeros", type=float, default=0.0,
                    help="part of each disk that starts as zeros: 0 (now) fills the disks on the first night, so "
                         "every day holds the same bytes; 0.25 is the workload measured before wave 8")
    ap.add_argument("--build-only", action="store_true", help="build the store (with --keep) and measure nothing")
    ap.add_argument("--runs", type=int, default=3, help="cold restores of each day and reader")
    ap.add_argument("--before", default="cb1d680", help="a commit with the image-order reader ('' to skip)")
    ap.add_argument("--work", help="work directory (default: a temporary one under /var/tmp)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--reuse", action="store_true", help="measure the store a --keep run left in --work")
    ap.add_argument("--gc-every", type=int, default=0, metavar="NIGHTS",
                    help="also prune and gc every NIGHTS nights while the year is built (a user's monthly routine)")
    ap.add_argument("--relayout", action="store_true",
                    help="collect the year arena by arena (gc --in-place), measure, then run `gc --relayout` on "
                         "the store and measure the same restores again (without it: the default gc, which lays "
                         "a year's log out again by itself)")
    a = ap.parse_args()
    global START  # the nights end before today, which a snapshot may not be dated after
    START = dt.date(2025 - (a.nights - 1) // 365, 1, 1)
    work = a.work or tempfile.mkdtemp(prefix="bench-restore-", dir="/var/tmp")
    os.makedirs(work, exist_ok=True)
    try:
        t0 = time.monotonic()
        if a.reuse and os.path.isdir(os.path.join(work, "store")):  # a store kept by an earlier --keep run
            store, key = os.path.join(work, "store"), os.path.join(work, "keys", "store.key")
            build_s = None
            try:  # written by the build since wave 8
                with open(os.path.join(work, "digests.json")) as f:
                    digests = {vm: {int(k): v for k, v in d.items()} for vm, d in json.load(f).items()}
            except FileNotFoundError:
                digests = {"vm0": {a.nights: sha256_file(os.path.join(work, "vm0.raw"))}}
        else:
            # with --relayout the year is first collected arena by arena (--in-place), to compare both
            store, key, digests = build(work, a.vms, a.mb, a.nights, a.zeros, young_runs=a.runs,
                                        gc=["--in-place"] if a.relayout else [], gc_every=a.gc_every)
            build_s = time.monotonic() - t0
            if a.build_only:
                print(f"built in {build_s:.0f} s: {store}")
                return
        with Store.open(store, key_file=key) as s:
            kept = [(x.time.date() - START).days for x in Catalog.load(s).snapshots("vm0")]
        # the first month's last kept day; a short run or an older prune: the oldest day kept
        first = max([n for n in kept if n < 31 and n != a.nights] or [min(kept)])
        readers = {"log order": lambda s, r, out: restore_image(s, r, out)}
        before = old_restore(a.before) if a.before else None
        if before is not None:
            readers[f"image order ({a.before})"] = lambda s, r, out: before(s, r, out)
        agree = {}
        rows = measure(store, key, a.nights, first, readers, a.runs, work, digests, agree, "as built")
        relayout_s = None
        if a.relayout:
            t1 = time.monotonic()
            assert cli(["--store", store, "--key-file", key, "gc", "--relayout", "--no-replicate"]) == 0
            relayout_s = time.monotonic() - t1
            print(f"gc --relayout: {relayout_s:.1f} s", flush=True)
            rows += measure(store, key, a.nights, first, readers, a.runs, work, digests, agree, "relaid")
        try:
            with open(os.path.join(work, "young.json")) as f:
                month_old = json.load(f)
        except FileNotFoundError:
            month_old = None
        ratio, per_mb, over_young = {}, {}, {}
        for layout in dict.fromkeys(r["layout"] for r in rows):
            for how in readers:
                t = {r["day"]: r["median_s"] for r in rows if r["reader"] == how and r["layout"] == layout}
                mb = {r["day"]: r["allocated_mb"] for r in rows if r["reader"] == how and r["layout"] == layout}
                k = how if layout == "as built" else f"{how}, {layout}"
                ratio[k] = t["newest"] / t["first month"]
                # the days need not hold the same bytes: a year of nights writes data over the zeros
                # the first month still had, so the seconds a MB of data restored are compared too
                per_mb[k] = ratio[k] * mb["first month"] / mb["newest"]
                line = (f"{k}: newest / first month = {ratio[k]:.2f} ({mb['newest']:.0f} against "
                        f"{mb['first month']:.0f} MB of data: {per_mb[k]:.2f} a MB)")
                if month_old:
                    over_young[k] = t["newest"] / month_old["median_s"]
                    line += f"; newest / night 30 on the month-old store ({month_old['median_s']:.3f} s) = {over_young[k]:.2f}"
                print(line)
        res = dict(nights=a.nights, first_night=first, reused=build_s is None, load_average=os.getloadavg(), vms=a.vms, mb=a.mb, build_seconds=build_s, rows=rows,
                   newest_over_first_month=ratio, newest_over_first_month_per_mb=per_mb, cpus=os.cpu_count(),
                   month_old_store=month_old, newest_over_month_old_store=over_young, relayout_seconds=relayout_s,
                   store_mb=sum(os.path.getsize(os.path.join(store, "arenas", f))
                                for f in os.listdir(os.path.join(store, "arenas"))) / 1e6)
        os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
        name = f"restore-{a.nights}n-{time.strftime('%Y%m%dT%H%M%S')}.json"
        with open(os.path.join(HERE, "results", name), "w") as f:
            json.dump(res, f, indent=1)
        print(f"results: benchmarks/results/{name}")
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
