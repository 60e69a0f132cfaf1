"""A real Debian 12 guest, BIOS and UEFI, archived night after night while it writes; its past days checked.

The guests come from the lab (tests/lab/: a cached Debian image, a workload
writing files with known checksums and SQLite transactions, logging each
once durable). One scenario runs once for the module, booting each guest
once, because a TCG boot costs a minute on a busy machine:

    night 1   bios alone (whole disk, quiesced), then uefi alone: same base
    night 2   stale data in bios's swap partition; both, --quiesce always
    night 3   bios: the archiver killed while the guest is frozen; the next
              run thaws it first, then archives (quiesced)
    night 5   bios, its freeze hook refusing: --quiesce always fails and
              changes nothing, auto falls back to crash-consistent
    night 6   bios, --quiesce never: crash-consistent

Before each run the test reads the guest's committed.log through the agent:
everything in it was durable before the snapshot, so the archived day must
hold it. Afterwards the tree is mounted and each test checks one promise on
the archived days: fsck, SQLite, files and checksums, swap, shared blocks,
and booting a past day (one clone of each guest, with the source still
running).
"""

import hashlib
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import time

import pytest

from lab import build, guest
from lab.workload import content, parse_log
from test_vm_support import PREFIX, ROOT, libvirt_conn  # noqa: F401

pytestmark = [pytest.mark.libvirt, pytest.mark.fuse, pytest.mark.slow]

BOOT = 900                  # seconds allowed for a TCG boot to the workload on a loaded machine
DAY = 5                     # seconds of the workload's writes before each night
MiB = 1 << 20


class Lab:
    """The scenario's state: guests, store, the nights archived and the mounted tree."""

    def __init__(self, conn, image, tmp):
        self.conn, self.image = conn, image
        self.tmp = tmp
        self.dir = f"/var/tmp/{PREFIX}{os.getpid()}-lab"          # reachable by libvirt's QEMU
        self.store = str(tmp / "store")
        self.key = str(tmp / "store.key")
        self.state = str(tmp / "state")
        self.mnt = f"/tmp/{PREFIX}{os.getpid()}-lab-tree"
        self.clones = os.path.join(self.dir, "clones")
        self.names = {fw: f"{PREFIX}{os.getpid()}-lab-{fw}" for fw in ("bios", "uefi")}
        self.doms = {}
        self.nights = []            # {"vm", "before", "run": stdout, "snap": catalog entry}
        self.times = {}

    def foundation(self, *args, env=None, timeout=1200):
        e = dict(os.environ, PYTHONPATH=ROOT, **(env or {}))
        return subprocess.run([sys.executable, "-m", "foundation", "--store", self.store, "--key-file", self.key,
                               *args], capture_output=True, text=True, env=e, timeout=timeout)

    def archive(self, *args, env=None):
        return self.foundation("archive", "--state-dir", self.state, *args, env=env)

    def night(self, fws, *options, before=None):
        """Archive the guests `fws` (firmware names); -> the run's CompletedProcess."""
        time.sleep(DAY)
        logs = {fw: before or guest.read_file(self.doms[fw], "/var/lib/lab/committed.log") for fw in fws}
        t0 = time.monotonic()
        p = self.archive(*options, *[self.names[fw] for fw in fws])
        assert p.returncode == 0, p.stdout + p.stderr
        self.times.setdefault("archive runs", []).append(round(time.monotonic() - t0, 1))
        for fw in fws:
            self.nights.append({"vm": fw, "before": logs[fw], "run": p.stdout + p.stderr, "options": options})
        return p

    def snap_dir(self, night):
        s = night["snap"]
        return os.path.join(self.mnt, s["time"][:10].replace("-", "/"), s["time"][11:19].replace(":", ""),
                            s["name"])


@pytest.fixture(scope="module")
def lab_image():
    if os.geteuid() != 0 or not os.path.exists("/dev/fuse"):
        pytest.skip("needs root and /dev/fuse")
    pytest.importorskip("pyfuse3")
    t0 = time.monotonic()
    try:
        img = build.image()
    except build.BuildFailed as e:
        if "missing tools" in str(e):
            pytest.skip(str(e))
        raise
    img["build_seconds"] = round(time.monotonic() - t0, 1)
    return img


