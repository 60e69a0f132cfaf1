#!/usr/bin/env python3
"""A real Debian 12 guest (the lab of tests/lab/, under TCG): pause and freeze per snapshot, past-day boot, nights.

The guest runs its workload (SQLite transactions with fsync, files) all
along. Measured:

- per snapshot, quiesced (`auto`, the agent answers) and crash-consistent
  (`never`), alternating for --snapshots nights: the libvirt snapshot call
  (`pause`: the guest's I/O stops within it) and, quiesced, the time from
  the freeze request to the thaw's answer (`freeze`: writes to the guest's
  file systems wait within it);
- a night's archive time against the size of its change: the guest writes
  --changes MiB of random data into a file on its XFS disk (fsync), then
  the night is archived (quiesced);
- booting a past day (`foundation boot --start` on the mounted tree) to the
  guest agent's first answer, BIOS (direct kernel boot) and UEFI (OVMF,
  systemd-boot from the archived ESP, the archived NVRAM).

Results go to stdout and benchmarks/results/guest-<time>.json.

    sudo python benchmarks/bench_guest.py [--snapshots 6] [--changes 0 4 16 64]
"""

import argparse
import datetime
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

from foundation.store import Store  # noqa: E402
from foundation.vm import Archiver, StoreSink, connect  # noqa: E402
from lab import build, guest  # noqa: E402

PREFIX = "fdnbench-"
BOOT = 900


def foundation(store, key, *args):
    p = subprocess.run([sys.executable, "-m", "foundation", "--store", store, "--key-file", key, *args],
                       capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=ROOT), timeout=1800)
    if p.returncode != 0:
        raise SystemExit(f"foundation {args[0]} failed: {p.stdout}{p.stderr}")
    return p.stdout


def archive(conn, store, state, name, quiesce):
    with Store.open(store, key_file=store + ".key", writable=True) as s:
        r = Archiver(conn, StoreSink(s), state, quiesce=quiesce).archive(name)
    if r.status != "ok":
        raise SystemExit(f"archive of {name} failed: {r.error}")
    return r


