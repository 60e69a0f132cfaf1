"""Foundation against virtnbdbackup on virtnbdbackup's own ground: two identical running domains, the same nights.

libvirt refuses checkpoints (which virtnbdbackup's incremental backups
need) while a domain has external snapshots (which Foundation's archiver
takes), so each tool gets a domain of its own, made identical: a qcow2 disk
converted from one raw image of benchmarks/workload.py content (random,
text-like and binary-like extents; its zero ranges unallocated), type qemu
(TCG), no guest OS. Each night the same 1 MiB pieces of fresh content are
written into both running guests at the same offsets through QEMU's
monitor (`qemu-io` on the virtio device), and into a reference raw image
beside them, whose SHA-256 every restore is checked against. The two
tools' backups of a night run one after the other, the order alternated
night by night, the page cache dropped before each; so are the restores.

Foundation runs its real nightly path, `foundation --config CFG archive
VM` (snapshot, read the overlay's clusters, store, merge), into an
encrypted compare-by-hash store made by `init` with its defaults;
virtnbdbackup runs `-l full`, then `-l inc` (its defaults: no compression),
and restores with `virtnbdrestore` (a qcow2 image) followed by `qemu-img
convert -O raw` (timed apart), since Foundation's restore writes the raw image.
Run from compare_tools.py (`--nights`, `--skip-virtnbd`).
"""

import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import measure  # noqa: E402
from workload import Workload, sha256_file  # noqa: E402

MIB = 1 << 20
ORDER = ("foundation", "virtnbdbackup")
# Seconds of quiet before the full backups: the domains' images (2 x 1.7 GB) were copied just
# before, and on a VM whose disk is a file of the host the host still writes them back for a
# while after the guest's sync. The first backup then read beside that writeback: the same code's
# full backup 3.2-3.9 s right after the copy, 2.97-3.11 s after 15 s (benchmarks/README.md, wave 12).
# Once, before both tools' full backups: a wait before each put virtnbdbackup's ~45-55 s after the
# domains started, where it took 6.7-7.7 s in five runs of five (4.4-5.3 s otherwise).
SETTLE = 20


def _domain_xml(name, disk):
    return (f"<domain type='qemu'><name>{name}</name><memory unit='MiB'>64</memory><vcpu>1</vcpu>"
            f"<os><type arch='x86_64'>hvm</type></os><devices>"
            f"<disk type='file' device='disk'><driver name='qemu' type='qcow2'/><source file='{disk}'/>"
            f"<target dev='vda' bus='virtio'/><alias name='ua-vda'/></disk>"
            f"<memballoon model='none'/></devices></domain>")


def _write(conn, name, src, offset, length):
    """Write `length` bytes of file `src` at `offset` of the running guest's vda, as the guest would."""
    import libvirt_qemu

    dom = conn.lookupByName(name)
    libvirt_qemu.qemuMonitorCommand(
        dom, f'qemu-io -d /machine/peripheral/ua-vda/virtio-backend "write -s {src} {offset} {length}"',
        libvirt_qemu.VIR_DOMAIN_QEMU_MONITOR_COMMAND_HMP)


