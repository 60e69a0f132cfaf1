"""The archiver against a real libvirtd and QEMU: nights of writes, every snapshot byte for byte."""

import json
import os
import subprocess

import pytest

from test_vm_support import MiB, DiskSpec, dir_archive, libvirt_conn, make_vm, vm_dir  # noqa: F401 (fixtures)

pytestmark = pytest.mark.libvirt

TWO_DISKS = [DiskSpec("vda", "raw"), DiskSpec("vdb", "qcow2")]


def nights(vm, arch, plan):
    """Write each night's (target, pattern, offset, length) list, then archive; -> states archived."""
    states = []
    for writes in plan:
        for w in writes:
            vm.write(*w)
        r = arch.run(vm.name)
        assert r.status in ("ok", "unchanged"), r.error
        states.append(vm.state())
    return states


PLAN = [
    [("vda", 0xAB, 0, 64 << 10), ("vdb", 0xCD, 1 * MiB, 64 << 10), ("vdb", 0x01, 31 * MiB, 1 * MiB)],
    [("vda", 0x11, 128 << 10, 4096), ("vdb", 0x22, 5 * MiB, 1 * MiB)],
    [("vda", 0x33, 4 * MiB + 512, 1024), ("vda", 0x00, 0, 4096)],
    [],
]


def test_running_vm_nights_restore_byte_for_byte(make_vm, dir_archive):
    vm = make_vm(TWO_DISKS)
    states = nights(vm, dir_archive, PLAN)
    dir_archive.check(vm.name, states)
    vm.assert_healthy()
    snaps = dir_archive.snapshots(vm.name)
    assert [s["meta"]["incremental"] for s in snaps] == [{"vda": False, "vdb": False}] + [{"vda": True, "vdb": True}] * 3
    # night 2 read only the clusters written that day: one 64 KiB cluster + 1 MiB
    assert snaps[1]["meta"]["changed_bytes"] == {"vda": 64 << 10, "vdb": 1 * MiB}
    assert snaps[3]["meta"]["changed_bytes"] == {"vda": 0, "vdb": 0}
    assert all(s["meta"]["quiesced"] is False and s["meta"]["vm_state"] == "running" for s in snaps)
    assert "<domain" in snaps[0]["meta"]["domain_xml"] and "vda.raw" in snaps[0]["meta"]["domain_xml"]
    assert ".fdn-" not in snaps[0]["meta"]["domain_xml"]


def looks_running(vm):
    """The archiver's one-call answer (the live XML carries the domain's id) agrees with isActive."""
    from foundation.vm.domain import Domain

    live, root = Domain(vm.conn, vm.name).look()
    assert live is vm.running()
    assert root.find("devices/disk") is not None
    return live


def test_shut_off_vm_then_started(make_vm, dir_archive):
    vm = make_vm(TWO_DISKS, start=False)
    assert not looks_running(vm)
    states = nights(vm, dir_archive, PLAN[:2])
    # a night without writes leaves a shut-off VM alone: same config, same files
    xml0 = vm.dom.XMLDesc(0)
    files = vm.overlays()
    r = dir_archive.run(vm.name)
    assert r.status == "unchanged", r
    states.append(vm.state())
    assert vm.dom.XMLDesc(0) == xml0 and vm.overlays() == files
    # started the next day: the same chain continues live
    vm.start()
    assert looks_running(vm)
    states += nights(vm, dir_archive, PLAN[2:3])
    vm.destroy()
    assert not looks_running(vm)
    states += nights(vm, dir_archive, [[("vdb", 0x44, 0, 8192)]])
    dir_archive.check(vm.name, states)
    snaps = dir_archive.snapshots(vm.name)
    assert [s["meta"]["vm_state"] for s in snaps] == ["shut off"] * 3 + ["running", "shut off"]
    vm.start()
    vm.assert_healthy()


