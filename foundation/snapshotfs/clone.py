"""Booting a past day: a libvirt domain over qcow2 overlays of the archived disks.

A clone (Olive's writable copy of a snapshot) is a new domain, named
`<vm>@YYYY-MM-DD` (`<vm>@YYYY-MM-DDTHHMMSS` when the VM has several
snapshots that day), with a fresh UUID and MAC addresses, defined from
the archived domain XML. Each archived disk becomes a new qcow2 overlay in
the clones directory whose backing file is the raw image in the mounted
snapshot tree, under the snapshot's immutable path
(`/snapshot/YYYY/MM/DD/HHMMSS/<vm>/vda.raw`), so the clone keeps the day it
was made from even as `latest` moves on. The archive is never written:
the tree is read-only, QEMU opens backing files read-only, and the disks
carry `<seclabel model='dac' relabel='no'/>` so libvirt does not try to
chown the backing file (it cannot, and must not). We chown the overlays
to QEMU's user ourselves instead.

Clones are marked with a <metadata> element in our namespace; `--list`
and `--remove` act only on domains that carry it.
"""

import datetime as dt
import json
import logging
import os
import pwd
import grp
import re
import shutil
import uuid
import xml.etree.ElementTree as ET

from foundation.errors import BadInput, NotFound, UsageError
from foundation.image import qemuimg
from foundation.snapshotfs import timeindex as ti
from foundation.snapshotfs import MARKER

log = logging.getLogger(__name__)

NS = "https://foundation.invalid/xmlns/clone/1"
PREFIX = "foundation"
DEFAULT_CLONES_DIR = "/var/lib/foundation/clones"
DEFAULT_MOUNTPOINT = "/snapshot"


def check_tree(mountpoint):
    """Refuse unless a Foundation snapshot tree answers at `mountpoint`."""
    try:
        ok = os.path.ismount(mountpoint) and MARKER in os.listdir(mountpoint)
    except OSError:
        ok = False
    if not ok:
        raise UsageError(
            f"the snapshot tree is not mounted on {mountpoint}: start it with `foundation mount {mountpoint}` "
            f"(or `systemctl start foundation-snapshot`), or pass --mountpoint")


class Snap:
    """One archived snapshot as seen through the tree."""

    def __init__(self, mountpoint, relpath):
        self.mountpoint = mountpoint
        self.dir = os.path.join(mountpoint, relpath)
        with open(os.path.join(self.dir, "snapshot.json")) as f:
            self.info = json.load(f)
        self.path = self.info["path"]                 # canonical YYYY/MM/DD/HHMMSS/<vm>
        self.canonical_dir = os.path.join(mountpoint, self.path)
        self.name = self.info["name"]
        self.time = dt.datetime.fromisoformat(self.info["time"])
        self.disks = self.info["disks"]

    def day_and_time(self):
        y, m, d, hms = self.path.split("/")[:4]
        return dt.date(int(y), int(m), int(d)), hms


def find_snapshot(mountpoint, vm, when):
    """The snapshot of `vm` that WHEN names, taken on that day of the tree; refuses otherwise."""
    check_tree(mountpoint)
    if not re.fullmatch(r"[^/\0]+", vm) or vm in (".", ".."):
        raise BadInput(f"{vm!r} is not a VM name")
    try:
        until, day, has_time = ti.parse_when(when)
    except ValueError as e:
        raise BadInput(str(e)) from None
    if when.strip() in ("latest", "now"):
        link = os.path.join(mountpoint, "latest", vm)
        if not os.path.lexists(link):
            raise NotFound(_unknown_vm(mountpoint, vm))
        return Snap(mountpoint, os.path.relpath(os.path.realpath(link), mountpoint))
    daydir = os.path.join(mountpoint, f"{day:%Y/%m/%d}")
    times = []
    try:
        for n in sorted(os.listdir(daydir)):
            if ti.parse_hhmmss(n) and os.path.isdir(os.path.join(daydir, n, vm)):
                if os.path.isfile(os.path.join(daydir, n, vm, "snapshot.json")):
                    times.append(n)
    except FileNotFoundError:
        pass
    if has_time:
        limit = until.strftime("%H%M%S")
        times = [t for t in times if t <= limit]
    # Only snapshots taken exactly at t are listed under HHMMSS/<vm>; confirm each is vm's own.
    own = []
    for t in times:
        s = Snap(mountpoint, f"{day:%Y/%m/%d}/{t}/{vm}")
        if s.path == f"{day:%Y/%m/%d}/{t}/{vm}":
            own.append(s)
    if not own:
        raise NotFound(_no_snapshot(mountpoint, vm, day, until if has_time else None))
    return own[-1]


