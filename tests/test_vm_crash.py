"""Kill the archiver at every step of a run; the next run repairs, and no guest write is lost.

The archiver is a child process killed for real (os._exit(137) at the point
named by FOUNDATION_TEST_CRASH_AT), while libvirt and QEMU carry on: a
block job it started keeps running, the guest keeps writing. A host crash
is the same kill plus the VM's QEMU going down with it (virsh destroy).
"""

import pytest

from foundation.vm.archiver import CRASH_POINTS
from test_vm_support import MiB, DiskSpec, dir_archive, libvirt_conn, make_vm, vm_dir  # noqa: F401

pytestmark = pytest.mark.libvirt

TWO_DISKS = [DiskSpec("vda", "raw"), DiskSpec("vdb", "qcow2")]
NOT_TAKEN = {"snapshot", "snapshot-overlays"}  # killed before the snapshot: the run is rolled back


def night1(vm, arch):
    vm.write("vda", 0xA1, 0, 256 << 10)
    vm.write("vdb", 0xB1, 3 * MiB, 1 * MiB)
    r = arch.run(vm.name)
    assert r.status == "ok", r.error
    return [vm.state()]


def crash_then_repair(vm, arch, point, states, host_crash=False, first=False):
    if not first:
        vm.write("vda", 0xA2, 64 << 10, 64 << 10)
        vm.write("vdb", 0xB2, 8 * MiB, 128 << 10)
    p = arch.run_child(vm.name, crash_at=point)
    assert p.returncode == 137, p.stdout + p.stderr
    if point not in NOT_TAKEN:
        states.append(vm.state())
    if host_crash:
        vm.destroy()
    # the guest (or the user, offline) keeps writing before the next night
    vm.write("vda", 0xA3, 70 << 10, 4096)
    vm.write("vdb", 0xB3, 0, 64 << 10)
    r = arch.run(vm.name)
    assert r.status == "ok", r.error
    assert r.repaired, "the run did not report its repair"
    states.append(vm.state())
    arch.check(vm.name, states)
    if host_crash:
        vm.start()
    vm.assert_healthy()


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_killed_running(point, make_vm, dir_archive):
    vm = make_vm(TWO_DISKS)
    states = night1(vm, dir_archive)
    crash_then_repair(vm, dir_archive, point, states)


@pytest.mark.parametrize("point", ["snapshot-done", "archive-disk", "archive-done"])
def test_killed_first_run(point, make_vm, dir_archive):
    vm = make_vm(TWO_DISKS)
    vm.write("vda", 0xA0, 0, 64 << 10)
    crash_then_repair(vm, dir_archive, point, [], first=True)


@pytest.mark.parametrize("point", ["snapshot-done", "archive-disk", "commit", "commit-done", "cleanup"])
def test_killed_shut_off(point, make_vm, dir_archive):
    vm = make_vm(TWO_DISKS, start=False)
    states = night1(vm, dir_archive)
    crash_then_repair(vm, dir_archive, point, states)
    assert not vm.running()


@pytest.mark.parametrize("point", ["archive-disk", "commit-started", "cleanup"])
def test_host_crash(point, make_vm, dir_archive):
    """Archiver and VM die together; the VM is repaired shut off, then boots on base <- overlay."""
    vm = make_vm(TWO_DISKS)
    states = night1(vm, dir_archive)
    crash_then_repair(vm, dir_archive, point, states, host_crash=True)


def test_killed_twice(make_vm, dir_archive):
    """A repair that is itself killed is repaired by the run after."""
    vm = make_vm(TWO_DISKS)
    states = night1(vm, dir_archive)
    vm.write("vda", 0xA2, 64 << 10, 64 << 10)
    assert dir_archive.run_child(vm.name, crash_at="archive-disk").returncode == 137
    states.append(vm.state())
    assert dir_archive.run_child(vm.name, crash_at="commit-started").returncode == 137
    vm.write("vdb", 0xB3, 0, 64 << 10)
    r = dir_archive.run(vm.name)
    assert r.status == "ok" and r.repaired, r
    states.append(vm.state())
    dir_archive.check(vm.name, states)
    vm.assert_healthy()


def test_beside_merge_not_during_a_repair(make_vm, dir_archive):
    """A run killed while QEMU merges is repaired first; `beside_merge` (where the CLI closes the store)
    waits for the merge of the VM's own run, after its snapshot is recorded, and runs once."""
    vm = make_vm(TWO_DISKS)
    states = night1(vm, dir_archive)
    vm.write("vda", 0xA2, 64 << 10, 64 << 10)
    assert dir_archive.run_child(vm.name, crash_at="commit-started").returncode == 137
    states.append(vm.state())
    vm.write("vdb", 0xB3, 0, 64 << 10)
    seen = []
    r = dir_archive.archiver.archive(vm.name, beside_merge=lambda: seen.append(len(dir_archive.snapshots(vm.name))))
    assert r.status == "ok" and r.repaired, r
    states.append(vm.state())
    assert seen == [3]          # once, with the repaired night's and this night's snapshots recorded
    dir_archive.check(vm.name, states)
    vm.assert_healthy()