class Pair:
    """The two domains, the reference image and both tools' stores."""

    def __init__(self, work, size, data, say):
        self.work, self.size, self.say = work, size, say
        self.names = {t: f"fdncmp-{t[:4]}-{os.getpid()}" for t in ORDER}
        self.ref = os.path.join(work, "reference.raw")
        self.wl = Workload(size, seed=7, fill=data / size)
        self.conn = None

    def setup(self):
        from foundation.vm import connect

        if subprocess.run([os.path.join(ROOT, "scripts", "libvirt.sh")]).returncode != 0:
            raise RuntimeError("libvirtd is not available (scripts/libvirt.sh failed)")
        self.conn = connect("qemu:///system")
        self.wl.create(self.ref)
        base = os.path.join(self.work, "base.qcow2")
        subprocess.run(["qemu-img", "convert", "-O", "qcow2", self.ref, base], check=True)
        self.allocated = sum(e["length"] for e in json.loads(subprocess.run(
            ["qemu-img", "map", "--output=json", base], capture_output=True, check=True).stdout) if e["data"])
        for t, name in self.names.items():
            disk = os.path.join(self.work, f"{name}.qcow2")
            shutil.copyfile(base, disk)
            self.conn.defineXML(_domain_xml(name, disk)).create()
        os.unlink(base)
        self.key = os.path.join(self.work, "foundation.key")
        self.store = os.path.join(self.work, "store")
        self.config = os.path.join(self.work, "foundation.toml")
        measure.run(self.fdn("init", self.store))
        with open(self.config, "w") as f:
            f.write(f'store = "{self.store}"\nkey_file = "{self.key}"\nstate_dir = "{self.work}/state"\n'
                    f'vms = ["{self.names["foundation"]}"]\n')
        self.backup_dir = os.path.join(self.work, "virtnbdbackup")

    def fdn(self, *args):
        if args[0] == "init":
            return [sys.executable, "-m", "foundation", "--key-file", self.key, *args]
        return [sys.executable, "-m", "foundation", "--config", self.config, *args]

    def night(self, n, change):
        """Write night n's change into both guests and the reference -> the reference's SHA-256."""
        rng = random.Random(f"night-{n}")
        src = os.path.join(self.work, "chunk.bin")
        offsets = rng.sample(range(self.size // MIB), change // MIB)
        with open(self.ref, "r+b") as ref:
            for off in offsets:
                data = self.wl._content(rng, MIB)
                with open(src, "wb") as f:
                    f.write(data)
                os.chmod(src, 0o644)
                for name in self.names.values():
                    _write(self.conn, name, src, off * MIB, MIB)
                ref.seek(off * MIB)
                ref.write(data)
        return sha256_file(self.ref)

    def backup(self, tool, n):
        if tool == "foundation":
            cmd = self.fdn("archive")
        else:
            cmd = ["virtnbdbackup", "-d", self.names[tool], "-l", "full" if n == 0 else "inc",
                   "-o", self.backup_dir, "-n"]
        m = measure.op(cmd, env={"PYTHONPATH": ROOT})
        m["load"] = os.getloadavg()[0]
        return m

    def restore(self, tool, n, last):
        """Restore night n to a raw file -> (measures, extra measures of a conversion or None, path)."""
        out = os.path.join(self.work, f"restore-{tool}")
        shutil.rmtree(out, ignore_errors=True)
        os.makedirs(out)
        raw = os.path.join(out, "vda.raw")
        if tool == "foundation":
            listing = subprocess.run(self.fdn("list", "--json", self.names[tool]), capture_output=True, check=True,
                                     env=dict(os.environ, PYTHONPATH=ROOT))
            snaps = json.loads(listing.stdout)
            snap = sorted(snaps, key=lambda s: s["time"])[n]
            m = measure.op(self.fdn("restore", f"{self.names[tool]}@{snap['time']}", raw),
                           env={"PYTHONPATH": ROOT})
            return m, None, raw
        until = [] if n == last else ["-u", f"virtnbdbackup.{n}"]
        m = measure.op(["virtnbdrestore", "-i", self.backup_dir, "-o", out, "-n",
                        "-L", os.path.join(self.work, "virtnbdrestore.log"), *until])
        qcow = [os.path.join(out, f) for f in os.listdir(out) if f.endswith(".qcow2")][0]
        conv = measure.op(["qemu-img", "convert", "-O", "raw", qcow, raw])
        return m, conv, raw

    def close(self):
        if self.conn is None:
            return
        import libvirt

        for name in self.names.values():
            try:
                dom = self.conn.lookupByName(name)
            except libvirt.libvirtError:
                continue
            try:
                dom.destroy()
            except libvirt.libvirtError:
                pass
            dom.undefineFlags(libvirt.VIR_DOMAIN_UNDEFINE_CHECKPOINTS_METADATA)
        self.conn.close()


def settle(seconds=SETTLE):
    """Write back, then wait for the disk under this machine to finish what the setup gave it."""
    os.sync()
    time.sleep(seconds)


def compare(work, nights, size, data, change, say):
    """Full backup, `nights` nights, restores of the first and last night -> result dict."""
    work = os.path.join(work, "domains")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    os.chmod(work, 0o755)
    pair = Pair(work, size, data, say)
    res = {"disk": size, "nights": nights, "night_change": change, "backups": [], "restores": []}
    try:
        pair.setup()
        res["allocated"] = pair.allocated
        say(f"domains: {size >> 20} MiB qcow2, {pair.allocated / 1e6:,.0f} MB allocated")
        shas = []
        for n in range(nights + 1):
            shas.append(sha256_file(pair.ref) if n == 0 else pair.night(n, change))
            order = ORDER if n % 2 == 0 else ORDER[::-1]
            if n == 0:
                settle()  # the full backups after a quiet: the images were copied just before
            for tool in order:
                m = pair.backup(tool, n)
                m.update(tool=tool, night=n)
                res["backups"].append(m)
                say(f"  {tool} {'full' if n == 0 else f'night {n}'}: {m['seconds']:.2f} s "
                    f"({m['cpu_seconds']:.2f} CPU s), {m['peak_rss'] / 1e6:,.0f} MB RSS")
        res["store"] = {tool: dict(zip(("allocated", "apparent"), measure.usage(path)))
                        for tool, path in (("foundation", pair.store), ("virtnbdbackup", pair.backup_dir))}
        for i, n in enumerate([nights, 1] if nights > 1 else [nights]):
            for tool in (ORDER if i % 2 == 0 else ORDER[::-1]):
                m, conv, raw = pair.restore(tool, n, nights)
                m.update(tool=tool, night=n, correct=sha256_file(raw) == shas[n])
                if conv:
                    m["convert"] = conv
                res["restores"].append(m)
                extra = f" + {conv['seconds']:.2f} s to raw" if conv else ""
                say(f"  {tool} restore of night {n}: {m['seconds']:.2f} s{extra}, correct={m['correct']}")
                shutil.rmtree(os.path.dirname(raw), ignore_errors=True)
    finally:
        pair.close()
    res["summary"] = summarize(res)
    shutil.rmtree(work, ignore_errors=True)
    return res


def summarize(res):
    out = {}
    for tool in ORDER:
        b = [x for x in res["backups"] if x["tool"] == tool]
        r = [x for x in res["restores"] if x["tool"] == tool]
        restore = [x["seconds"] + x.get("convert", {}).get("seconds", 0) for x in r]
        restore_cpu = [x["cpu_seconds"] + x.get("convert", {}).get("cpu_seconds", 0) for x in r]
        out[tool] = {
            "full_s": b[0]["seconds"], "full_cpu_s": b[0]["cpu_seconds"],
            "night_s": statistics.median(x["seconds"] for x in b[1:]),
            "night_cpu_s": statistics.median(x["cpu_seconds"] for x in b[1:]),
            "night_range": [min(x["seconds"] for x in b[1:]), max(x["seconds"] for x in b[1:])],
            "restore_s": statistics.median(restore), "restore_cpu_s": statistics.median(restore_cpu),
            "restore_correct": all(x["correct"] for x in r),
            "store": res["store"][tool]["allocated"], "store_apparent": res["store"][tool]["apparent"],
            "peak_rss": max(x["peak_rss"] for x in b + r + [x["convert"] for x in r if "convert" in x]),
        }
    f, v = out["foundation"], out["virtnbdbackup"]
    out["ratios"] = {fig: {"ratio": round(v[key] / f[key], 2), "aim": aim,
                           "cpu_ratio": round(v[cpu] / f[cpu], 2) if cpu else None}
                     for fig, key, cpu, aim in (("full backup", "full_s", "full_cpu_s", 2.0),
                                                ("a night", "night_s", "night_cpu_s", 3.0),
                                                ("restore of a night", "restore_s", "restore_cpu_s", None),
                                                ("store", "store", None, 1.0),
                                                ("peak memory", "peak_rss", None, 1.0))}
    return out


def table(res):
    s = summarize(res)
    rows = []
    for tool in ORDER:
        x = s[tool]
        rows.append([tool, f"{x['full_s']:.2f} ({x['full_cpu_s']:.2f})",
                     f"{x['night_s']:.2f} ({x['night_cpu_s']:.2f}); "
                     f"{x['night_range'][0]:.2f}-{x['night_range'][1]:.2f}",
                     f"{x['restore_s']:.2f} ({x['restore_cpu_s']:.2f})" + ("" if x["restore_correct"] else " WRONG"),
                     f"{x['store'] / 1e9:.2f} ({x['store_apparent'] / 1e9:.2f})", f"{x['peak_rss'] / 1e6:,.0f}"])
    rat = [[fig, f"{v['ratio']:.2f}x", "-" if v["cpu_ratio"] is None else f"{v['cpu_ratio']:.2f}x",
            "-" if v["aim"] is None else f">= {v['aim']:g}x",
            "-" if v["aim"] is None else ("yes" if v["ratio"] >= v["aim"] else "NO")]
           for fig, v in s["ratios"].items()]
    return (f"virtnbdbackup's ground: {res['disk'] >> 20} MiB qcow2 ({res['allocated'] / 1e6:,.0f} MB allocated), "
            f"{res['nights']} nights of {res['night_change'] >> 20} MiB\n"
            + measure.table(["tool", "full s (CPU)", "night s (CPU), median; range",
                             "restore s incl. to raw (CPU), median", "store GB (apparent)", "peak MB"], rows)
            + "\n\nFoundation against virtnbdbackup (above 1: Foundation better)\n"
            + measure.table(["figure", "ratio", "by CPU s", "aim", "reached"], rat))