def _known_vms(mountpoint):
    try:
        return sorted(os.listdir(os.path.join(mountpoint, "latest")))
    except OSError:
        return []


def _unknown_vm(mountpoint, vm):
    known = _known_vms(mountpoint)
    return f"the archive has no VM named {vm!r} (it has: {', '.join(known) or 'none'})"


def _no_snapshot(mountpoint, vm, day, until):
    if vm not in _known_vms(mountpoint):
        return _unknown_vm(mountpoint, vm)
    what = f"{day:%Y-%m-%d}" + (f" at or before {until:%H:%M:%S}" if until else "")
    msg = f"{vm} has no snapshot on {what}"
    try:
        before = Snap(mountpoint, f"{day:%Y/%m/%d}/{vm}")
        msg += f"; the latest before it is {before.path.rsplit('/', 1)[0].replace('/', '-', 2)}"
        msg += f" (`foundation boot {vm} {before.day_and_time()[0]:%Y-%m-%d}`)"
    except OSError:
        pass
    return msg


def clone_name(snap, mountpoint):
    day, hms = snap.day_and_time()
    daydir = os.path.join(mountpoint, f"{day:%Y/%m/%d}")
    n = sum(1 for t in os.listdir(daydir)
            if ti.parse_hhmmss(t) and _own(mountpoint, f"{day:%Y/%m/%d}/{t}/{snap.name}"))
    return f"{snap.name}@{day:%Y-%m-%d}" + (f"T{hms}" if n > 1 else "")


def _own(mountpoint, rel):
    try:
        return Snap(mountpoint, rel).path == rel
    except OSError:
        return False


def qemu_user():
    """(uid, gid) QEMU runs as under qemu:///system (qemu.conf `user`/`group`, Debian's defaults)."""
    user, group = "libvirt-qemu", None
    try:
        with open("/etc/libvirt/qemu.conf") as f:
            for line in f:
                m = re.match(r'\s*(user|group)\s*=\s*"([^"]*)"', line)
                if m:
                    if m.group(1) == "user":
                        user = m.group(2)
                    else:
                        group = m.group(2)
    except OSError:
        pass

    def _id(name, db):
        if name.startswith("+"):
            return int(name[1:])
        try:
            return db(name)
        except KeyError:
            return int(name) if name.isdigit() else None

    uid = _id(user, lambda n: pwd.getpwnam(n).pw_uid)
    if uid is None:
        return None
    if group is None:
        gid = pwd.getpwuid(uid).pw_gid
    else:
        gid = _id(group, lambda n: grp.getgrnam(n).gr_gid)
    return uid, gid


def clone_xml(xml_text, name, snap, overlays, nvram_path=None):
    """The archived domain XML rewritten as a clone: new identity, disks on the overlays.

    `overlays` maps target dev (vda) -> overlay path. Disks of the archived
    VM that were not archived are dropped (sharing them would let the clone
    write into the live VM's disks); cdroms and floppies stay.
    """
    ET.register_namespace(PREFIX, NS)
    root = ET.fromstring(xml_text)
    if root.tag != "domain":
        raise BadInput("the archived domain XML has no <domain> element")
    root.attrib.pop("id", None)
    _set(root, "name", name)
    _set(root, "uuid", str(uuid.uuid4()))
    for tag in ("genid",):
        for e in root.findall(tag):
            e.text = None                  # libvirt picks a new generation id
    title = root.find("title")
    if title is None:
        title = ET.SubElement(root, "title")
    title.text = f"{snap.name} as of {snap.time.astimezone():%Y-%m-%d %H:%M} (Foundation clone)"
    for e in list(root.iter()):
        for child in list(e):
            if child.tag in ("alias", "backingStore"):
                e.remove(child)
    for sl in root.findall("seclabel"):
        root.remove(sl)

    devices = root.find("devices")
    if devices is None:
        raise BadInput("the archived domain XML has no <devices>")
    for disk in list(devices.findall("disk")):
        target = disk.find("target")
        dev = target.get("dev") if target is not None else None
        if disk.get("device", "disk") in ("cdrom", "floppy"):
            continue
        if dev not in overlays:
            log.warning("%s: disk %s was not archived; the clone goes without it", name, dev)
            devices.remove(disk)
            continue
        disk.set("type", "file")
        disk.set("device", "disk")
        for child in list(disk):
            if child.tag in ("source", "driver", "shareable", "readonly", "transient", "auth", "reservations"):
                disk.remove(child)
        drv = ET.Element("driver", {"name": "qemu", "type": "qcow2"})
        src = ET.Element("source", {"file": overlays[dev]})
        ET.SubElement(src, "seclabel", {"model": "dac", "relabel": "no"})
        disk.insert(0, src)
        disk.insert(0, drv)
    for iface in devices.findall("interface"):
        for child in list(iface):
            if child.tag in ("mac", "target"):
                iface.remove(child)       # libvirt generates new ones
    for chardev in [c for tag in ("serial", "console", "parallel", "channel") for c in devices.findall(tag)]:
        src = chardev.find("source")
        if chardev.get("type") in ("file", "unix", "pipe", "dev") and chardev.tag != "channel":
            chardev.set("type", "pty")
            if src is not None:
                chardev.remove(src)
        elif chardev.tag == "channel" and src is not None:
            src.attrib.pop("path", None)
    for g in devices.findall("graphics"):
        for a in ("port", "tlsPort", "websocket"):
            g.attrib.pop(a, None)
        if g.get("type") in ("vnc", "spice"):
            g.set("autoport", "yes")
        for lst in g.findall("listen"):
            lst.attrib.pop("socket", None)
    os_el = root.find("os")
    if os_el is not None:
        for nv in os_el.findall("nvram"):
            if nvram_path:
                nv.text = nvram_path
            else:
                nv.text = None
                os_el.remove(nv)

    md = root.find("metadata")
    if md is None:
        md = ET.SubElement(root, "metadata")
    for old in md.findall(f"{{{NS}}}clone"):
        md.remove(old)
    md.append(marker_element(snap, overlays))
    return ET.tostring(root, encoding="unicode")


