"""Bad input and faults of the environment: each gets a clear message, the other VMs are archived."""

import os
import subprocess
import time

import pytest

from foundation.vm import journal
from test_vm_support import MiB, DiskSpec, DirArchive, dir_archive, libvirt_conn, make_vm, vm_dir  # noqa: F401

pytestmark = pytest.mark.libvirt

NBD_DISK = ("<disk type='network' device='disk'><driver name='qemu' type='raw'/>"
            "<source protocol='nbd' name='x'><host name='127.0.0.1' port='10809'/></source>"
            "<target dev='vdc' bus='virtio'/></disk>")


def test_unknown_vm(dir_archive):
    r = dir_archive.run("fdntest-no-such-vm")
    assert r.status == "failed"
    assert "no VM named fdntest-no-such-vm" in r.error


def test_unsupported_disk_is_skipped_others_archived(make_vm, dir_archive):
    bad = make_vm([DiskSpec("vda")], start=False, extra_xml=NBD_DISK)
    good = make_vm([DiskSpec("vda")])
    good.write("vda", 0x42, 0, 64 << 10)
    xml = bad.dom.XMLDesc(0)
    rb, rg = dir_archive.run(bad.name, good.name)
    assert rb.status == "skipped"
    assert "vdc" in rb.error and "'network' disk" in rb.error and "skipped" in rb.error
    assert bad.dom.XMLDesc(0) == xml and bad.overlays() == []
    assert rg.status == "ok"
    dir_archive.check(good.name, [good.state()])


def test_cdrom_is_left_out(make_vm, dir_archive):
    cd = ("<disk type='file' device='cdrom'><driver name='qemu' type='raw'/>"
          "<target dev='hdc' bus='ide'/><readonly/></disk>")
    vm = make_vm([DiskSpec("vda")], extra_xml=cd)
    vm.write("vda", 0x42, 0, 64 << 10)
    r = dir_archive.run(vm.name)
    assert r.status == "ok", r.error
    (snap,) = dir_archive.snapshots(vm.name)
    assert list(snap["disks"]) == ["vda"]
    assert snap["meta"]["not_archived"] == [{"target": "hdc", "device": "cdrom", "why": "cdrom"}]


def test_two_runs_never_touch_one_vm(make_vm, dir_archive):
    vm = make_vm([DiskSpec("vda")])
    with journal.Lock(dir_archive.state, vm.dom.UUIDString(), vm.name):
        r = dir_archive.run(vm.name)
    assert r.status == "skipped" and "being archived by another Foundation process" in r.error
    assert vm.overlays() == []
    assert dir_archive.run(vm.name).status == "ok"


@pytest.fixture
def small_mount(tmp_path):
    """A real file system that fills up: a 48 MiB tmpfs (root only)."""
    d = tmp_path / "full"
    d.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(d)]).returncode != 0:
        pytest.skip("cannot mount a tmpfs (needs root)")
    yield d
    subprocess.run(["umount", "-l", str(d)])


def test_store_full_then_finished(make_vm, libvirt_conn, tmp_path, small_mount):
    from foundation.vm import Archiver, DirSink

    arch = DirArchive(libvirt_conn, tmp_path)
    arch.dir = str(small_mount)
    arch.sink = DirSink(arch.dir)
    arch.archiver = Archiver(libvirt_conn, arch.sink, arch.state)
    vm = make_vm([DiskSpec("vda", "qcow2", 32 * MiB)])
    vm.write("vda", 0x10, 0, 1 * MiB)
    assert arch.run(vm.name).status == "ok"          # 32 MiB of 48
    states = [vm.state()]
    vm.write("vda", 0x11, 2 * MiB, 1 * MiB)
    r = arch.run(vm.name)                             # the next 32 MiB do not fit
    assert r.status == "failed" and r.store_failed
    assert "No space left" in r.error and "next run finishes it" in r.error
    states.append(vm.state())
    vm.write("vda", 0x12, 4 * MiB, 64 << 10)          # the guest carries on, on the newest overlay
    # the day's merge started once its blocks were mapped and ends in QEMU: the guest runs on
    # base <- overlay(k+1), overlay(k) stays on disk until its snapshot is archived
    dom = libvirt_conn.lookupByName(vm.name)
    while dom.blockJobInfo("vda", 0):
        time.sleep(0.01)
    assert len(vm.chain("vda")) == 2 and len(vm.overlays()) == 2
    subprocess.run(["mount", "-o", "remount,size=256m", str(small_mount)], check=True)
    r = arch.run(vm.name)
    assert r.status == "ok" and r.repaired, r
    states.append(vm.state())
    arch.check(vm.name, states)
    vm.assert_healthy()
    assert os.path.exists(arch.state)


def test_libvirt_error_then_repaired(make_vm, dir_archive):
    """A real libvirt failure mid-run (the base cannot be opened for writing: chattr +i)."""
    vm = make_vm([DiskSpec("vda", "raw"), DiskSpec("vdb", "qcow2")])
    vm.write("vda", 0x01, 0, 64 << 10)
    assert dir_archive.run(vm.name).status == "ok"
    states = [vm.state()]
    vm.write("vda", 0x02, 1 * MiB, 64 << 10)
    base = os.path.join(vm.dir, "vda.raw")
    if subprocess.run(["chattr", "+i", base]).returncode != 0:
        pytest.skip("chattr +i is not supported here")
    try:
        r = dir_archive.run(vm.name)
    finally:
        subprocess.run(["chattr", "-i", base], check=True)
    assert r.status == "failed" and "libvirt refused to block-commit" in r.error, r
    taken = len(dir_archive.snapshots(vm.name)) == 2
    if taken:
        states.append(vm.state())
    vm.write("vdb", 0x03, 2 * MiB, 64 << 10)
    assert vm.current("vda") == bytes(vm.model["vda"]) and vm.current("vdb") == bytes(vm.model["vdb"])
    r = dir_archive.run(vm.name)
    assert r.status == "ok", r.error
    assert r.repaired or not taken
    states.append(vm.state())
    dir_archive.check(vm.name, states)
    vm.assert_healthy()