@pytest.fixture(scope="module")
def lab(libvirt_conn, lab_image, tmp_path_factory):  # noqa: F811
    import snapshotfs_support as T
    from foundation.store import Store

    lab = Lab(libvirt_conn, lab_image, tmp_path_factory.mktemp("lab"))
    lab.times["image build"] = lab_image["build_seconds"]
    os.makedirs(lab.store)
    Store.create(lab.store, encrypt=True, key_file=lab.key, max_log_size=16 << 30)
    shutil.rmtree(lab.dir, ignore_errors=True)
    os.makedirs(lab.clones)
    os.chmod(lab.dir, 0o755)
    os.chmod(lab.clones, 0o755)
    try:
        t0 = time.monotonic()
        for fw, name in lab.names.items():
            lab.doms[fw] = guest.define(libvirt_conn, name, lab_image, os.path.join(lab.dir, fw), fw)
            lab.doms[fw].create()
        for dom in lab.doms.values():
            guest.wait_agent(dom, BOOT)
            guest.wait_workload(dom, BOOT)
        lab.times["boot both guests to the workload"] = round(time.monotonic() - t0, 1)
        _scenario(lab)
        guest.shutdown(lab.doms["uefi"])             # two TCG guests at most: uefi's clone replaces it
        _load_catalog(lab)

        class Tree:
            dir = str(lab.tmp)

            def mount_args(self):
                return ["--store", lab.store, "--key-file", lab.key, "mount"]

        with T.Mounted(Tree(), lab.mnt):
            yield lab
    finally:
        for d in libvirt_conn.listAllDomains(0):
            if d.name().startswith(tuple(lab.names.values())):
                guest.shutdown(d, timeout=0)
                d.undefineFlags(4)               # VIR_DOMAIN_UNDEFINE_NVRAM
        shutil.rmtree(lab.dir, ignore_errors=True)


def _scenario(lab):
    bios = lab.doms["bios"]
    lab.night(["bios"])
    lab.night(["uefi"])
    guest.run(bios, "/bin/sh", "-c", "swapoff /dev/vda3 && dd if=/dev/urandom of=/dev/vda3 bs=1M seek=1 count=16 "
                                     "conv=fsync status=none && swapon /dev/vda3")
    lab.night(["bios", "uefi"], "--quiesce", "always")
    # night 3: killed while the guest is frozen
    before = guest.read_file(bios, "/var/lib/lab/committed.log")
    p = lab.archive(lab.names["bios"], env={"FOUNDATION_TEST_CRASH_AT": "frozen"})
    assert p.returncode == 137, p.stdout + p.stderr
    lab.left_frozen = guest.agent(bios, "guest-fsfreeze-status")
    lab.night(["bios"], before=before)
    lab.after_thaw = guest.read_file(bios, "/var/lib/lab/committed.log")
    time.sleep(3)
    lab.later = guest.read_file(bios, "/var/lib/lab/committed.log")
    # night 5: the guest's freeze hook refuses: always fails that VM, auto falls back
    guest.run(bios, "/usr/bin/touch", "/run/lab-fail-freeze")
    lab.refused = lab.archive("--quiesce", "always", lab.names["bios"])
    lab.refused_status = guest.agent(bios, "guest-fsfreeze-status")
    lab.night(["bios"])
    guest.run(bios, "/bin/rm", "/run/lab-fail-freeze")
    lab.night(["bios"], "--quiesce", "never")


def _load_catalog(lab):
    p = lab.foundation("list", "--json")
    assert p.returncode == 0, p.stderr
    snaps = json.loads(p.stdout)
    by_vm = {fw: [s for s in snaps if s["name"] == lab.names[fw]] for fw in lab.names}
    assert [len(by_vm["bios"]), len(by_vm["uefi"])] == [5, 2], [s["name"] for s in snaps]
    seen = {"bios": 0, "uefi": 0}
    for n in lab.nights:
        n["snap"] = by_vm[n["vm"]][seen[n["vm"]]]
        seen[n["vm"]] += 1


def quiesced(lab):
    return [n for n in lab.nights if n["snap"]["meta"]["quiesced"]]


# -- the nights ----------------------------------------------------------------------------------


