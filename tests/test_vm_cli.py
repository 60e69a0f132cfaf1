"""`foundation archive` and `foundation status` into a real store; every night restored byte for byte."""

import json
import os
import subprocess
import sys

import pytest

from foundation.catalog import Catalog
from foundation.cli import main
from foundation.image import restore_image
from test_vm_support import ROOT, MiB, DiskSpec, libvirt_conn, make_vm, vm_dir  # noqa: F401

pytestmark = pytest.mark.libvirt

TWO_DISKS = [DiskSpec("vda", "raw"), DiskSpec("vdb", "qcow2")]


@pytest.fixture
def store(make_store, tmp_path):
    """An encrypted store and the command-line arguments that reach it."""
    opener = make_store(encrypt=True, max_log_size=256 << 20)
    state = str(tmp_path / "state")
    opener.args = ["--store", opener.path, "--key-file", opener.key_file]
    opener.state = state
    return opener


def archive(store, *vms, env=None):
    """`foundation archive` in a child process (it can be killed); -> CompletedProcess."""
    e = dict(os.environ, PYTHONPATH=ROOT, **(env or {}))
    return subprocess.run([sys.executable, "-m", "foundation", *store.args, "archive",
                           "--state-dir", store.state, *vms],
                          capture_output=True, text=True, env=e, timeout=180)


def restored(store, tmp_path, name):
    """Every snapshot of `name`, oldest first, as {disk: bytes}."""
    out = []
    with store(writable=False) as s:
        for snap in Catalog.load(s).snapshots(name):
            disks = {}
            for t, d in snap.disks.items():
                p = tmp_path / f"restore-{snap.id}-{t}.raw"
                restore_image(s, d.root, str(p))
                disks[t] = p.read_bytes()
                p.unlink()
            out.append((snap, disks))
    return out


def test_nights_restore_byte_for_byte(make_vm, store, tmp_path):
    run = make_vm(TWO_DISKS)
    off = make_vm([DiskSpec("vda", "qcow2")], start=False)
    plan = [
        [(run, "vda", 0xAB, 0, 1 * MiB), (run, "vdb", 0xCD, 7 * MiB, 64 << 10), (off, "vda", 0x0F, 0, 4096)],
        [(run, "vda", 0x11, 512 << 10, 4096), (run, "vdb", 0x22, 20 * MiB, 2 * MiB)],
        [(off, "vda", 0x1F, 1 * MiB, 1 * MiB)],
        [(run, "vdb", 0x00, 20 * MiB, 4096), (run, "vda", 0xAB, 8 * MiB, 1 * MiB)],
    ]
    want = {run.name: [], off.name: []}
    for night in plan:
        for vm, *w in night:
            vm.write(*w)
        p = archive(store, run.name, off.name)
        assert p.returncode == 0, p.stdout + p.stderr
        assert "2 of 2 VM(s) archived" in p.stdout
        for vm in (run, off):
            want[vm.name].append(vm.state())
    for vm in (run, off):
        got = restored(store, tmp_path, vm.name)
        assert len(got) == len(plan)
        for i, ((snap, disks), state) in enumerate(zip(got, want[vm.name])):
            assert disks == state, f"{vm.name} night {i}"
            assert snap.uuid == vm.dom.UUIDString()
            assert snap.meta["quiesced"] is False
            assert snap.meta["vm_state"] == ("running" if vm is run else "shut off")
    run.assert_healthy()
    off.start()
    off.assert_healthy()


def test_domain_xml_and_summary(make_vm, store):
    vm = make_vm([DiskSpec("vda", "raw")])
    vm.write("vda", 0x42, 0, 64 << 10)
    p = archive(store, vm.name)
    assert p.returncode == 0, p.stderr
    header = p.stdout.splitlines()[0].split()
    assert header == ["VM", "disks", "changed", "MB", "time", "s", "consistency", "status", "repaired"]
    row = p.stdout.splitlines()[1].split()
    assert row[0] == vm.name and row[1] == "1" and row[4] == "crash-consistent" and row[5] == "ok"
    from foundation.image import Root, read_blob

    with store(writable=False) as s:
        (snap,) = Catalog.load(s).snapshots(vm.name)
        xml = read_blob(s, Root.from_json(snap.meta["domain_xml"])).decode()
    assert f"<name>{vm.name}</name>" in xml and os.path.join(vm.dir, "vda.raw") in xml and ".fdn-" not in xml


