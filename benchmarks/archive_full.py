"""The first, full `foundation archive` of a running domain, again and again: each round a fresh
domain (a copy of one qcow2 of benchmarks/workload.py content, peer_domains.py's), a fresh
encrypted store made by `init`, the page cache dropped, then `archive` measured (wall, CPU of the
process and its children, peak RSS by GNU time); rounds alternate between the source trees.

    python3 benchmarks/archive_full.py WORK --tree /work/main --tree . [--rounds 3] [--probe]
    python3 benchmarks/archive_full.py WORK --tree . --timeline [--raw] [--wrap "chrt -f 10"]
    python3 benchmarks/archive_full.py --show benchmarks/results/archive-full-LABEL-TIME.json

With --timeline each run goes through archive_timeline.py (its steps and the write path's waits,
TIMELINE_WAITS) while every thread of the process tree has its CPU and run-queue wait sampled each
50 ms (/proc/PID/task/*/stat and schedstat); --check restores each backup and compares it with the
image (qemu-img compare). With --probe every run also goes under memprobe/ (VmRSS every 5 ms, what held the peak), which
costs CPU: probe rounds and timed rounds are best made apart. Without --check nothing is
restored: the nights and restores are archive_profile.py's. --raw runs day 0's path instead
(`import-image` of a raw copy of the same bytes, no domain): the two on the same data.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import measure  # noqa: E402
import peer_domains  # noqa: E402
from workload import Workload  # noqa: E402

GIB = 1 << 30


class Sampler:
    """utime + stime of every thread of this process's descendants, every 50 ms, in a thread."""

    def __init__(self, every=0.05):
        import threading
        import time
        self.rows, self.every, self.t0 = [], every, time.monotonic()
        self.done = threading.Event()
        self.th = threading.Thread(target=self._run, daemon=True)
        self.th.start()

    def _procs(self):
        kids, me = {}, os.getpid()
        for p in os.listdir("/proc"):
            if p.isdigit():
                try:
                    with open(f"/proc/{p}/stat") as f:
                        st = f.read()
                except OSError:
                    continue
                kids.setdefault(int(st[st.rindex(")") + 2:].split()[1]), []).append(int(p))
        out, todo = [], [me]
        while todo:
            for c in kids.get(todo.pop(), []):
                out.append(c)
                todo.append(c)
        return out

    def _run(self):
        import time
        tick = os.sysconf("SC_CLK_TCK")
        while not self.done.wait(self.every):
            row = {"t": round(time.monotonic() - self.t0, 3), "tasks": {}}
            with open("/proc/stat") as f:    # the whole machine: user, nice, system, idle, iowait (s)
                row["cpu"] = [int(x) / tick for x in f.readline().split()[1:6]]
            for pid in self._procs():
                try:
                    with open(f"/proc/{pid}/comm") as f:
                        comm = f.read().strip()
                    for tid in os.listdir(f"/proc/{pid}/task"):
                        with open(f"/proc/{pid}/task/{tid}/stat") as f:
                            st = f.read()
                        v = st[st.rindex(")") + 2:].split()
                        name = f"{comm}/{st[st.index('(') + 1:st.rindex(')')]}"   # process/thread name
                        with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                            run, wait = f.read().split()[:2]       # ns on a CPU, ns runnable but waiting
                        row["tasks"][f"{name}:{pid}:{tid}"] = [(int(v[11]) + int(v[12])) / tick,
                                                               int(run) / 1e9, int(wait) / 1e9]
                except OSError:
                    continue
            self.rows.append(row)

    def stop(self):
        self.done.set()
        self.th.join()
        return self.rows


