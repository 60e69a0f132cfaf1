"""`foundation boot`: clones of past days on a real libvirtd + QEMU, backed by a real FUSE mount.

The VM `fdntest-web` is archived into a real store on three snapshots (two
on the 21st); the tree is mounted; clones are defined, started, written
into through QEMU's qemu-io, listed and removed. The archived image must
stay byte-identical throughout.
"""

import hashlib
import os
import shutil
import subprocess
import time
import xml.etree.ElementTree as ET

import pytest
import snapshotfs_support as T

from foundation.cli import main

pytestmark = [pytest.mark.libvirt, pytest.mark.fuse, pytest.mark.slow]

VM = "fdntest-web"
UUID = "0b7d3c1e-8a0f-4f7e-9d51-2c6e3a9b0f11"
MAC = "52:54:00:aa:bb:01"
MIB = 1 << 20
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _libvirt():
    if os.geteuid() != 0 or not os.path.exists("/dev/fuse"):
        pytest.skip("needs root and /dev/fuse")
    pytest.importorskip("pyfuse3")
    pytest.importorskip("pytsk3")
    try:
        import libvirt
    except ImportError:
        pytest.skip("libvirt-python not installed")
    script = os.path.join(REPO, "scripts", "libvirt.sh")
    if os.path.exists(script):
        r = subprocess.run(["bash", script], capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            pytest.skip(f"libvirtd unavailable: {r.stderr.strip()}")
    else:
        if os.path.exists("/dev/kvm"):
            subprocess.run("chgrp kvm /dev/kvm; chmod 660 /dev/kvm", shell=True)
        subprocess.run("pgrep -x virtlogd || /usr/sbin/virtlogd -d; pgrep -x libvirtd || /usr/sbin/libvirtd -d",
                       shell=True, capture_output=True)
    libvirt.registerErrorHandler(lambda *a: None, None)
    return libvirt.open("qemu:///system")


def _store_kind():
    try:
        from foundation.store import Store  # noqa: F401
        from foundation.catalog import Catalog  # noqa: F401
        return "store"
    except Exception:
        return "images"


def sha(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    conn = _libvirt()
    base = tmp_path_factory.mktemp("boot")
    kind = _store_kind()
    arch = T.ImagesArchiver(str(base / "archive")) if kind == "images" else T.StoreArchiver(str(base / "archive"))
    images = {}
    for i, when in enumerate([T.utc(2026, 11, 19), T.utc(2026, 11, 21), T.utc(2026, 11, 21, 15, 30)]):
        src = base / f"src{i}"
        T.write_tree(str(src), {"day.txt": f"day {i}\n".encode()}, 1_700_000_000)
        img = str(base / f"vda{i}.img")
        T.mkfs_image("ext4", img, 16 * MIB, str(src))
        xml = T.domain_xml(VM, UUID, {"vda": f"/var/lib/libvirt/images/{VM}.qcow2"}, mac=MAC)
        arch.add(VM, when, {"vda": img}, xml=xml)
        images[when] = img
    mnt = f"/tmp/fdntest-bootmnt-{os.getpid()}"
    clones = f"/tmp/fdntest-clones-{os.getpid()}"
    os.makedirs(clones, exist_ok=True)
    os.chmod(clones, 0o755)
    os.environ["FOUNDATION_CLONES_DIR"] = clones
    created = []
    try:
        with T.Mounted(arch, mnt) as m:
            yield {"conn": conn, "mnt": mnt, "clones": clones, "images": images, "created": created, "m": m,
                   "kind": kind}
            _cleanup(conn, created)
    finally:
        _cleanup(conn, created)
        os.environ.pop("FOUNDATION_CLONES_DIR", None)
        shutil.rmtree(clones, ignore_errors=True)
        shutil.rmtree(mnt, ignore_errors=True)
        conn.close()


def _cleanup(conn, names):
    import libvirt

    for n in list(names) + [d.name() for d in conn.listAllDomains() if d.name().startswith(VM + "@")]:
        try:
            d = conn.lookupByName(n)
        except libvirt.libvirtError:
            continue
        try:
            if d.isActive():
                d.destroy()
            d.undefineFlags(getattr(libvirt, "VIR_DOMAIN_UNDEFINE_NVRAM", 0))
        except libvirt.libvirtError:
            pass


def boot(env, capsys, *args):
    capsys.readouterr()
    rc = main(["boot", *args, "--mountpoint", env["mnt"]])
    out = capsys.readouterr()
    return rc, out.out + out.err


def test_boot_start_writes_go_to_the_overlay_only(env, capsys):
    conn, mnt = env["conn"], env["mnt"]
    name = f"{VM}@2026-11-19"
    env["created"].append(name)
    raw = f"{mnt}/2026/11/19/030000/{VM}/vda.raw"
    before = sha(raw)
    assert before == sha(env["images"][T.utc(2026, 11, 19)])
    t0 = time.monotonic()
    rc, out = boot(env, capsys, VM, "2026-11-19", "--start")
    assert rc == 0, out
    dom = conn.lookupByName(name)
    assert dom.isActive(), out
    print(f"boot --start to running: {time.monotonic() - t0:.2f} s")

    x = ET.fromstring(dom.XMLDesc(0))
    assert x.findtext("uuid") != UUID
    macs = [m.get("address") for m in x.iter("mac")]
    assert macs and MAC not in macs
    disk = x.find("devices/disk")
    overlay = disk.find("source").get("file")
    assert overlay == os.path.join(env["clones"], name, "vda.qcow2")
    assert disk.find("source/seclabel").get("relabel") == "no"
    assert disk.find("driver").get("type") == "qcow2"
    info = subprocess.run(["qemu-img", "info", "-U", "--output=json", overlay], capture_output=True, text=True)
    assert f'"backing-filename": "{raw}"' in info.stdout, info.stdout

    # write into the running guest's disk; it must land in the overlay
    # (then flush: until then the qcow2 L2 entry may sit in QEMU's metadata cache)
    for cmd in ("write -P 0xab 0 64k", "flush"):
        r = subprocess.run(["virsh", "-c", "qemu:///system", "qemu-monitor-command", name, "--hmp",
                            f'qemu-io -d /machine/peripheral/virtio-disk0/virtio-backend "{cmd}"'],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
    deadline = time.monotonic() + 10
    while True:
        chk = subprocess.run(["qemu-io", "-U", "-r", "-f", "qcow2", "-c", "read -P 0xab 0 64k", overlay],
                             capture_output=True, text=True)
        if "Pattern verification failed" not in chk.stdout + chk.stderr and chk.returncode == 0:
            break
        assert time.monotonic() < deadline, chk.stdout + chk.stderr
        time.sleep(0.2)
    # the archive is untouched: same bytes, still root's
    assert sha(raw) == before
    st = os.stat(raw)
    assert st.st_uid == 0

    rc, out = boot(env, capsys, "--list")
    assert rc == 0 and name in out and "running" in out, out
    rc, out = boot(env, capsys, "--remove", name)
    assert rc != 0 and "running" in out, out
    rc, out = boot(env, capsys, "--remove", name, "--force")
    assert rc == 0, out
    assert name not in [d.name() for d in conn.listAllDomains()]
    assert not os.path.exists(os.path.join(env["clones"], name))
    assert sha(raw) == before


def test_several_snapshots_a_day_are_named_by_time(env, capsys):
    conn = env["conn"]
    rc, out = boot(env, capsys, VM, "2026-11-21")
    name = f"{VM}@2026-11-21T153000"
    env["created"].append(name)
    assert rc == 0, out
    x = ET.fromstring(conn.lookupByName(name).XMLDesc(0))
    ov = x.find("devices/disk/source").get("file")
    info = subprocess.run(["qemu-img", "info", "-U", "--output=json", ov], capture_output=True, text=True).stdout
    assert "2026/11/21/153000" in info
    rc, out = boot(env, capsys, VM, "2026-11-21T10:00")
    env["created"].append(f"{VM}@2026-11-21T030000")
    assert rc == 0 and f"{VM}@2026-11-21T030000" in out, out
    rc, out = boot(env, capsys, VM, "latest", "--name", f"{VM}@newest")
    env["created"].append(f"{VM}@newest")
    assert rc == 0 and "2026/11/21/153000" in out, out
    for n in (name, f"{VM}@2026-11-21T030000", f"{VM}@newest"):
        rc, out = boot(env, capsys, "--remove", n)
        assert rc == 0, out


def test_refusals_are_clear(env, capsys, tmp_path):
    import libvirt

    conn = env["conn"]
    # not mounted
    empty = tmp_path / "nothing"
    empty.mkdir()
    capsys.readouterr()
    rc = main(["boot", VM, "2026-11-19", "--mountpoint", str(empty)])
    err = capsys.readouterr().err
    assert rc != 0 and "not mounted" in err, err
    # no snapshot that day: names the one before
    rc, out = boot(env, capsys, VM, "2026-11-20")
    assert rc != 0 and "no snapshot on 2026-11-20" in out and "2026-11-19" in out, out
    rc, out = boot(env, capsys, VM, "2026-11-18")
    assert rc != 0 and "no snapshot on 2026-11-18" in out, out
    rc, out = boot(env, capsys, "fdntest-nosuchvm", "2026-11-19")
    assert rc != 0 and "no VM named" in out, out
    rc, out = boot(env, capsys, VM, "someday")
    assert rc != 0 and "date" in out, out
    # name taken
    name = f"{VM}@2026-11-19"
    env["created"].append(name)
    rc, out = boot(env, capsys, VM, "2026-11-19")
    assert rc == 0, out
    rc, out = boot(env, capsys, VM, "2026-11-19")
    assert rc != 0 and "already exists" in out, out
    rc, out = boot(env, capsys, "--remove", name)
    assert rc == 0, out
    # a domain that is not a clone is never removed
    plain = f"fdntest-plain-{os.getpid()}"
    conn.defineXML(f"<domain type='qemu'><name>{plain}</name><memory unit='MiB'>32</memory>"
                   f"<os><type arch='x86_64'>hvm</type></os></domain>")
    try:
        rc, out = boot(env, capsys, "--remove", plain)
        assert rc != 0 and "not a Foundation clone" in out, out
        assert conn.lookupByName(plain)
    finally:
        try:
            conn.lookupByName(plain).undefine()
        except libvirt.libvirtError:
            pass


def test_clone_xml_rewrites_identity_and_devices():
    """Pure XML rewriting, without libvirt: what collides is dropped, the rest kept."""
    import datetime as dt

    from foundation.snapshotfs.clone import clone_xml, read_marker

    class S:
        name, path = "vm", "2026/11/21/030000/vm"
        time = dt.datetime(2026, 11, 21, 3, tzinfo=dt.timezone.utc)

    src = f"""<domain type='kvm' id='7'><name>vm</name><uuid>{UUID}</uuid><genid>abc</genid>
      <memory>65536</memory><os><type>hvm</type><nvram>/var/lib/libvirt/qemu/nvram/vm_VARS.fd</nvram></os>
      <devices>
        <disk type='file' device='disk'><driver name='qemu' type='qcow2'/><source file='/x/vm.qcow2'/>
          <backingStore type='file'><source file='/x/base.raw'/></backingStore><target dev='vda'/><alias name='virtio-disk0'/></disk>
        <disk type='file' device='disk'><source file='/x/scratch.img'/><target dev='vdz'/></disk>
        <disk type='file' device='cdrom'><source file='/iso/install.iso'/><target dev='sda'/><readonly/></disk>
        <interface type='network'><mac address='{MAC}'/><source network='default'/><target dev='vnet3'/></interface>
        <serial type='file'><source path='/var/log/vm-serial.log'/></serial>
        <channel type='unix'><source mode='bind' path='/var/lib/libvirt/qemu/ch.sock'/><target type='virtio' name='org.qemu.guest_agent.0'/></channel>
        <graphics type='vnc' port='5901' autoport='no'/>
      </devices></domain>"""
    out = clone_xml(src, "vm@2026-11-21", S, {"vda": "/c/vm@2026-11-21/vda.qcow2"}, nvram_path=None)
    x = ET.fromstring(out)
    assert x.get("id") is None and x.findtext("name") == "vm@2026-11-21" and x.findtext("uuid") != UUID
    assert x.find("os/nvram") is None
    disks = x.findall("devices/disk")
    assert [d.find("target").get("dev") for d in disks] == ["vda", "sda"]
    vda = disks[0]
    assert vda.find("source").get("file") == "/c/vm@2026-11-21/vda.qcow2"
    assert vda.find("backingStore") is None and vda.find("alias") is None
    assert vda.find("source/seclabel").attrib == {"model": "dac", "relabel": "no"}
    assert x.find("devices/interface/mac") is None and x.find("devices/interface/target") is None
    assert x.find("devices/interface/source").get("network") == "default"
    assert x.find("devices/serial").get("type") == "pty" and x.find("devices/serial/source") is None
    assert x.find("devices/channel/source").get("path") is None
    g = x.find("devices/graphics")
    assert g.get("port") is None and g.get("autoport") == "yes"
    m = read_marker(out)
    assert m == {"vm": "vm", "time": S.time.isoformat(), "path": S.path,
                 "overlays": {"vda": "/c/vm@2026-11-21/vda.qcow2"}}
    assert read_marker(src) is None
