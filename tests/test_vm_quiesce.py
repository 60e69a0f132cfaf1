"""The quiesce policy on guests with no agent: auto falls back and says why, always refuses, never never asks.

Guests with no operating system cannot freeze anything, so these tests
cover every path where the agent is missing or silent; freezing, thawing
and a guest found frozen are tested with a real Debian guest
(test_guest_lab.py).
"""

import json
import os
import subprocess
import sys

import pytest

from foundation.cli import main
from test_vm_cli import archive, store  # noqa: F401
from test_vm_support import ROOT, DiskSpec, dir_archive, libvirt_conn, make_vm, vm_dir  # noqa: F401

pytestmark = pytest.mark.libvirt

AGENT = "<channel type='unix'><target type='virtio' name='org.qemu.guest_agent.0'/></channel>"


def test_auto_without_a_channel_is_crash_consistent_and_says_why(make_vm, dir_archive, caplog):
    vm = make_vm([DiskSpec("vda")])
    vm.write("vda", 0x42, 0, 4096)
    r = dir_archive.run(vm.name)
    assert r.status == "ok" and r.consistency == "crash-consistent"
    assert "no guest agent channel" in r.not_quiesced
    assert r.snapshot_pause < 5 and r.freeze_seconds is None
    (snap,) = dir_archive.snapshots(vm.name)
    assert snap["meta"]["quiesced"] is False and snap["meta"]["quiesce"] == "auto"
    assert "no guest agent channel" in snap["meta"]["not_quiesced"]
    assert snap["meta"]["freeze_seconds"] is None and 0 < snap["meta"]["pause_seconds"] < 5
    assert any("crash-consistent (quiesce = auto)" in m for m in caplog.messages)


def test_auto_with_a_silent_agent_is_crash_consistent(make_vm, dir_archive):
    """A VM configured for the guest agent whose agent never connects."""
    vm = make_vm([DiskSpec("vda")], extra_xml=AGENT)
    vm.write("vda", 0x42, 0, 4096)
    r = dir_archive.run(vm.name)
    assert r.status == "ok" and r.consistency == "crash-consistent"
    assert "the guest agent is not connected" in r.not_quiesced
    (snap,) = dir_archive.snapshots(vm.name)
    assert snap["meta"]["quiesced"] is False
    dir_archive.check(vm.name, [vm.state()])


def test_always_without_an_agent_fails_that_vm_and_touches_nothing(make_vm, dir_archive):
    vm = make_vm([DiskSpec("vda")], extra_xml=AGENT)
    other = make_vm([DiskSpec("vda")], start=False)
    vm.write("vda", 0x42, 0, 4096)
    dir_archive.archiver.quiesce = "always"
    r, r_off = dir_archive.run(vm.name, other.name)
    assert r.status == "failed"
    assert r.error.startswith(f"VM {vm.name} was not archived: quiesce = always, but the guest agent is "
                              f"not connected"), r.error
    assert "qemu-guest-agent" in r.error
    assert r_off.status == "ok" and r_off.consistency == "shut off"     # nothing to freeze: archived
    assert dir_archive.snapshots(vm.name) == [] and vm.overlays() == []
    assert vm.top("vda") == os.path.join(vm.dir, "vda.raw")
    # nothing to repair afterwards: the same VM archives under auto
    dir_archive.archiver.quiesce = "auto"
    r = dir_archive.run(vm.name)
    assert r.status == "ok" and not r.repaired
    dir_archive.check(vm.name, [vm.state()])
    vm.assert_healthy()


def test_never_does_not_ask_the_agent(make_vm, dir_archive):
    vm = make_vm([DiskSpec("vda")], extra_xml=AGENT)
    dir_archive.archiver.quiesce = "never"
    r = dir_archive.run(vm.name)
    assert r.status == "ok" and r.not_quiesced == "quiesce = never"
    (snap,) = dir_archive.snapshots(vm.name)
    assert snap["meta"]["quiesce"] == "never" and snap["meta"]["not_quiesced"] == "quiesce = never"


def test_cli_option_and_config_file(make_vm, store, tmp_path):  # noqa: F811
    vm = make_vm([DiskSpec("vda")], extra_xml=AGENT)
    vm.write("vda", 0x42, 0, 4096)
    p = archive(store, "--quiesce", "always", vm.name)
    assert p.returncode == 1, p.stdout + p.stderr
    assert f"{vm.name}: failed: VM {vm.name} was not archived: quiesce = always" in p.stdout
    assert "0 of 1 VM(s) archived" in p.stdout
    conf = tmp_path / "foundation.toml"
    conf.write_text(f'store = "{store.path}"\nkey_file = "{store.key_file}"\n'
                    f'state_dir = "{store.state}"\nvms = ["{vm.name}"]\nquiesce = "always"\n')

    def run(*extra):
        return subprocess.run([sys.executable, "-m", "foundation", "--config", str(conf), "archive", *extra],
                              capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=ROOT), timeout=120)

    p = run()
    assert p.returncode == 1 and "quiesce = always" in p.stdout, p.stdout + p.stderr
    p = run("--quiesce", "auto")            # the option beats the file
    assert p.returncode == 0, p.stdout + p.stderr
    assert "crash-consistent" in p.stdout
    p = run("--no-quiesce")
    assert p.returncode == 0, p.stdout + p.stderr
    p = subprocess.run([sys.executable, "-m", "foundation", *store.args, "list", "--json", vm.name],
                       capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=ROOT), timeout=60)
    snaps = json.loads(p.stdout)
    assert [s["meta"]["quiesced"] for s in snaps] == [False, False]
    assert [s["meta"]["quiesce"] for s in snaps] == ["auto", "never"]
    assert "the guest agent is not connected" in snaps[0]["meta"]["not_quiesced"]
    assert snaps[1]["meta"]["not_quiesced"] == "quiesce = never"
    with pytest.raises(SystemExit):
        main([*store.args, "archive", "--quiesce", "sometimes", vm.name])