def test_nights_quiesced_unless_told_not(lab):
    meta = [(n["vm"], n["snap"]["meta"]) for n in lab.nights]
    assert [m["quiesced"] for _, m in meta] == [True, True, True, True, True, False, False]
    for vm, m in meta[:5]:
        assert m["not_quiesced"] is None and 0 < m["pause_seconds"] < m["freeze_seconds"] < 30, (vm, m)
    assert [m["quiesce"] for _, m in meta] == ["auto", "auto", "always", "always", "auto", "auto", "never"]
    assert meta[6][1]["not_quiesced"] == "quiesce = never" and meta[6][1]["freeze_seconds"] is None
    for n in lab.nights[:5]:
        assert re.search(r"quiesced: pause \d+\.\d+ s, file systems frozen \d+\.\d+ s", n["run"]), n["run"]
    print("pause/freeze s:", [(m["pause_seconds"], m["freeze_seconds"]) for _, m in meta])


def test_freeze_refused_always_fails_auto_falls_back(lab):
    p = lab.refused
    name = lab.names["bios"]
    assert p.returncode == 1, p.stdout + p.stderr
    assert (f"{name}: failed: VM {name} was not archived: quiesce = always, but the guest agent could not "
            f"freeze the file systems") in p.stdout and "fsfreeze hook" in p.stdout, p.stdout
    assert lab.refused_status == "thawed"
    n = lab.nights[5]
    assert n["snap"]["meta"]["quiesced"] is False and n["snap"]["meta"]["freeze_seconds"] is None
    assert "the guest agent could not freeze the file systems" in n["snap"]["meta"]["not_quiesced"]
    assert "crash-consistent (quiesce = auto)" in n["run"]
    # the refused run left nothing behind: no repair, and the next snapshot follows the one before
    assert "repaired:" not in n["run"] and n["snap"]["meta"]["incremental"] == {"vda": True, "vdb": True}


def test_killed_while_frozen_the_next_run_thaws_first(lab):
    assert lab.left_frozen == "frozen"
    run = lab.nights[4]["run"]
    assert "the guest's file systems were found frozen; thawed" in run
    assert "stopped before its snapshot; rolled back" in run
    assert run.index("found frozen") < run.index("snapshot of 2 disk(s) quiesced")
    assert guest.agent(lab.doms["bios"], "guest-fsfreeze-status") == "thawed"
    # the workload, blocked while frozen, writes again
    assert max(parse_log(lab.later)[0]) > max(parse_log(lab.after_thaw)[0])


def test_second_guest_from_the_same_base_adds_little(lab):
    first, second = lab.nights[0]["snap"], lab.nights[1]["snap"]
    used = sum(os.stat(os.path.join(lab.image["dir"], f)).st_blocks * 512 for f in ("disk.raw", "data.raw"))
    print(f"used {used / 1e6:.0f} MB; the first guest added {first['added_bytes'] / 1e6:.1f} MB, "
          f"the second {second['added_bytes'] / 1e6:.1f} MB ({100 * second['added_bytes'] / used:.1f} %)")
    assert first["added_bytes"] > used / 2
    assert second["added_bytes"] < used / 10


# -- what each archived day holds --------------------------------------------------------------


def _loop(path, offset, size):
    return subprocess.run(["losetup", "-r", "-f", "--show", "-o", str(offset), "--sizelimit", str(size), path],
                          capture_output=True, text=True, check=True).stdout.strip()


def _fsck(cmd, path, offset, size):
    dev = _loop(path, offset, size)
    try:
        return subprocess.run([*cmd, dev], capture_output=True, text=True, timeout=600)
    finally:
        subprocess.run(["losetup", "-d", dev])


def test_quiesced_days_pass_fsck(lab):
    """The root ext4 of every quiesced day is clean as archived: nothing to replay, nothing to fix."""
    root = lab.image["partitions"]["root"]
    for n in quiesced(lab):
        p = _fsck(["e2fsck", "-f", "-n"], f"{lab.snap_dir(n)}/vda.raw", root["offset"], root["size"])
        assert p.returncode == 0, (n["vm"], n["snap"]["time"], p.stdout[-2000:] + p.stderr)