def marker_element(snap, overlays):
    el = ET.Element(f"{{{NS}}}clone", {"vm": snap.name, "time": snap.time.isoformat(), "path": snap.path})
    for dev, path in sorted(overlays.items()):
        ET.SubElement(el, f"{{{NS}}}overlay", {"dev": dev, "file": path})
    return el


def _set(root, tag, text):
    e = root.find(tag)
    if e is None:
        e = ET.SubElement(root, tag)
    e.text = text


def read_marker(xml_text):
    """The clone marker of a domain's XML as a dict, or None for a domain that is not a clone."""
    try:
        root = ET.fromstring(xml_text)
    except ET.ParseError:
        return None
    el = root.find(f"metadata/{{{NS}}}clone")
    if el is None:
        return None
    return {
        "vm": el.get("vm"), "time": el.get("time"), "path": el.get("path"),
        "overlays": {o.get("dev"): o.get("file") for o in el.findall(f"{{{NS}}}overlay")},
    }


def create_overlays(snap, name, clones_dir):
    """qcow2 overlays over the snapshot's raw images: {dev: overlay path}. Cleans up on failure."""
    cdir = os.path.join(clones_dir, name)
    if os.path.exists(cdir):
        raise UsageError(f"{cdir} already exists: a clone named {name} was not removed cleanly; "
                         f"delete the directory or pick another --name")
    os.makedirs(clones_dir, mode=0o755, exist_ok=True)
    os.mkdir(cdir, 0o711)
    owner = qemu_user()
    overlays = {}
    try:
        for dev in sorted(snap.disks):
            backing = os.path.join(snap.canonical_dir, f"{dev}.raw")
            ov = os.path.join(cdir, f"{dev}.qcow2")
            try:
                qemuimg.create_overlay(ov, backing, "raw")
            except qemuimg.QemuImgFailed as e:
                raise UsageError(f"qemu-img create of the overlay for {dev} failed: {e.args[1]}") from None
            if owner:
                os.chown(ov, *owner)
            os.chmod(ov, 0o660)
            overlays[dev] = ov
        return cdir, overlays
    except BaseException:
        shutil.rmtree(cdir, ignore_errors=True)
        raise


def copy_nvram(snap, cdir):
    src = os.path.join(snap.canonical_dir, "nvram.fd")
    if not os.path.exists(src):
        return None
    dst = os.path.join(cdir, "nvram.fd")
    shutil.copyfile(src, dst)
    owner = qemu_user()
    if owner:
        os.chown(dst, *owner)
    os.chmod(dst, 0o660)
    return dst


def read_domain_xml(snap):
    p = os.path.join(snap.canonical_dir, "domain.xml")
    try:
        with open(p) as f:
            return f.read()
    except FileNotFoundError:
        raise NotFound(f"the snapshot {snap.path} has no archived domain XML; it cannot be booted") from None