def boot_past_day(store, mnt, clones, conn, name):
    """Seconds from `boot --start` of the newest snapshot of `name` to its clone's first agent answer."""
    t0 = time.monotonic()
    out = foundation(store, store + ".key", "boot", name, "latest", "--start", "--mountpoint", mnt,
                     "--clones-dir", clones, "--name", f"{name}@bench")
    dom = conn.lookupByName(re.search(r"defined (\S+):", out).group(1))
    try:
        guest.wait_agent(dom, BOOT)
        return time.monotonic() - t0
    finally:
        guest.shutdown(dom, timeout=0)
        dom.undefineFlags(4)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--snapshots", type=int, default=6, help="nights of the pause/freeze measure (half quiesced)")
    ap.add_argument("--changes", type=int, nargs="+", default=[0, 4, 16, 64], help="MiB written before a night")
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results",
                                                  f"guest-{datetime.datetime.now():%Y%m%d-%H%M%S}.json"))
    args = ap.parse_args()
    img = build.image(log=lambda m: print(m, file=sys.stderr))
    conn = connect("qemu:///system")
    work = tempfile.mkdtemp(prefix=PREFIX, dir="/var/tmp")
    os.chmod(work, 0o755)
    store, state, mnt = os.path.join(work, "store"), os.path.join(work, "state"), os.path.join(work, "tree")
    clones = os.path.join(work, "clones")
    os.makedirs(store)
    os.makedirs(clones)
    Store.create(store, encrypt=True, key_file=store + ".key", max_log_size=16 << 30)
    names = {fw: f"{PREFIX}{os.getpid()}-{fw}" for fw in ("bios", "uefi")}
    doms = {}
    res = {"args": vars(args), "cpus": os.cpu_count(), "load_before": os.getloadavg(), "image": img["key"]}
    mount = None
    try:
        t0 = time.monotonic()
        for fw, name in names.items():
            doms[fw] = guest.define(conn, name, img, os.path.join(work, fw), fw)
            doms[fw].create()
        for dom in doms.values():
            guest.wait_workload(dom, BOOT)
        res["boot_both_s"] = round(time.monotonic() - t0, 1)
        r = archive(conn, store, state, names["uefi"], "auto")
        res["first_night_uefi"] = {"seconds": round(r.seconds, 2), "read_mb": round(r.changed / 1e6, 1)}
        guest.shutdown(doms["uefi"])
        r = archive(conn, store, state, names["bios"], "auto")
        res["first_night_bios"] = {"seconds": round(r.seconds, 2), "read_mb": round(r.changed / 1e6, 1)}
        print(f"first nights: {res['first_night_uefi']} {res['first_night_bios']}", flush=True)

        snaps = []
        for i in range(args.snapshots):
            mode = ("auto", "never")[i % 2]
            r = archive(conn, store, state, names["bios"], mode)
            snaps.append({"quiesce": mode, "consistency": r.consistency, "pause_ms": round(r.snapshot_pause * 1e3, 1),
                          "freeze_ms": None if r.freeze_seconds is None else round(r.freeze_seconds * 1e3, 1),
                          "archive_s": round(r.seconds, 2), "read_mb": round(r.changed / 1e6, 2)})
            print(snaps[-1], flush=True)
        res["snapshots"] = snaps
        for kind in ("quiesced", "crash-consistent"):
            rows = [s for s in snaps if s["consistency"] == kind]
            res[f"median_pause_ms_{kind}"] = statistics.median(s["pause_ms"] for s in rows)
            if kind == "quiesced":
                res["median_freeze_ms"] = statistics.median(s["freeze_ms"] for s in rows)

        nights = []
        for mib in args.changes:
            if mib:
                guest.run(doms["bios"], "/bin/dd", "if=/dev/urandom", "of=/data/bench", "bs=1M", f"count={mib}",
                          "conv=fsync", "status=none", timeout=600)
            r = archive(conn, store, state, names["bios"], "auto")
            nights.append({"written_mib": mib, "read_mb": round(r.changed / 1e6, 2), "archive_s": round(r.seconds, 2),
                           "pause_ms": round(r.snapshot_pause * 1e3, 1),
                           "freeze_ms": round((r.freeze_seconds or 0) * 1e3, 1),
                           "commit_ms": round((r.commit_seconds or 0) * 1e3, 1)})
            print(nights[-1], flush=True)
        res["nights"] = nights

        guest.shutdown(doms["bios"])
        os.makedirs(mnt)
        mount = subprocess.Popen([sys.executable, "-m", "foundation", "--store", store, "--key-file", store + ".key",
                                  "mount", mnt, "--utc"], env=dict(os.environ, PYTHONPATH=ROOT))
        deadline = time.monotonic() + 120
        while not os.path.exists(os.path.join(mnt, ".foundation")):
            if time.monotonic() > deadline:
                raise SystemExit("the snapshot tree did not come up")
            time.sleep(0.2)
        res["past_day_boot_to_agent_s"] = {fw: round(boot_past_day(store, mnt, clones, conn, names[fw]), 1)
                                           for fw in ("bios", "uefi")}
        print(f"past day boot to the agent: {res['past_day_boot_to_agent_s']}", flush=True)
    finally:
        if mount:
            mount.terminate()
            mount.wait(30)
        for d in conn.listAllDomains(0):
            if d.name().startswith(tuple(names.values())):
                guest.shutdown(d, timeout=0)
                d.undefineFlags(4)
        shutil.rmtree(work, ignore_errors=True)
    res["load_after"] = os.getloadavg()
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps({k: v for k, v in res.items() if k not in ("snapshots", "nights")}, indent=1))
    print(f"written {args.out}")


if __name__ == "__main__":
    main()
