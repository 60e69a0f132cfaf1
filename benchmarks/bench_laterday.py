#!/usr/bin/env python3
"""One later day of the standard workload, again and again, source trees alternated: CPU, wall, memory.

compare_tools.py times each day once; a change to a later day's fixed or
per-block costs needs more rounds than that. This script takes the day
images compare_tools.py made (`--days`, its `days-<size>-<n>-<seed>`
directory, read only), imports days 0 .. N-1 once into an encrypted
compare-by-hash store (as compare_tools.py does: `import-image bench`,
`--changed` after day 0), and then imports day N (`--changed`) ROUNDS
times per tree into a fresh copy of that store, trees alternated, each
run cold (page cache dropped first) and warm (the run right after).
Sealed arenas and summaries are never written again, so the copies hard
link them; every other file is copied. Every run is a child under GNU
time (user + sys CPU seconds of it and its children, wall, peak RSS),
bytecode compiled beforehand (an installed package has it: without it
each run compiles ~120 modules, ~0.1 CPU s). `--verify` restores the
day from the last copy of each tree and checks its SHA-256 against the
manifest. Results go to benchmarks/results/laterday-<time>.json.

    sudo python benchmarks/bench_laterday.py --tree /path/to/main --tree . [--rounds 5] [--verify] [--chrt]
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import measure  # noqa: E402

DAYS = "/var/tmp/foundation-compare/days-2147483648-8-1"


def env(tree, config):
    e = dict(os.environ, PYTHONPATH=tree, FOUNDATION_CONFIG=config)
    e.pop("PYTHONDONTWRITEBYTECODE", None)
    return e


def cmd(store, key, *args):
    return [sys.executable, "-m", "foundation", "--store", store, "--key-file", key, *args]


def day_args(days, man, d, image=None):
    e = man["day"][d]
    args = ["import-image", "bench", image or os.path.join(days, e["image"]), "--at", f"2024-01-{d + 1:02d}T03:00:00Z"]
    if "changed" in e:
        args += ["--changed", os.path.join(days, e["changed"])]
    return args


def copy_store(base, dst):
    """A store to write into: the sealed arenas and summaries hard linked, everything else copied."""
    shutil.rmtree(dst, ignore_errors=True)
    arenas = sorted(os.listdir(os.path.join(base, "arenas")))
    for d, _, files in os.walk(base):
        rel = os.path.relpath(d, base)
        os.makedirs(os.path.join(dst, rel), exist_ok=True)
        for f in files:
            src, out = os.path.join(d, f), os.path.join(dst, rel, f)
            sealed = rel == "summaries" or rel == "arenas" and f != arenas[-1]
            if sealed:
                os.link(src, out)
            else:
                shutil.copy2(src, out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", action="append", required=True, help="a source tree to run (give one or more)")
    ap.add_argument("--days", default=DAYS, help="compare_tools.py's day images and manifest.json")
    ap.add_argument("--day", type=int, default=None, help="the day to import again and again (default: the last)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--verify", action="store_true", help="restore the day from each tree's last copy, check SHA-256")
    ap.add_argument("--work", default=os.environ.get("TMPDIR", "/var/tmp"))
    ap.add_argument("--keep", action="store_true", help="keep the work directory (its base store is reused by --base)")
    ap.add_argument("--base", help="a work directory kept by --keep: its base store is used again")
    ap.add_argument("--chrt", action="store_true", help="the day's import under SCHED_FIFO (chrt -f 10), so that "
                    "other work on the machine takes less of its cores (the disk stays shared)")
    a = ap.parse_args()
    trees = [os.path.abspath(t) for t in a.tree]
    with open(os.path.join(a.days, "manifest.json")) as f:
        man = json.load(f)
    day = len(man["day"]) - 1 if a.day is None else a.day
    work = a.base or tempfile.mkdtemp(prefix="bench-laterday-", dir=a.work)
    config = os.path.join(work, "foundation.toml")
    base, key, state = (os.path.join(work, x) for x in ("base", "key", "state"))
    for t in trees:
        subprocess.run([sys.executable, "-m", "compileall", "-q", "foundation"], cwd=t, env=env(t, config),
                       check=True, capture_output=True)
    runs = {t: {"cold": [], "warm": []} for t in trees}
    try:
        if not a.base:
            with open(config, "w") as f:
                f.write(f'state_dir = "{state}.base"\n')
            os.makedirs(base)
            e = env(trees[0], config)
            measure.run(cmd(base, key, "init", base, "--mode", "hash"), cwd=trees[0], env=e)
            for d in range(day):
                measure.run(cmd(base, key, *day_args(a.days, man, d)), cwd=trees[0], env=e)
        with open(config, "w") as f:
            f.write(f'state_dir = "{state}"\n')
        run = os.path.join(work, "run")
        for r in range(a.rounds):
            for t in trees:
                for mode in ("cold", "warm"):
                    copy_store(base, run)
                    shutil.rmtree(state, ignore_errors=True)
                    shutil.copytree(state + ".base", state)
                    os.sync()
                    # cwd: `python -m` puts it first on sys.path, before PYTHONPATH
                    m = measure.op([*(("chrt", "-f", "10") if a.chrt else ()), *cmd(run, key, *day_args(a.days, man, day))],
                                   cwd=t, env=env(t, config),
                                   cold=mode == "cold")
                    m["load"] = os.getloadavg()[0]
                    runs[t][mode].append(m)
                    print(f"round {r} {mode} {t}: {m['seconds']:.3f} s, {m['cpu_seconds']:.3f} CPU s, "
                          f"{m['peak_rss'] / 1e6:.0f} MB, load {m['load']:.1f}", flush=True)
                if a.verify and r == a.rounds - 1:
                    out = os.path.join(work, "restored.raw")
                    measure.run(cmd(run, key, "restore", f"bench@2024-01-{day + 1:02d}T03:00:00Z", out),
                                cwd=t, env=env(t, config))
                    got = subprocess.run(["sha256sum", out], capture_output=True, text=True).stdout.split()[0]
                    os.unlink(out)
                    runs[t]["verified"] = got == man["day"][day]["sha256"]
                    print(t, "restore of day", day, "matches" if runs[t]["verified"] else "DIFFERS", flush=True)
        for t in trees:
            for mode in ("cold", "warm"):
                rs = runs[t][mode]
                runs[t][f"{mode} median"] = {k: statistics.median(x[k] for x in rs)
                                             for k in ("seconds", "cpu_seconds", "peak_rss")}
        res = dict(days=a.days, day=day, rounds=a.rounds, trees=trees, runs=runs, chrt=a.chrt,
                   commits={t: subprocess.run(["git", "-C", t, "log", "-1", "--format=%h"], capture_output=True,
                                              text=True).stdout.strip() for t in trees})
        measure.save("laterday", res)
    finally:
        if not a.keep and not a.base:
            shutil.rmtree(work, ignore_errors=True)
        else:
            shutil.rmtree(os.path.join(work, "run"), ignore_errors=True)
            print("work directory kept:", work)


if __name__ == "__main__":
    main()