def test_several_vms_one_run(make_vm, dir_archive):
    a = make_vm([DiskSpec("vda", "qcow2")])
    b = make_vm([DiskSpec("vda", "raw")], start=False)
    a.write("vda", 0x5A, 0, 1 * MiB)
    b.write("vda", 0x5A, 0, 1 * MiB)
    ra, rb = dir_archive.run(a.name, b.name)
    assert (ra.status, rb.status) == ("ok", "ok")
    dir_archive.check(a.name, [a.state()])
    dir_archive.check(b.name, [b.state()])


def test_base_is_last_archived_state(make_vm, dir_archive):
    """Between runs the base holds exactly the last archived state; the overlay only what came after."""
    vm = make_vm([DiskSpec("vda", "raw")])
    vm.write("vda", 0x77, 0, 1 * MiB)
    dir_archive.run(vm.name)
    archived = vm.state()["vda"]
    vm.write("vda", 0x78, 2 * MiB, 64 << 10)
    base = os.path.join(vm.dir, "vda.raw")
    with open(base, "rb") as f:
        assert f.read() == archived
    from foundation.image import qemuimg

    assert [(s, n) for s, n, _, _ in qemuimg.layer_map(vm.top("vda"), share=True)] == [(2 * MiB, 64 << 10)]


def test_nvram_archived(make_vm, vm_dir, dir_archive):
    """A UEFI VM's NVRAM file goes with its snapshot (shut off here: no OVMF needed to define it)."""
    code, vars_ = os.path.join(vm_dir, "CODE.fd"), os.path.join(vm_dir, "VARS.fd")
    for p, b in ((code, b"\x01"), (vars_, b"\x5a")):
        with open(p, "wb") as f:
            f.write(b * (128 << 10))
    vm = make_vm([DiskSpec("vda")], start=False,
                 os_xml=f"<loader readonly='yes' type='pflash'>{code}</loader><nvram>{vars_}</nvram>")
    assert dir_archive.run(vm.name).status == "ok"
    (snap,) = dir_archive.snapshots(vm.name)
    assert snap["meta"]["nvram"]["path"] == vars_
    assert snap["meta"]["nvram"]["blob"] == "\x5a" * (128 << 10)



def test_beside_merge_runs_once_after_the_catalog(make_vm, dir_archive):
    """`beside_merge` (where the CLI closes the store) runs while the day is merged: once a night, only
    after that night's snapshot is recorded, not at all for a first run (nothing to merge); the
    snapshots stay exact and the chain ends merged."""
    vm = make_vm(TWO_DISKS)
    seen = []

    def beside():
        seen.append(len(dir_archive.snapshots(vm.name)))

    states = []
    for night in (1, 2, 3):
        vm.write("vda", 0x10 + night, night * (64 << 10), 64 << 10)
        vm.write("vdb", 0x20 + night, night * MiB, 64 << 10)
        r = dir_archive.archiver.archive(vm.name, beside_merge=beside)
        assert r.status == "ok", r.error
        states.append(vm.state())
        assert seen == list(range(2, night + 1))     # night n's call saw its own snapshot (n of them)
    dir_archive.check(vm.name, states)
    assert all(len(vm.chain(t)) == 2 for t in ("vda", "vdb"))
    vm.assert_healthy()


def test_merge_starts_while_the_day_is_stored(make_vm, dir_archive):
    """A running VM's night starts merging overlay(k) once its blocks are mapped: by the time the
    snapshot is recorded, QEMU's commit job runs (or is done) for every disk, and each night is
    still archived exactly, the chain ending merged. A first run (no overlay) merges nothing early."""
    vm = make_vm(TWO_DISKS)
    sink, seen = dir_archive.sink, []
    real = sink.add

    def add(run_id, name, uuid, when, disks, meta):
        dom = vm.conn.lookupByName(vm.name)
        seen.append([(t, meta["incremental"][t], bool(dom.blockJobInfo(t, 0)) or len(vm.chain(t)) == 2)
                     for t in ("vda", "vdb")])
        return real(run_id, name, uuid, when, disks, meta)

    sink.add = add
    states = []
    for night in range(3):
        vm.write("vda", 0x40 + night, night * MiB, 1 * MiB)
        vm.write("vdb", 0x50 + night, (8 + night) * MiB, 2 * MiB)
        r = dir_archive.run(vm.name)
        assert r.status == "ok", r.error
        states.append(vm.state())
    # first run: whole disks, nothing to merge (the chain is base <- overlay(1) after the snapshot)
    assert seen == [[("vda", False, True), ("vdb", False, True)]] + [[("vda", True, True), ("vdb", True, True)]] * 2
    dir_archive.check(vm.name, states)
    vm.assert_healthy()