def test_missing_store_touches_no_vm(make_vm, store, tmp_path):
    vm = make_vm([DiskSpec("vda")])
    store.args[1] = str(tmp_path / "not-mounted")
    p = archive(store, vm.name)
    assert p.returncode == 10
    assert "does not exist or is not mounted" in p.stderr
    assert vm.overlays() == [] and not os.path.exists(store.state)


def test_the_store_is_checked_before_libvirt(store, tmp_path):
    """With both the store missing and libvirt unreachable, the store's error is the one reported;
    with the store there, libvirt's (code 41)."""
    bad = ["--libvirt-uri", "qemu+unix:///system?socket=" + str(tmp_path / "no-socket")]
    e = dict(os.environ, PYTHONPATH=ROOT)
    run = lambda args: subprocess.run([sys.executable, "-m", "foundation", *args, "archive", "--state-dir",
                                       store.state, *bad, "vm"], capture_output=True, text=True, env=e, timeout=60)
    missing = ["--store", str(tmp_path / "not-mounted"), "--key-file", store.key_file]
    p = run(missing)
    assert p.returncode == 10 and "does not exist or is not mounted" in p.stderr, p.stderr
    p = run(store.args)
    assert p.returncode == 41 and "Cannot reach libvirt" in p.stderr, p.stderr


def test_empty_mountpoint_touches_no_vm(make_vm, store, tmp_path):
    """The store's directory exists but the disk is not mounted there: nothing is touched."""
    vm = make_vm([DiskSpec("vda")])
    empty = tmp_path / "mnt"
    empty.mkdir()
    store.args[1] = str(empty)
    p = archive(store, vm.name)
    assert p.returncode == 10 and "not mounted" in p.stderr
    assert vm.overlays() == [] and os.listdir(empty) == []


def test_wrong_key_touches_no_vm(make_vm, store, make_store):
    vm = make_vm([DiskSpec("vda")])
    other = make_store(encrypt=True)
    store.args[3] = other.key_file
    p = archive(store, vm.name)
    assert p.returncode == 13 and "not to this store" in p.stderr, p.stderr
    assert vm.overlays() == []


def test_unknown_and_unsupported_vms_others_archived(make_vm, store):
    good = make_vm([DiskSpec("vda")])
    bad = make_vm([DiskSpec("vda")], start=False, extra_xml=(
        "<disk type='block' device='disk'><driver name='qemu' type='raw'/>"
        "<source dev='/dev/null'/><target dev='vdc' bus='virtio'/></disk>"))
    p = archive(store, "fdntest-nosuchvm", bad.name, good.name)
    assert p.returncode == 1
    out = p.stdout
    assert "There is no VM named fdntest-nosuchvm" in out
    assert f"VM {bad.name} is skipped" in out and "vdc" in out and "'block' disk" in out
    assert "1 of 3 VM(s) archived" in out
    assert any(line.startswith(good.name) and " ok " in line for line in out.splitlines())


@pytest.mark.parametrize("point", ["archive-disk", "archive-done", "commit-started"])
def test_killed_cli_repaired_no_duplicate(point, make_vm, store, tmp_path):
    vm = make_vm(TWO_DISKS)
    vm.write("vda", 0x01, 0, 64 << 10)
    assert archive(store, vm.name).returncode == 0
    states = [vm.state()]
    vm.write("vdb", 0x02, 1 * MiB, 64 << 10)
    assert archive(store, vm.name, env={"FOUNDATION_TEST_CRASH_AT": point}).returncode == 137
    states.append(vm.state())
    vm.write("vda", 0x03, 2 * MiB, 64 << 10)
    p = archive(store, vm.name)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "repaired: run of" in p.stdout
    states.append(vm.state())
    got = restored(store, tmp_path, vm.name)
    assert [d for _, d in got] == states
    vm.assert_healthy()


def test_status(make_vm, store, capsys):
    vm = make_vm(TWO_DISKS)
    argv = [*store.args, "status", "--state-dir", store.state, vm.name]
    assert main(argv) == 0
    assert "never archived" in capsys.readouterr().out
    assert archive(store, vm.name).returncode == 0
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert vm.name in out and "ok" in out and "base <- overlay" in out
    assert "next run" in out
    assert archive(store, vm.name, env={"FOUNDATION_TEST_CRASH_AT": "commit"}).returncode == 137
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "interrupted at 'archive'" in out   # the merge is not journaled: the catalog record says it


