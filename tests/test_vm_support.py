"""Shared pieces of the VM archiver tests: a real libvirtd, small test VMs, a model of their disks.

libvirtd is started by the project's own scripts/libvirt.sh (once per
session); the tests skip, saying why, only if that script cannot bring it
up. Test VMs are domain type `qemu` (TCG) with no OS, virtio disks with
explicit aliases (`ua-<target>`) so the guest's writes can be made through
QEMU's HMP `qemu-io` on the device, exactly as a guest's writes would land.
Every VM is named `fdntest-<pid>-...` and is destroyed and undefined
afterwards (or by a later session, once that pid is gone).
Each test keeps a model of what every disk holds (a bytearray), updated
with each write, to compare archived snapshots and live disks against.
"""

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import uuid

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PREFIX = "fdntest-"
MiB = 1 << 20


@pytest.fixture(scope="session")
def libvirt_conn():
    """A connection to qemu:///system, libvirtd started by scripts/libvirt.sh."""
    script = os.path.join(ROOT, "scripts", "libvirt.sh")
    try:
        p = subprocess.run([script], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        pytest.skip(f"scripts/libvirt.sh could not start libvirtd: {e}")
    if p.returncode != 0:
        pytest.skip(f"scripts/libvirt.sh could not start libvirtd: {p.stderr.strip()}")
    from foundation.vm import connect

    conn = connect("qemu:///system")
    for d in conn.listAllDomains(0):          # left behind by a killed earlier session
        m = re.match(rf"{PREFIX}(\d+)-", d.name())
        if m and not os.path.exists(f"/proc/{m.group(1)}"):
            _remove_domain(d)
    yield conn
    conn.close()


def _remove_domain(d):
    import libvirt

    try:
        if d.isActive():
            d.destroy()
    except libvirt.libvirtError:
        pass
    try:
        d.undefineFlags(libvirt.VIR_DOMAIN_UNDEFINE_NVRAM)
    except libvirt.libvirtError:
        pass


@dataclasses.dataclass
class DiskSpec:
    target: str
    fmt: str = "raw"           # format of the base: raw | qcow2
    size: int = 32 * MiB
    opts: str = ""             # qemu-img create -o of the base (e.g. a cluster size)


class VM:
    """A test VM and the model of its disks."""

    def __init__(self, conn, tmp, disks, extra_xml="", os_xml=""):
        """`os_xml` goes inside <os> (a UEFI loader also turns ACPI on), `extra_xml` into <devices>."""
        self.conn = conn
        self.name = f"{PREFIX}{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.dir = os.path.join(tmp, self.name)
        os.makedirs(self.dir)
        self.specs = disks
        self.model = {}
        xml_disks = []
        for d in disks:
            path = os.path.join(self.dir, f"{d.target}.{d.fmt}")
            subprocess.run(["qemu-img", "create", "-q", "-f", d.fmt, *(["-o", d.opts] if d.opts else []), path,
                            str(d.size)], check=True)
            self.model[d.target] = bytearray(d.size)
            xml_disks.append(
                f"<disk type='file' device='disk'><driver name='qemu' type='{d.fmt}'/>"
                f"<source file='{path}'/><target dev='{d.target}' bus='virtio'/>"
                f"<alias name='ua-{d.target}'/></disk>")
        self.xml = (f"<domain type='qemu'><name>{self.name}</name><memory unit='MiB'>32</memory>"
                    f"<vcpu>1</vcpu><os><type arch='x86_64'>hvm</type>{os_xml}</os>"
                    f"{'<features><acpi/></features>' if 'loader' in os_xml else ''}<devices>"
                    f"{''.join(xml_disks)}{extra_xml}<memballoon model='none'/></devices></domain>")
        self.dom = conn.defineXML(self.xml)

    def start(self):
        self.dom.create()

    def destroy(self):
        if self.dom.isActive():
            self.dom.destroy()

    def running(self):
        return bool(self.dom.isActive())

    def top(self, target):
        from foundation.vm.domain import Domain

        return Domain(self.conn, self.name).tops()[target]

    def write(self, target, pattern, offset, length):
        """The guest writes `length` bytes of `pattern` at `offset` (through QEMU if running)."""
        self._qemu_io(target, f"write -P {pattern:#x} {offset} {length}")
        self.model[target][offset:offset + length] = bytes([pattern]) * length

    def write_bytes(self, target, offset, data):
        """The guest writes `data` at `offset`."""
        src = os.path.join(self.dir, "pattern.bin")
        with open(src, "wb") as f:
            f.write(data)
        os.chmod(src, 0o644)
        self._qemu_io(target, f"write -s {src} {offset} {len(data)}")
        self.model[target][offset:offset + len(data)] = data

    def _qemu_io(self, target, cmd):
        if self.running():
            import libvirt_qemu

            libvirt_qemu.qemuMonitorCommand(
                self.dom, f'qemu-io -d /machine/peripheral/ua-{target}/virtio-backend "{cmd}"',
                libvirt_qemu.VIR_DOMAIN_QEMU_MONITOR_COMMAND_HMP)
        else:
            top = self.top(target)
            fmt = "qcow2" if top.endswith(".qcow2") else "raw"
            p = subprocess.run(["qemu-io", "-f", fmt, "-c", cmd, top], capture_output=True, text=True)
            assert p.returncode == 0 and "error" not in p.stdout.lower(), p.stdout + p.stderr

    def state(self):
        """A copy of the model: what the guest has now."""
        return {t: bytes(b) for t, b in self.model.items()}

    def current(self, target):
        """The disk's bytes as QEMU shows them now, read through the whole chain.

        A running QEMU keeps qcow2 metadata in its cache: it is flushed first,
        else another reader (-U) can miss clusters allocated since.
        """
        if self.running():
            self._qemu_io(target, "flush")
        out = os.path.join(self.dir, f"current-{target}.raw")
        top = self.top(target)
        fmt = "qcow2" if top.endswith(".qcow2") else "raw"
        subprocess.run(["qemu-img", "convert", "-U", "-f", fmt, "-O", "raw", top, out], check=True)
        with open(out, "rb") as f:
            data = f.read()
        os.unlink(out)
        return data

    def chain(self, target):
        """The files of the disk's chain, top first (from the image headers)."""
        p = subprocess.run(["qemu-img", "info", "-U", "--backing-chain", "--output=json",
                            self.top(target)], capture_output=True, text=True, check=True)
        return [i["filename"] for i in json.loads(p.stdout)]

    def overlays(self):
        return sorted(f for f in os.listdir(self.dir) if ".fdn-" in f)

    def assert_healthy(self):
        """Every disk is `base <- one overlay`, nothing else is left, and it holds what the guest wrote."""
        for d in self.specs:
            base = os.path.join(self.dir, f"{d.target}.{d.fmt}")
            ch = self.chain(d.target)
            assert len(ch) == 2 and ch[1] == base and ".fdn-" in ch[0], ch
            assert self.current(d.target) == bytes(self.model[d.target]), f"{d.target} lost writes"
        assert len(self.overlays()) == len(self.specs), self.overlays()

    def remove(self):
        _remove_domain(self.dom)


@pytest.fixture
def vm_dir():
    """A directory QEMU (user libvirt-qemu) can reach: pytest's tmp_path is private to root."""
    d = tempfile.mkdtemp(prefix=PREFIX, dir="/var/tmp")
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def make_vm(libvirt_conn, vm_dir):
    """make_vm([DiskSpec...], start=True) -> VM; removed after the test."""
    vms = []

    def make(disks=None, start=True, extra_xml="", os_xml=""):
        vm = VM(libvirt_conn, vm_dir, disks or [DiskSpec("vda")], extra_xml, os_xml)
        vms.append(vm)
        if start:
            vm.start()
        return vm

    yield make
    for vm in vms:
        vm.remove()


class DirArchive:
    """The archiver into a DirSink, in this process or in a child that can be killed."""

    def __init__(self, conn, tmp):
        from foundation.vm import Archiver, DirSink

        self.dir = str(tmp / "snapshots")
        self.state = str(tmp / "state")
        self.sink = DirSink(self.dir)
        self.archiver = Archiver(conn, self.sink, self.state)

    def run(self, *names):
        res = [self.archiver.archive(n) for n in names]
        return res[0] if len(res) == 1 else res

    def run_child(self, name, crash_at=None):
        env = dict(os.environ, PYTHONPATH=ROOT)
        if crash_at:
            env["FOUNDATION_TEST_CRASH_AT"] = crash_at
        return subprocess.run([sys.executable, "-m", "foundation.vm", "--dir", self.dir,
                               "--state-dir", self.state, name],
                              capture_output=True, text=True, env=env, timeout=120)

    def snapshots(self, name):
        return [s for s in self.sink.snapshots() if s["name"] == name]

    def check(self, name, expected):
        """The archived snapshots of `name`, oldest first, are exactly `expected` (list of states)."""
        snaps = self.snapshots(name)
        assert len(snaps) == len(expected), [s["time"] for s in snaps]
        for i, (s, want) in enumerate(zip(snaps, expected)):
            assert set(s["disks"]) == set(want), (i, s["disks"])
            for t, data in want.items():
                with open(s["disks"][t]["root"], "rb") as f:
                    got = f.read()
                assert len(got) == len(data), (i, t)
                if got != data:
                    bad = next(k for k in range(len(data)) if got[k] != data[k])
                    raise AssertionError(f"snapshot {i} disk {t} differs at byte {bad}")


@pytest.fixture
def dir_archive(libvirt_conn, tmp_path):
    return DirArchive(libvirt_conn, tmp_path)
