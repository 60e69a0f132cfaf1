"""The first, full `foundation archive` of a running domain, again and again: each round a fresh
domain (a copy of one qcow2 of benchmarks/workload.py content, peer_domains.py's), a fresh
encrypted store made by `init`, the page cache dropped, then `archive` measured (wall, CPU of the
process and its children, peak RSS by GNU time); rounds alternate between the source trees.

    python3 benchmarks/archive_full.py WORK --tree /work/main --tree . [--rounds 3] [--probe]

With --probe every run also goes under memprobe/ (VmRSS every 5 ms, what held the peak), which
costs CPU: probe rounds and timed rounds are best made apart. Nothing is restored: the nights and
restores are archive_profile.py's.
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


def main():
    p = argparse.ArgumentParser()
    p.add_argument("work")
    p.add_argument("--tree", action="append", required=True)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--size", type=int, default=2 * GIB)
    p.add_argument("--data", type=int, default=3 * GIB // 2)
    p.add_argument("--probe", action="store_true", help="run under memprobe/ (probes in WORK/probes)")
    p.add_argument("--label", default="full")
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
                m = measure.op([sys.executable, "-m", "foundation", "--config", cfg, "archive"], cwd=tree, env=env)
                m.update(tree=tree, round=r, load=round(os.getloadavg()[0], 2), probe=a.probe)
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