def _check(tree, cfg, name, d, base, fmt="qcow2", py=sys.executable):
    """Restore the newest backup of the domain (or image) and compare it with the image archived."""
    env = {"PYTHONPATH": tree}
    out = subprocess.run([py, "-m", "foundation", "--config", cfg, "list", "--json", name], cwd=tree,
                         env=dict(os.environ, **env), capture_output=True, check=True).stdout
    snap = sorted(json.loads(out), key=lambda s: s["time"])[-1]
    raw = os.path.join(d, "restore.raw")
    subprocess.run([py, "-m", "foundation", "--config", cfg, "restore", f"{name}@{snap['time']}", raw],
                   cwd=tree, env=dict(os.environ, **env), check=True, capture_output=True)
    same = subprocess.run(["qemu-img", "compare", "-q", "-f", "raw", "-F", fmt, raw, base]).returncode == 0
    os.unlink(raw)
    return same


def summary(m, window=0.25):
    """Lines that say where a timed run's cores went: each thread's CPU (by name), then per window
    the run's cores busy, its threads' run-queue wait and the machine's idle and iowait."""
    rows = [r for r in m.get("threads", []) if r["tasks"]]
    if not rows:
        return []
    out, last = [], {}
    for r in rows:
        last.update(r["tasks"])
    by = {}
    for k, v in last.items():
        n = k.split(":")[0]
        b = by.setdefault(n, [0, 0.0, 0.0])
        b[0] += 1
        b[1] += v[1]
        b[2] += v[2]
    out.append("threads: " + ", ".join(f"{n} x{c} {run:.2f} s (runq {w:.2f})"
                                       for n, (c, run, w) in sorted(by.items(), key=lambda x: -x[1][1])))
    step = max(1, round(window / max(0.01, rows[1]["t"] - rows[0]["t"]))) if len(rows) > 1 else 1
    for a, b in zip(rows[::step], rows[step::step]):
        dt = b["t"] - a["t"]
        run = sum(v[1] - a["tasks"].get(k, [0, 0, 0])[1] for k, v in b["tasks"].items()) / dt
        wait = sum(v[2] - a["tasks"].get(k, [0, 0, 0])[2] for k, v in b["tasks"].items()) / dt
        cpu = [(y - x) / dt for x, y in zip(a.get("cpu", [0] * 5), b.get("cpu", [0] * 5))]
        out.append(f"{a['t']:6.2f} cores {run:4.2f} runq {wait:4.2f} | machine busy {cpu[0] + cpu[1] + cpu[2]:4.2f} "
                   f"idle {cpu[3]:4.2f} iowait {cpu[4]:4.2f} | {len(b['tasks'])} threads")
    return out