def test_config_file(make_vm, store, tmp_path):
    vm = make_vm([DiskSpec("vda")])
    conf = tmp_path / "foundation.toml"
    conf.write_text(f'store = "{store.path}"\nkey_file = "{store.key_file}"\n'
                    f'state_dir = "{store.state}"\nvms = ["{vm.name}"]\n')
    vm.write("vda", 0x42, 0, 4096)
    p = subprocess.run([sys.executable, "-m", "foundation", "--config", str(conf), "archive"],
                       capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=ROOT), timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "1 of 1 VM(s) archived" in p.stdout
    conf.write_text(conf.read_text() + "stroe = 1\n")
    p = subprocess.run([sys.executable, "-m", "foundation", "--config", str(conf), "archive"],
                       capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=ROOT), timeout=120)
    assert p.returncode == 31 and "unknown setting 'stroe'" in p.stderr


def test_check_for_the_service(store, tmp_path):
    """The service's ExecStartPre: exit 0 with the store there, a clear message and non-zero without."""
    ok = subprocess.run([sys.executable, "-m", "foundation", *store.args, "archive", "--check"],
                        capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=ROOT))
    assert ok.returncode == 0 and "is present (encrypted, the key fits)" in ok.stdout
    store.args[1] = str(tmp_path / "unplugged")
    bad = subprocess.run([sys.executable, "-m", "foundation", *store.args, "archive", "--check"],
                         capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=ROOT))
    assert bad.returncode == 10 and "does not exist or is not mounted" in bad.stderr


def test_systemd_units_parse():
    import shutil

    if not shutil.which("systemd-analyze"):
        pytest.skip("systemd-analyze is not installed")
    units = [os.path.join(ROOT, "systemd", f"foundation-archive.{x}") for x in ("service", "timer")]
    p = subprocess.run(["systemd-analyze", "verify", *units], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    timer = open(units[1]).read()
    assert "Persistent=true" in timer and "RandomizedDelaySec=" in timer
    service = open(units[0]).read()
    assert "Type=oneshot" in service and "ExecStartPre=/usr/bin/env foundation archive --check" in service


@pytest.fixture
def small_tmpfs(tmp_path):
    d = tmp_path / "usb"
    d.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(d)]).returncode != 0:
        pytest.skip("cannot mount a tmpfs (needs root)")
    yield d
    subprocess.run(["umount", "-l", str(d)])


def test_store_disk_full_stops_the_run_then_finished(make_vm, small_tmpfs, tmp_path):
    """A real store fills up mid-run: that VM is finished next time, the VMs after it are not touched."""
    from foundation.store import Store

    Store.create(str(small_tmpfs), arena_size=1 << 20, max_log_size=64 << 20, encrypt=False)
    st = type("S", (), {})()
    st.args, st.state, st.path = ["--store", str(small_tmpfs)], str(tmp_path / "state"), str(small_tmpfs)
    first = make_vm([DiskSpec("vda", "raw")], start=False)
    data = os.urandom(32 * MiB)                      # incompressible: 32 MiB do not fit in 24
    with open(os.path.join(first.dir, "vda.raw"), "wb") as f:
        f.write(data)
    first.model["vda"][:] = data
    first.start()
    second = make_vm([DiskSpec("vda", "raw")])
    p = archive(st, first.name, second.name)
    assert p.returncode == 22, p.stdout + p.stderr       # StoreFull: closing the store fails too
    assert "The store disk is full" in p.stdout and "next run finishes it" in p.stdout
    assert f"{second.name}: not run: the store failed; this VM was not touched" in p.stdout
    assert second.overlays() == []
    states = [first.state()]
    first.write("vda", 0x01, 0, 64 << 10)            # the guest carries on
    subprocess.run(["mount", "-o", "remount,size=256m", str(small_tmpfs)], check=True)
    p = archive(st, first.name, second.name)
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"{first.name}: repaired: run of" in p.stdout
    states.append(first.state())

    def opener(writable=False):
        return Store.open(st.path, writable=writable)

    got = restored(opener, tmp_path, first.name)
    assert [d for _, d in got] == states
    first.assert_healthy()
    second.assert_healthy()


def test_vms_deduplicated_together(make_vm, store):
    """Two VMs holding the same 4 MiB: the second one's snapshot adds next to nothing to the store."""
    a = make_vm([DiskSpec("vda", "raw")])
    b = make_vm([DiskSpec("vda", "qcow2")])
    data = os.urandom(4 * MiB)
    a.write_bytes("vda", 1 * MiB, data)
    b.write_bytes("vda", 9 * MiB, data)
    assert archive(store, a.name).returncode == 0
    assert archive(store, b.name).returncode == 0
    with store(writable=False) as s:
        cat = Catalog.load(s)
        (sa,), (sb,) = cat.snapshots(a.name), cat.snapshots(b.name)
    assert sa.added_bytes > 4 * MiB
    assert sb.added_bytes < 256 << 10, sb.added_bytes