def test_new_overlays_are_made_before_the_snapshot_call(make_vm, dir_archive, monkeypatch):
    """The snapshot call only opens the new overlays (REUSE_EXT): each is made before it, as libvirt
    would make it (the backing's cluster size, its chain in the header), private (0600)."""
    from foundation.vm import domain

    vm = make_vm([DiskSpec("vda", "raw"), DiskSpec("vdb", "qcow2", opts="cluster_size=128k")])
    seen = []
    real = domain.Domain.snapshot

    def spy(self, news, others, **kw):
        seen.append({t: (os.path.exists(p), vm.top(t)) for t, p in news.items()})
        return real(self, news, others, **kw)

    monkeypatch.setattr(domain.Domain, "snapshot", spy)
    states = nights(vm, dir_archive, PLAN[:2])
    dir_archive.check(vm.name, states)
    vm.assert_healthy()
    assert len(seen) == 2 and all(exists for call in seen for exists, _ in call.values()), seen
    # each made before its call, over the top of the day: the bases, then the first night's overlays
    bases = {"vda": os.path.join(vm.dir, "vda.raw"), "vdb": os.path.join(vm.dir, "vdb.qcow2")}
    assert [{t: top for t, (_, top) in call.items()} for call in seen] == [
        bases, {t: f"{b}.fdn-1.qcow2" for t, b in bases.items()}]
    for t in ("vda", "vdb"):
        new = vm.top(t)
        assert os.stat(new).st_mode & 0o777 == 0o600
        info = json.loads(subprocess.run(["qemu-img", "info", "-U", "--output=json", new], capture_output=True,
                                         text=True, check=True).stdout)
        # the second night's overlay sits on the base again (overlay(k) merged), as its header says; vdb's
        # has the base's cluster size, passed on through the first night's overlay
        assert info["full-backing-filename"] == bases[t]
        assert info["cluster-size"] == (128 << 10 if t == "vdb" else 64 << 10)
    assert not [f for f in os.listdir(vm.dir) if f.endswith(".part")]


def test_overlay_cut_short_is_removed_by_the_next_run(make_vm, dir_archive):
    """Killed while a new overlay was being made (its .part left, the snapshot not taken): the next run
    removes it with the other new overlays, and archives the night whole."""
    from foundation.image import qemuimg

    vm = make_vm(TWO_DISKS)
    states = nights(vm, dir_archive, PLAN[:1])
    vm.write("vda", 0x5A, 2 * MiB, 64 << 10)
    p = dir_archive.run_child(vm.name, crash_at="snapshot-overlays")
    assert p.returncode == 137, p.stdout + p.stderr
    made = sorted(f for f in os.listdir(vm.dir) if ".fdn-" in f)
    assert len(made) == 4, made        # the chain's two overlays and the killed run's two new ones
    # as if the kill had come while qemu-img wrote the second one
    new = os.path.join(vm.dir, made[-1])
    os.rename(new, new + qemuimg.PART)
    r = dir_archive.run(vm.name)
    assert r.status == "ok", r.error
    assert any("stopped before its snapshot; rolled back" in x for x in r.repaired), r.repaired
    states.append(vm.state())
    dir_archive.check(vm.name, states)
    vm.assert_healthy()
    assert not [f for f in os.listdir(vm.dir) if f.endswith(qemuimg.PART)]
