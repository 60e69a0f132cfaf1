#!/usr/bin/env python3
"""Nightly archive time against the size of the day's change, for large, mostly unchanged disks.

A running VM (domain type qemu, no OS) with one raw disk holding --fill-mib
of random data is archived once (the first, whole-disk run), then night
after night with a growing day's change: --changes MiB of fresh random
data, written by the guest (HMP qemu-io) as 1 MiB writes at random places
on the disk. The same is done for each disk size in --disk-gib, so the
nightly time can be seen to follow the change and not the disk.

For each night it reports: the whole run's wall time, the bytes read from
the frozen overlay, the bytes the store grew by, the time spent in
libvirt's snapshot call (the guest's I/O is frozen only inside it: an upper
bound on the pause), the commit's total time (the guest keeps running), and
the commit job's tail from 100 % to done (the final graph change: a
non-active commit has no pivot, and this tail bounds the only moment it
could hold guest I/O). Results go to stdout and
benchmarks/results/bench_archive.json.

    sudo python benchmarks/bench_archive.py [--disk-gib 2 16] [--fill-mib 512]
                                            [--changes 0 1 4 16 64 256] [--cold]
"""

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from foundation.store import Store  # noqa: E402
from foundation.vm import Archiver, StoreSink, connect  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIB = 1 << 20


def drop_caches():
    subprocess.run(["sync"])
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def make_vm(conn, work, name, gib, fill_mib, rnd):
    disk = os.path.join(work, f"{name}.raw")
    with open(disk, "wb") as f:
        f.truncate(gib << 30)
        for i in range(fill_mib):             # the data that stays the same night after night
            f.seek(rnd.randrange(gib << 10) * MIB)
            f.write(rnd.randbytes(MIB))
    xml = (f"<domain type='qemu'><name>{name}</name><memory unit='MiB'>64</memory><vcpu>1</vcpu>"
           f"<os><type arch='x86_64'>hvm</type></os><devices>"
           f"<disk type='file' device='disk'><driver name='qemu' type='raw'/><source file='{disk}'/>"
           f"<target dev='vda' bus='virtio'/><alias name='ua-vda'/></disk>"
           f"<memballoon model='none'/></devices></domain>")
    dom = conn.defineXML(xml)
    dom.create()
    return dom


def guest_writes(dom, work, gib, mib, rnd):
    """The day's change: `mib` distinct 1 MiB writes of random data at random places."""
    import libvirt_qemu

    src = os.path.join(work, "chunk.bin")
    for _ in range(mib):
        with open(src, "wb") as f:
            f.write(rnd.randbytes(MIB))
        os.chmod(src, 0o644)
        off = rnd.randrange(gib << 10) * MIB
        libvirt_qemu.qemuMonitorCommand(
            dom, f'qemu-io -d /machine/peripheral/ua-vda/virtio-backend "write -s {src} {off} {MIB}"',
            libvirt_qemu.VIR_DOMAIN_QEMU_MONITOR_COMMAND_HMP)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--disk-gib", type=int, nargs="+", default=[2, 16])
    ap.add_argument("--fill-mib", type=int, default=512, help="random data on the disk before night 1")
    ap.add_argument("--changes", type=int, nargs="+", default=[0, 1, 4, 16, 64, 256],
                    help="MiB changed per night, one night each")
    ap.add_argument("--cold", action="store_true", help="drop the page cache before each night")
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "bench_archive.json"))
    a = ap.parse_args()

    if subprocess.run([os.path.join(ROOT, "scripts", "libvirt.sh")]).returncode != 0:
        sys.exit("libvirtd is not available (scripts/libvirt.sh failed)")
    conn = connect("qemu:///system")
    rnd = random.Random(2008)
    work = tempfile.mkdtemp(prefix="fdn-bench-archive-", dir="/var/tmp")
    os.chmod(work, 0o755)
    rows = []
    doms = []
    try:
        for gib in a.disk_gib:
            name = f"fdnbench-{os.getpid()}-{gib}g"
            dom = make_vm(conn, work, name, gib, a.fill_mib, rnd)
            doms.append(dom)
            store_dir = os.path.join(work, f"store-{gib}g")
            os.mkdir(store_dir)
            key = Store.create(store_dir, max_log_size=8 << 30, key_file=os.path.join(work, f"{gib}g.key"))
            with Store.open(store_dir, key_file=key, writable=True) as store:
                arch = Archiver(conn, StoreSink(store), os.path.join(work, "state"))
                for night, mib in enumerate([None] + a.changes):
                    if mib:
                        guest_writes(dom, work, gib, mib, rnd)
                    if a.cold:
                        drop_caches()
                    before = store.counters.get("raw_bytes", 0)
                    t0 = time.monotonic()
                    r = arch.archive(name)
                    wall = time.monotonic() - t0
                    if r.status != "ok":
                        sys.exit(f"{name}: {r.status}: {r.error}")
                    row = {"disk_gib": gib, "night": night, "change_mib": mib if mib is not None else "first run",
                           "read_mb": round(r.changed / 1e6, 1),
                           "store_added_mb": round((store.counters.get("raw_bytes", 0) - before) / 1e6, 1),
                           "archive_s": round(wall, 3),
                           "snapshot_call_ms": round(r.snapshot_pause * 1e3, 1),
                           "commit_ms": round((r.commit_seconds or 0) * 1e3, 1),
                           "commit_tail_ms": round((r.commit_tail or 0) * 1e3, 1)}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    finally:
        for d in doms:
            try:
                d.destroy()
            except Exception:
                pass
            d.undefine()
        shutil.rmtree(work, ignore_errors=True)

    hdr = ("disk GiB", "change MiB", "read MB", "added MB", "archive s", "snapshot ms", "commit ms", "tail ms")
    keys = ("disk_gib", "change_mib", "read_mb", "store_added_mb", "archive_s", "snapshot_call_ms",
            "commit_ms", "commit_tail_ms")
    table = [hdr] + [tuple(str(r[k]) for k in keys) for r in rows]
    w = [max(len(t[i]) for t in table) for i in range(len(hdr))]
    print()
    for t in table:
        print("  ".join(c.rjust(x) for c, x in zip(t, w)))
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump({"args": vars(a), "cpus": os.cpu_count(), "rows": rows}, f, indent=1)
    print(f"\nresults: {a.out}")


if __name__ == "__main__":
    main()