def span_summary(spans):
    """From the write path's timed calls (archive_timeline.py's TIMELINE_SPANS: thread, call, start,
    end): each call's count, sum and median/p90 ms, and what the other threads were in while the fill
    thread (the compression, the chain when the cores are free) sat between two fills."""
    by = {}
    for th, what, a, b in spans:
        by.setdefault(f"{what} [{th}]", []).append((a, b))
    calls = {}
    for k, iv in by.items():
        d = sorted(b - a for a, b in iv)
        calls[k] = {"n": len(d), "sum_s": round(sum(d), 3), "median_ms": round(d[len(d) // 2] * 1e3, 2),
                    "p90_ms": round(d[int(len(d) * 0.9)] * 1e3, 2)}
    fills = sorted(by.get("fill [store-fill_0]", []))
    gaps = [(x[1], y[0]) for x, y in zip(fills, fills[1:])]
    during = {}
    for k, iv in by.items():
        t = sum(max(0.0, min(g1, b) - max(g0, a)) for a, b in iv for g0, g1 in gaps if a < g1 and b > g0)
        if t >= 0.01:
            during[k] = round(t, 3)
    return {"calls": calls, "fill_idle_s": round(sum(b - a for a, b in gaps), 3),
            "during_fill_idle_s": dict(sorted(during.items(), key=lambda x: -x[1]))}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("work", nargs="?")
    p.add_argument("--tree", action="append")
    p.add_argument("--python", action="append", help="the interpreter that runs each tree (in --tree's order; "
                   "default: this one)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--size", type=int, default=2 * GIB)
    p.add_argument("--data", type=int, default=3 * GIB // 2)
    p.add_argument("--probe", action="store_true", help="run under memprobe/ (probes in WORK/probes)")
    p.add_argument("--label", default="full")
    p.add_argument("--check", action="store_true", help="restore each backup and compare it with the image")
    p.add_argument("--timeline", action="store_true",
                   help="run through archive_timeline.py and sample every thread's CPU each 50 ms")
    p.add_argument("--raw", action="store_true",
                   help="no domain: `import-image` of the same bytes as a raw file (WORK/base.raw, sparse), "
                        "day 0's write path on the full backup's data")
    p.add_argument("--warm", action="store_true", help="the image read once before each run, cache not dropped")
    p.add_argument("--settle", type=float, default=peer_domains.SETTLE,
                   help="seconds of quiet after the domain's copy, before the archive (peer_domains.SETTLE; 0: none)")
    p.add_argument("--perf", action="store_true", help="each run under `perf record` (WORK/perf-TREE-ROUND.data)")
    p.add_argument("--wrap", help="a command put before each run's (split at spaces; {out} becomes "
                                  "WORK/wrap-TREE-ROUND), e.g. 'py-spy record -r 250 -t -f raw -o {out}.txt --'")
    p.add_argument("--show", metavar="RESULT", help="print a saved --timeline result's summary")
    a = p.parse_args()
    if a.show:
        with open(a.show) as f:
            res = json.load(f)
        for m in res["runs"]:
            print(f"{m['tree']} round {m['round']}: {m['seconds']} s, {m['cpu_seconds']} CPU s, load {m['load']}")
            print("\n".join(summary(m)))
            sp = m.get("spans")
            if sp:
                print(f"fill thread idle between fills {sp['fill_idle_s']} s; meanwhile: " + ", ".join(
                    f"{k} {v}" for k, v in list(sp["during_fill_idle_s"].items())[:8]))
        return
    if not a.work or not a.tree:
        p.error("WORK and --tree are needed")
    trees = [os.path.abspath(t) for t in a.tree]
    if a.python and len(a.python) != len(trees):
        p.error("give one --python per --tree, or none")
    pys = dict(zip(trees, a.python or [sys.executable] * len(trees)))
    work = os.path.abspath(a.work)
    os.makedirs(work, exist_ok=True)
    if subprocess.run([os.path.join(peer_domains.ROOT, "scripts", "libvirt.sh")]).returncode != 0:
        raise SystemExit("libvirtd is not available")
    from foundation.vm import connect
    import libvirt

    conn = connect("qemu:///system")
    base = os.path.join(work, "base.qcow2")
    if not os.path.exists(base):
        ref = os.path.join(work, "reference.raw")
        Workload(a.size, seed=7, fill=a.data / a.size).create(ref)
        subprocess.run(["qemu-img", "convert", "-O", "qcow2", ref, base], check=True)
        os.unlink(ref)
    image, fmt = base, "qcow2"
    if a.raw:
        image, fmt = os.path.join(work, "base.raw"), "raw"
        if not os.path.exists(image):  # qemu-img writes no zeros: as sparse as the qcow2
            subprocess.run(["qemu-img", "convert", "-O", "raw", base, image], check=True)
    res = {"label": a.label, "size": a.size, "data": a.data, "trees": trees, "pythons": pys, "raw": a.raw,
           "warm": a.warm, "runs": []}
    name = f"fdnfull-{os.getpid()}"
    try:
        for r in range(a.rounds):
            for tree in trees if r % 2 == 0 else trees[::-1]:
                d = os.path.join(work, "round")
                shutil.rmtree(d, ignore_errors=True)
                os.makedirs(d)
                if not a.raw:
                    disk = os.path.join(d, "vda.qcow2")
                    shutil.copyfile(base, disk)
                    conn.defineXML(peer_domains._domain_xml(name, disk)).create()
                key, store, cfg = (os.path.join(d, x) for x in ("key", "store", "foundation.toml"))
                env = {"PYTHONPATH": tree}
                measure.run([pys[tree], "-m", "foundation", "--key-file", key, "init", store], cwd=tree, env=env)
                with open(cfg, "w") as f:
                    f.write(f'store = "{store}"\nkey_file = "{key}"\nstate_dir = "{d}/state"\nvms = ["{name}"]\n')
                if a.probe:
                    probe = os.path.join(work, "probes", f"{os.path.basename(tree)}-{r}.json")
                    os.makedirs(os.path.dirname(probe), exist_ok=True)
                    env = {"PYTHONPATH": f"{tree}:{os.path.join(HERE, 'memprobe')}", "MEMPROBE": probe}
                cmd = [pys[tree], "-m", "foundation", "--config", cfg, "archive"]
                if a.raw:
                    cmd[-1:] = ["import-image", name, image, "--format", "raw"]
                if a.warm:
                    with open(image if a.raw else disk, "rb") as f:
                        while f.read(8 << 20):
                            pass
                sampler = None
                if a.timeline:
                    cmd[1:3] = [os.path.join(HERE, "archive_timeline.py")]
                    env = dict(env, TIMELINE_ERR=os.path.join(d, "timeline.txt"), TIMELINE_WAITS="1",
                               TIMELINE_SPANS=os.path.join(d, "spans.json"))
                    sampler = Sampler()
                if a.perf:
                    cmd = ["perf", "record", "-q", "-F", "999", "-g", "-o",
                           os.path.join(work, f"perf-{os.path.basename(tree)}-{'raw-' if a.raw else ''}{r}.data"), "--", *cmd]
                if a.wrap:
                    out = os.path.join(work, f"wrap-{os.path.basename(tree)}-{'raw-' if a.raw else ''}{r}")
                    cmd = [w.replace("{out}", out) for w in a.wrap.split()] + cmd
                if a.settle:
                    peer_domains.settle(a.settle)  # the image copied just before: its writeback ends first
                m = measure.op(cmd, cwd=tree, env=env, cold=not a.warm)
                m.update(tree=tree, round=r, load=round(os.getloadavg()[0], 2), probe=a.probe)
                if sampler is not None:   # kept every 250 ms (what summary() shows), rounded: ~100 kB a run
                    m["threads"] = [dict(r, tasks={k: [round(x, 3) for x in v] for k, v in r["tasks"].items()})
                                    for r in sampler.stop()[::5]]
                    with open(os.path.join(d, "timeline.txt")) as f:
                        m["timeline"] = f.read().splitlines()
                    with open(os.path.join(d, "spans.json")) as f:
                        m["spans"] = span_summary(json.load(f))   # (every call's span: megabytes a run)
                if a.check:
                    m["restored_equal"] = _check(tree, cfg, name, d, image, fmt, pys[tree])
                print(json.dumps({k: v for k, v in m.items() if k not in ("threads", "timeline", "spans")}), flush=True)
                if sampler is not None:
                    print("\n".join(summary(m)), flush=True)
                res["runs"].append(m)
                if not a.raw:
                    dom = conn.lookupByName(name)
                    dom.destroy()
                    dom.undefineFlags(libvirt.VIR_DOMAIN_UNDEFINE_CHECKPOINTS_METADATA)
    finally:
        try:
            dom = conn.lookupByName(name)
            dom.destroy()
            dom.undefine()
        except libvirt.libvirtError:
            pass
        shutil.rmtree(os.path.join(work, "round"), ignore_errors=True)
    for t in trees:
        rs = [x for x in res["runs"] if x["tree"] == t]
        res.setdefault("medians", {})[t] = med = {
            k: statistics.median(x[k] for x in rs) for k in ("seconds", "cpu_seconds", "peak_rss")}
        print(f"{t}: {len(rs)} runs, median {med['seconds']:.2f} s, {med['cpu_seconds']:.2f} CPU s, "
              f"{med['peak_rss'] / 1e6:.1f} MB peak (all: {[round(x['peak_rss'] / 1e6, 1) for x in rs]})")
    print(measure.save(f"archive-full-{a.label}", res))


if __name__ == "__main__":
    main()
