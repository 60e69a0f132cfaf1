"""The first, full `foundation archive` of a running domain, again and again: each round a fresh
domain (a copy of one qcow2 of benchmarks/workload.py content, peer_domains.py's), a fresh
encrypted store made by `init`, the page cache dropped, then `archive` measured (wall, CPU of the
process and its children, peak RSS by GNU time); rounds alternate between the source trees.

    python3 benchmarks/archive_full.py WORK --tree /work/main --tree . [--rounds 3] [--probe]

With --timeline each run goes through archive_timeline.py (its steps and the write path's waits,
TIMELINE_WAITS) while every thread of the process tree has its CPU and run-queue wait sampled each
50 ms (/proc/PID/task/*/stat and schedstat); --check restores each backup and compares it with the
image (qemu-img compare). With --probe every run also goes under memprobe/ (VmRSS every 5 ms, what held the peak), which
costs CPU: probe rounds and timed rounds are best made apart. Without --check nothing is
restored: the nights and restores are archive_profile.py's.
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
            for pid in self._procs():
                try:
                    with open(f"/proc/{pid}/comm") as f:
                        comm = f.read().strip()
                    for tid in os.listdir(f"/proc/{pid}/task"):
                        with open(f"/proc/{pid}/task/{tid}/stat") as f:
                            st = f.read()
                        v = st[st.rindex(")") + 2:].split()
                        with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                            run, wait = f.read().split()[:2]       # ns on a CPU, ns runnable but waiting
                        row["tasks"][f"{comm}:{pid}:{tid}"] = [(int(v[11]) + int(v[12])) / tick,
                                                               int(run) / 1e9, int(wait) / 1e9]
                except OSError:
                    continue
            self.rows.append(row)

    def stop(self):
        self.done.set()
        self.th.join()
        return self.rows


def _check(tree, cfg, name, d, base):
    """Restore the newest backup of the domain and compare it with the image archived."""
    env = {"PYTHONPATH": tree}
    out = subprocess.run([sys.executable, "-m", "foundation", "--config", cfg, "list", "--json", name], cwd=tree,
                         env=dict(os.environ, **env), capture_output=True, check=True).stdout
    snap = sorted(json.loads(out), key=lambda s: s["time"])[-1]
    raw = os.path.join(d, "restore.raw")
    subprocess.run([sys.executable, "-m", "foundation", "--config", cfg, "restore", f"{name}@{snap['time']}", raw],
                   cwd=tree, env=dict(os.environ, **env), check=True, capture_output=True)
    same = subprocess.run(["qemu-img", "compare", "-q", "-f", "raw", "-F", "qcow2", raw, base]).returncode == 0
    os.unlink(raw)
    return same


def main():
    p = argparse.ArgumentParser()
    p.add_argument("work")
    p.add_argument("--tree", action="append", required=True)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--size", type=int, default=2 * GIB)
    p.add_argument("--data", type=int, default=3 * GIB // 2)
    p.add_argument("--probe", action="store_true", help="run under memprobe/ (probes in WORK/probes)")
    p.add_argument("--label", default="full")
    p.add_argument("--check", action="store_true", help="restore each backup and compare it with the image")
    p.add_argument("--timeline", action="store_true",
                   help="run through archive_timeline.py and sample every thread's CPU each 50 ms")
    a = p.parse_args()
    trees = [os.path.abspath(t) for t in a.tree]
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
    res = {"label": a.label, "size": a.size, "data": a.data, "trees": trees, "runs": []}
    name = f"fdnfull-{os.getpid()}"
    try:
        for r in range(a.rounds):
            for tree in trees if r % 2 == 0 else trees[::-1]:
                d = os.path.join(work, "round")
                shutil.rmtree(d, ignore_errors=True)
                os.makedirs(d)
                disk = os.path.join(d, "vda.qcow2")
                shutil.copyfile(base, disk)
                conn.defineXML(peer_domains._domain_xml(name, disk)).create()
                key, store, cfg = (os.path.join(d, x) for x in ("key", "store", "foundation.toml"))
                env = {"PYTHONPATH": tree}
                measure.run([sys.executable, "-m", "foundation", "--key-file", key, "init", store], cwd=tree, env=env)
                with open(cfg, "w") as f:
                    f.write(f'store = "{store}"\nkey_file = "{key}"\nstate_dir = "{d}/state"\nvms = ["{name}"]\n')
                if a.probe:
                    probe = os.path.join(work, "probes", f"{os.path.basename(tree)}-{r}.json")
                    os.makedirs(os.path.dirname(probe), exist_ok=True)
                    env = {"PYTHONPATH": f"{tree}:{os.path.join(HERE, 'memprobe')}", "MEMPROBE": probe}
                cmd = [sys.executable, "-m", "foundation", "--config", cfg, "archive"]
                sampler = None
                if a.timeline:
                    cmd[1:3] = [os.path.join(HERE, "archive_timeline.py")]
                    sampler = Sampler()
                    env = dict(env, TIMELINE_ERR=os.path.join(d, "timeline.txt"), TIMELINE_WAITS="1")
                m = measure.op(cmd, cwd=tree, env=env)
                m.update(tree=tree, round=r, load=round(os.getloadavg()[0], 2), probe=a.probe)
                if sampler is not None:
                    m["threads"] = sampler.stop()
                    with open(os.path.join(d, "timeline.txt")) as f:
                        m["timeline"] = f.read().splitlines()
                if a.check:
                    m["restored_equal"] = _check(tree, cfg, name, d, base)
                print(json.dumps(m), flush=True)
                res["runs"].append(m)
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