def _data_disk(lab, n, tmp_path):
    """{path: sha256} of the day's XFS data files, read after a mount replayed its log; xfs_repair -n must pass.

    XFS is not in the files view (The Sleuth Kit cannot read it), and a
    frozen XFS (kernel 6.1) still holds committed transactions in its log,
    to be replayed by a mount as after any stop: the day's vdb.raw is
    copied, mounted in a mount namespace of its own (QEMU's keeps host loop
    mounts alive), read, unmounted, then checked.
    """
    copy = str(tmp_path / "data.img")
    subprocess.run(["cp", "--sparse=always", f"{lab.snap_dir(n)}/vdb.raw", copy], check=True)
    out = subprocess.run(
        ["unshare", "-m", "sh", "-c", f"mkdir -p /mnt/lab && mount -o loop,nouuid {copy} /mnt/lab && "
         f"(cd /mnt/lab/lab/files && sha256sum *); s=$?; umount /mnt/lab; exit $s"],
        capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    fsck = subprocess.run(["xfs_repair", "-n", copy], capture_output=True, text=True)
    assert fsck.returncode == 0, (n["vm"], n["snap"]["time"], fsck.stderr[-2000:])
    os.unlink(copy)
    return {f"/data/lab/files/{name}": h for h, name in (line.split() for line in out.stdout.splitlines())}


def _replayed_root(lab, n, tmp_path):
    """The root file system of a crash-consistent day, its journal replayed by e2fsck on a copy."""
    root = lab.image["partitions"]["root"]
    copy = str(tmp_path / "root.img")
    subprocess.run(["dd", f"if={lab.snap_dir(n)}/vda.raw", f"of={copy}", "bs=1M", f"skip={root['offset'] // MiB}",
                    f"count={root['size'] // MiB}", "conv=sparse", "status=none"], check=True)
    fix = subprocess.run(["e2fsck", "-f", "-y", copy], capture_output=True, text=True)
    assert fix.returncode in (0, 1), fix.stdout + fix.stderr           # 1: errors corrected
    check = subprocess.run(["e2fsck", "-f", "-n", copy], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    return copy


def test_crash_consistent_days_replay_their_journals(lab, tmp_path):
    for n in lab.nights:
        if not n["snap"]["meta"]["quiesced"]:
            os.unlink(_replayed_root(lab, n, tmp_path))
            _data_disk(lab, n, tmp_path)


def _debugfs_get(image, path, out):
    p = subprocess.run(["debugfs", "-R", f"dump {path} {out}", image], capture_output=True, text=True)
    return os.path.exists(out) and "File not found" not in p.stderr


def _sqlite_check(db_dir, before, name):
    db = sqlite3.connect(os.path.join(db_dir, "lab.db"))      # rolls a hot journal back, as the guest would
    assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)], name
    rows = {r[0] for r in db.execute("SELECT n FROM tx")}
    committed, _ = parse_log(before)
    assert committed and committed <= rows, (name, sorted(committed - rows)[:10])
    db.close()
    return len(rows)


def test_sqlite_holds_every_committed_transaction(lab, tmp_path):
    for i, n in enumerate(lab.nights):
        out = tmp_path / f"db{i}"
        out.mkdir()
        if n["snap"]["meta"]["quiesced"]:
            src = f"{lab.snap_dir(n)}/vda/p2/var/lib/lab"
            for f in ("lab.db", "lab.db-journal"):
                if os.path.exists(os.path.join(src, f)):
                    shutil.copyfile(os.path.join(src, f), out / f)
        else:
            image = _replayed_root(lab, n, tmp_path)
            assert _debugfs_get(image, "/var/lib/lab/lab.db", str(out / "lab.db"))
            _debugfs_get(image, "/var/lib/lab/lab.db-journal", str(out / "lab.db-journal"))
            os.unlink(image)
        rows = _sqlite_check(str(out), n["before"], f"{n['vm']} night {i}")
        print(f"{n['vm']} {n['snap']['time']}: {rows} transactions")