def test_repair_heals_damaged_records_from_the_vms_current_disk(make_vm, store, tmp_path, capsys):
    """Paper §3.4: no replica, but the blocks are still on the VM's disk: `repair --vm` heals the arena."""
    import random

    from foundation.store import format as F

    vm = make_vm([DiskSpec("vda", "raw", size=8 * MiB)])
    rng = random.Random(7)
    vm.write_bytes("vda", 0, b"".join(rng.choice([b"disk ", b"block\n", rng.randbytes(5)]) for _ in range(400_000)))
    # Records of one block each (the `run` policy edited to 1, format.md §3): what repair re-encodes in
    # place. A record of a run cannot be (its block is stored again: tests/test_replica.py).
    conf_path = os.path.join(store.path, F.CONFIG)
    with open(conf_path) as f:
        conf = json.load(f)
    conf["run"] = 1
    with open(conf_path, "w") as f:
        json.dump(conf, f)
    assert archive(store, vm.name).returncode == 0
    states = [vm.state()]
    arena = os.path.join(store.path, "arenas", F.arena_name(1))
    with open(arena, "rb") as f:
        buf = f.read()
    off, hit = 72, None
    while buf[off:off + 4] == b"FDNr":      # the first data record of arena 1 with a payload
        stored = int.from_bytes(buf[off + 8:off + 12], "little")
        if buf[off + 4] == F.DATA and stored > 16:
            hit = off
            break
        off += 64 + stored
    assert hit is not None
    with open(arena, "r+b") as f:
        f.seek(hit + 64 + 5)
        f.write(b"\x5a\xa5")
    argv = [*store.args, "verify"]
    assert main(argv) == 1 and f"arena 1 offset {hit}" in capsys.readouterr().out
    assert main([*store.args, "repair", "--no-replica"]) == 1       # nothing to heal it from
    assert f"LOST arena 1 offset {hit}" in capsys.readouterr().out
    vm.destroy()                            # repair reads the disk: the guest must not write meanwhile
    assert main([*store.args, "repair", "--no-replica", "--vm", vm.name]) == 0
    out = capsys.readouterr().out
    assert f"HEALED arena 1 offset {hit}: record written again in place" in out, out
    assert main(argv) == 0
    assert [d for _, d in restored(store, tmp_path, vm.name)] == states


def test_archive_adds_the_night_to_the_file_listings(make_vm, store):
    import sqlite3

    vm = make_vm([DiskSpec("vda", "raw")])
    vm.write("vda", 0x42, 0, 64 << 10)
    for _ in range(2):
        p = archive(store, vm.name)
        assert p.returncode == 0, p.stderr
    with store(writable=False) as s:
        ids = [x.id for x in Catalog.load(s).snapshots(vm.name)]
        db = os.path.join(store.state, "files", f"{s.uuid}.sqlite")
    rows = sqlite3.connect(db).execute("SELECT sid, disk, seq, error FROM snaps WHERE vm = ? ORDER BY seq",
                                       (vm.name,)).fetchall()
    assert rows == [(ids[0], "vda", 0, None), (ids[1], "vda", 1, None)]


def test_two_vms_in_one_run_are_both_listed(make_vm, store):
    """Both VMs of one run are added to the file listings, each night's probe ranges kept."""
    import sqlite3

    vms = [make_vm([DiskSpec("vda", "raw")]) for _ in range(2)]
    for i, vm in enumerate(vms):
        vm.write("vda", 0x42 + i, 0, 64 << 10)
    for night in range(2):
        for i, vm in enumerate(vms):
            vm.write("vda", 0x50 + 0x10 * night + i, (1 + night) << 20, 64 << 10)   # past the probe's reads
        p = archive(store, *(vm.name for vm in vms))
        assert p.returncode == 0, p.stderr
    with store(writable=False) as s:
        cat = Catalog.load(s)
        ids = {vm.name: [x.id for x in cat.snapshots(vm.name)] for vm in vms}
        db = os.path.join(store.state, "files", f"{s.uuid}.sqlite")
    con = sqlite3.connect(db)
    for vm in vms:
        rows = con.execute("SELECT sid, seq, error FROM snaps WHERE vm = ? ORDER BY seq", (vm.name,)).fetchall()
        assert rows == [(ids[vm.name][0], 0, None), (ids[vm.name][1], 1, None)]
        # no file system on these disks: both nights keep the ranges the probe read
        assert con.execute("SELECT count(*) FROM looked WHERE sid IN (?, ?)", tuple(ids[vm.name])).fetchone() == (2,)
