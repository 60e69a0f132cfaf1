#!/usr/bin/env python3
"""Peak memory, CPU and wall of a cold `restore` and of a cold `dd` of vda.raw through the tree.

One store (made by the caller: `init`, `import-image` of a workload day
under the name `bench` at 2024-01-01T03:00:00Z), several code trees,
entries alternated round by round, the page cache dropped before each run.
`restore`: wall, CPU (user+sys) and peak RSS from the child's rusage,
the output checked against the image's SHA-256. `fuse`: `foundation mount`
of the tree, `dd bs=1M` of the day's vda.raw to /dev/null (or `--tool cp` /
`qemu-img` convert to a file); CPU is the server's and the tool's, the peak is the server's VmHWM (its bytes are checked
once per tree, warm, untimed).

    sudo python benchmarks/bench_restore_memory.py --store S --key-file K --image day0.raw \\
        --tree /path/a --tree /path/b [--runs 3] [--work /var/tmp/x]

Results: stdout and benchmarks/results/restore-memory-TIMESTAMP.json.
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from measure import drop_caches  # noqa: E402

from workload import sha256_file  # noqa: E402

AT = "2024-01-01T03:00:00Z"


def hwm(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def cpu(pid):
    with open(f"/proc/{pid}/stat") as f:
        x = f.read().rpartition(")")[2].split()
    return (int(x[11]) + int(x[12])) / os.sysconf("SC_CLK_TCK")


def restore(tree, a, want, py=sys.executable):
    out = os.path.join(a.work, "restored.raw")
    if os.path.exists(out):
        os.unlink(out)
    drop_caches()
    t0 = time.monotonic()
    p = subprocess.Popen([py, "-m", "foundation", "--store", a.store, "--key-file", a.key_file,
                          "restore", f"bench@{AT}", out], cwd=tree, env=dict(os.environ, PYTHONPATH=tree))
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.monotonic() - t0
    if status:
        raise SystemExit(f"{tree}: restore failed ({status})")
    same = sha256_file(out) == want
    os.unlink(out)
    if not same:
        raise SystemExit(f"{tree}: the restore differs from the image")
    return {"wall": round(wall, 3), "cpu": round(ru.ru_utime + ru.ru_stime, 3), "peak_mb": round(ru.ru_maxrss / 1024, 1)}


def fuse(tree, a, want, checked, py=sys.executable):
    mnt = os.path.join(a.work, "mnt")
    os.makedirs(mnt, exist_ok=True)
    p = subprocess.Popen([py, "-m", "foundation", "--store", a.store, "--key-file", a.key_file,
                          "mount", mnt, "--utc", "--no-allow-other"], cwd=tree,
                         env=dict(os.environ, PYTHONPATH=tree), stderr=subprocess.DEVNULL)
    path = os.path.join(mnt, "2024/01/01/bench/vda.raw")
    try:
        for _ in range(300):
            if os.path.exists(path):
                break
            time.sleep(0.1)
        else:
            raise SystemExit(f"{tree}: the tree did not come up")
        drop_caches()
        # a booting day's first read: 4 KiB, cold, on a fresh open (an offset no copy has read yet)
        t0 = time.monotonic()
        fd = os.open(path, os.O_RDONLY)
        try:
            os.pread(fd, 4096, 123 << 20)
        finally:
            os.close(fd)
        first = time.monotonic() - t0
        drop_caches()
        c0 = cpu(p.pid)
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.monotonic()
        out = os.path.join(a.work, "copied.raw")
        subprocess.run(TOOLS[a.tool](path, out), check=True, stderr=subprocess.DEVNULL)
        wall = time.monotonic() - t0
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        peak = hwm(p.pid)
        c = cpu(p.pid) - c0 + (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
        if tree not in checked or a.check_every:  # untimed, warm: the copy's bytes read again
            if sha256_file(path) != want or os.path.exists(out) and sha256_file(out) != want:
                raise SystemExit(f"{tree}: vda.raw differs from the image")
            checked.add(tree)
        if os.path.exists(out):
            os.unlink(out)
    finally:
        p.terminate()
        p.wait()
    return {"wall": round(wall, 3), "cpu": round(c, 3), "peak_mb": round(peak / (1 << 20), 1),
            "first_read_ms": round(first * 1000, 1)}


# how a user copies the day out: to /dev/null (the reads alone), or to a file as restore does
TOOLS = {
    "dd": lambda src, out: ["dd", f"if={src}", "of=/dev/null", "bs=1M"],
    "cp": lambda src, out: ["cp", src, out],
    "qemu-img": lambda src, out: ["qemu-img", "convert", "-f", "raw", "-O", "raw", src, out],
}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--store", required=True)
    p.add_argument("--key-file", required=True)
    p.add_argument("--image", required=True, help="the raw image archived as bench@" + AT)
    p.add_argument("--tree", action="append", required=True)
    p.add_argument("--python", action="append", help="the interpreter that runs each tree (in --tree's order; "
                   "default: this one)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--work", default="/var/tmp/restore-memory")
    p.add_argument("--skip-fuse", action="store_true")
    p.add_argument("--check-every", action="store_true", help="check vda.raw's SHA-256 after every timed copy "
                   "(untimed), not only once per tree")
    p.add_argument("--skip-restore", action="store_true")
    p.add_argument("--tool", choices=sorted(TOOLS), default="dd", help="what copies vda.raw (default dd bs=1M "
                   "to /dev/null; cp and qemu-img convert write a file in --work)")
    a = p.parse_args(argv)
    os.makedirs(a.work, exist_ok=True)
    want = sha256_file(a.image)
    pys = a.python or [sys.executable] * len(a.tree)
    if len(pys) != len(a.tree):
        p.error("give one --python per --tree, or none")
    res, checked = {}, set()
    for r in range(a.runs):
        for tree, py in zip(a.tree, pys):
            kinds = ("restore",) if a.skip_fuse else ("fuse",) if a.skip_restore else ("restore", "fuse")
            for kind in kinds:
                x = restore(tree, a, want, py) if kind == "restore" else fuse(tree, a, want, checked, py)
                x["load"] = round(os.getloadavg()[0], 2)
                res.setdefault(f"{kind} {tree}", []).append(x)
                print(f"round {r + 1} {kind} {tree}: {x}", flush=True)
    summary = {k: {m: statistics.median(x[m] for x in v) for m in ("wall", "cpu", "peak_mb")}
               for k, v in res.items()}
    for k, v in summary.items():
        print(f"{k}: median {v}")
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    out = os.path.join(HERE, "results", time.strftime("restore-memory-%Y%m%d-%H%M%S.json"))
    with open(out, "w") as f:
        json.dump({"runs": res, "median": summary, "image": a.image, "load": load, "tool": a.tool,
                   "check_every": a.check_every, "pythons": dict(zip(a.tree, pys)),
                   "trees": {t: subprocess.run(["git", "-C", t, "rev-parse", "--short", "HEAD"],
                                               capture_output=True, text=True).stdout.strip() for t in a.tree}},
                  f, indent=1)
    print("wrote", out)


if __name__ == "__main__":
    main()