def test_files_view_has_the_days_files_with_their_checksums(lab, tmp_path):
    for n in quiesced(lab):
        _, files = parse_log(n["before"])
        on_root = {p: h for p, h in files.items() if p.startswith("/var/lib/lab/")}
        on_data = {p: h for p, h in files.items() if p.startswith("/data/")}
        assert on_root and on_data, n["vm"]
        for p, h in on_root.items():
            with open(f"{lab.snap_dir(n)}/vda/p2{p}", "rb") as f:
                data = f.read()
            assert hashlib.sha256(data).hexdigest() == h and data == content(int(os.path.basename(p))), p
        assert on_data.items() <= _data_disk(lab, n, tmp_path).items(), n["vm"]


def test_swap_is_archived_as_zeros(lab):
    n = lab.nights[2]                                      # bios, night 2: 16 MiB of stale pages in swap
    swap = lab.image["partitions"]["swap"]
    assert n["vm"] == "bios"
    (z,) = n["snap"]["meta"]["swap_zeroed"]["vda"]
    assert (z["offset"], z["length"]) == (swap["offset"], swap["size"]), z
    with open(f"{lab.snap_dir(n)}/vda.raw", "rb") as f:
        f.seek(swap["offset"])
        header = f.read(4096)
        body = f.read(32 * MiB)
    assert header[4086:4096] == b"SWAPSPACE2"
    assert body == bytes(len(body))


# -- booting a past day ----------------------------------------------------------------------


def _store_files(lab):
    out = {}
    for d, _, fs in os.walk(lab.store):
        for f in fs:
            st = os.stat(os.path.join(d, f))
            out[os.path.join(d, f)] = (st.st_size, st.st_mtime_ns)
    return out


def _boot_past_day(lab, n, checks):
    before = _store_files(lab)
    when = n["snap"]["time"][:19]
    t0 = time.monotonic()
    p = lab.foundation("boot", lab.names[n["vm"]], when, "--start", "--mountpoint", lab.mnt,
                       "--clones-dir", lab.clones)
    assert p.returncode == 0, p.stdout + p.stderr
    name = re.search(r"defined (\S+):", p.stdout).group(1)
    clone = lab.conn.lookupByName(name)
    try:
        guest.wait_agent(clone, BOOT)
        lab.times[f"boot of a past day to the agent ({n['vm']})"] = round(time.monotonic() - t0, 1)
        guest.wait_workload(clone, BOOT)
        # the clone starts from that day: its log begins with the day's log
        day_log = open(f"{lab.snap_dir(n)}/vda/p2/var/lib/lab/committed.log").read()
        assert guest.read_file(clone, "/var/lib/lab/committed.log").startswith(day_log)
        checks(clone)
        guest.run(clone, "/bin/sh", "-c", "echo clone > /var/lib/lab/clone-marker && sync")
        # the clone's writes reach neither the running VM nor the archive
        rc, _ = guest.run(lab.doms["bios"], "/usr/bin/test", "-e", "/var/lib/lab/clone-marker", check=False)
        assert rc == 1
        assert not os.path.exists(f"{lab.snap_dir(n)}/vda/p2/var/lib/lab/clone-marker")
    finally:
        guest.shutdown(clone)
    assert _store_files(lab) == before
    p = lab.foundation("boot", "--remove", name, "--force")
    assert p.returncode == 0, p.stdout + p.stderr


def _wait_for(dom, path, text, failure):
    deadline = time.monotonic() + BOOT
    while text not in guest.read_file(dom, path):
        assert time.monotonic() < deadline, failure
        time.sleep(2)


def test_boot_past_day_bios_makes_swap_again(lab):
    def checks(clone):
        _wait_for(clone, "/proc/swaps", "/dev/vda3", "the restored guest does not use its swap partition")
        rc, _ = guest.run(clone, "/usr/bin/test", "-d", "/sys/firmware/efi", check=False)
        assert rc == 1                                       # BIOS

    _boot_past_day(lab, lab.nights[2], checks)


def test_boot_past_day_uefi(lab):
    n = lab.nights[3]
    assert n["vm"] == "uefi" and n["snap"]["meta"]["nvram"]

    def checks(clone):
        guest.run(clone, "/usr/bin/test", "-d", "/sys/firmware/efi")      # booted through OVMF
        _wait_for(clone, "/proc/mounts", " /data xfs ", "the restored guest does not mount its XFS disk")

    _boot_past_day(lab, n, checks)
    print("times (s):", json.dumps(lab.times))
