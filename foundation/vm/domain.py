"""One libvirt domain, seen as what the archiver needs: its disks, snapshots, commits.

Running domains are snapshotted and committed live through libvirt
(external, disk-only, atomic, `--no-metadata`: Foundation keeps its own
journal and catalog). A shut-off domain gets the same chain operations
offline: `qemu-img create` of the overlays plus a `define` of the inactive
XML pointing at them (one define, so all disks switch at once), and
`qemu-img commit` + `rebase -u` instead of a block job. Either way the chain
between runs is base <- overlay(k), so a VM that is running one night and
shut off the next needs nothing special, and one that is started while a
run is under way simply continues on the new overlay.

A quiesced snapshot is three calls, not libvirt's QUIESCE flag: the guest
agent's freeze, the snapshot, the thaw in a `finally`. That way the freeze
time can be told apart from the snapshot's pause, and the guest agent's
state is ours to check and repair (`frozen()`, `thaw()`).
"""

import collections
import json
import logging
import signal
import time
import xml.etree.ElementTree as ET

from foundation.errors import BadInput, Error, NotFound

log = logging.getLogger(__name__)

AGENT_CHANNEL = "org.qemu.guest_agent.0"
AGENT_TIMEOUT = 5           # seconds for a ping, a status or a thaw
FREEZE_TIMEOUT = 60         # the freeze syncs every guest file system and runs the guest's hooks
THAW_ATTEMPTS = 3
HELD_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}   # delivered once the guest is thawed
FORMATS = ("raw", "qcow2")
JOB_POLL = 0.01


class LibvirtUnavailable(Error):
    """Cannot reach libvirt at {}: {}. Is libvirtd running? (scripts/libvirt.sh starts it)"""

    code = 41


class LibvirtFailed(Error):
    """libvirt refused to {} for VM {}: {}"""

    code = 61


class UnknownVM(NotFound):
    """There is no VM named {} in libvirt ({}). `virsh list --all` shows the VMs there are."""

    code = 30


class UnsupportedDisk(BadInput):
    """VM {} is skipped: Foundation cannot archive its disk {} ({}). Only file-backed raw and qcow2 disks are archived."""

    code = 31


class AgentFailed(Exception):
    """A guest agent command failed or timed out (the message is libvirt's)."""


class FreezeFailed(Exception):
    """The guest agent could not freeze the file systems; the guest is thawed, no snapshot taken."""


def _libvirt():
    try:
        import libvirt
    except ImportError:
        raise LibvirtUnavailable("this machine", "the Python module libvirt is missing "
                                 "(pip install libvirt-python; it needs libvirt-dev and pkg-config)") from None
    return libvirt


def connect(uri):
    libvirt = _libvirt()
    libvirt.registerErrorHandler(lambda *a: None, None)   # errors are raised, not printed
    try:
        return libvirt.open(uri)
    except libvirt.libvirtError as e:
        raise LibvirtUnavailable(uri, e.get_error_message()) from None


def all_names(conn):
    """Every VM libvirt knows (defined or running), by name."""
    return sorted(d.name() for d in conn.listAllDomains(0))


# One archived disk of the domain: target (vda), the file at the top of its chain, its format, and
# the file directly below the top as the running QEMU has it open (libvirt's live <backingStore>):
# "" for none, None when not known (a shut-off domain, a backing that is not a file).
# `direct`: QEMU opens the file around the page cache (cache='none' or 'directsync').
Disk = collections.namedtuple("Disk", "target path format backing direct", defaults=(None, False))
DIRECT_CACHES = ("none", "directsync")


class Domain:
    def __init__(self, conn, name):
        self.libvirt = _libvirt()
        self.conn = conn
        try:
            self.dom = conn.lookupByName(name)
        except self.libvirt.libvirtError as e:
            if e.get_error_code() == self.libvirt.VIR_ERR_NO_DOMAIN:
                raise UnknownVM(name, conn.getURI()) from None
            raise LibvirtFailed("look up the VM", name, e.get_error_message()) from None
        self.name = name
        self.uuid = self.dom.UUIDString()

    def _call(self, what, fn, *args):
        try:
            return fn(*args)
        except self.libvirt.libvirtError as e:
            raise LibvirtFailed(what, self.name, e.get_error_message()) from None

    # -- state and XML --------------------------------------------------

    def active(self):
        return bool(self._call("read the state", self.dom.isActive))

    def persistent(self):
        return bool(self._call("read the state", self.dom.isPersistent))

    def xml(self, inactive=False):
        flags = self.libvirt.VIR_DOMAIN_XML_INACTIVE if inactive else 0
        return self._call("read the XML", self.dom.XMLDesc, flags)

    def config_xml(self):
        """The XML that governs the disks' data: live while running, the persistent one otherwise."""
        return self.xml(inactive=not self.active())

    def look(self):
        """(running?, parsed XML) from one libvirt call: the XML that governs the disks' data.

        Without flags libvirt gives a running domain's live XML and a shut-off
        one's persistent XML; only the live one carries the domain's id. So one
        read answers both questions at the same instant, where `active()` then
        `xml()` are two round trips with a window between them.
        """
        root = ET.fromstring(self.xml())
        return root.get("id", "-1") != "-1", root

    def disks(self, seen=None):
        """(archived disks, notes on disks left out); raises UnsupportedDisk.

        CD-ROMs, floppies, LUNs and read-only or shareable disks are left out
        (noted); a writable disk that is not a raw or qcow2 file stops the VM.
        `seen` is a `look()` just made, to parse instead of asking again.
        """
        live, root = seen or self.look()
        out, skipped = [], []
        for d in root.findall("devices/disk"):
            target = d.find("target").get("dev")
            device = d.get("device", "disk")
            kind = d.get("type", "file")
            readonly = d.find("readonly") is not None or d.find("shareable") is not None
            if device != "disk" or readonly:
                skipped.append({"target": target, "device": device,
                                "why": "read-only or shareable" if device == "disk" else device})
                continue
            if kind != "file":
                raise UnsupportedDisk(self.name, target, f"a '{kind}' disk, not a file")
            if d.find("transient") is not None:
                raise UnsupportedDisk(self.name, target, "a transient disk")
            src = d.find("source")
            path = src.get("file") if src is not None else None
            if not path:
                raise UnsupportedDisk(self.name, target, "no source file (empty drive)")
            drv = d.find("driver")
            fmt = drv.get("type", "raw") if drv is not None else "raw"
            if fmt not in FORMATS:
                raise UnsupportedDisk(self.name, target, f"format '{fmt}'")
            if src.find("encryption") is not None or d.find("encryption") is not None:
                raise UnsupportedDisk(self.name, target, "an encrypted image")
            direct = drv is not None and drv.get("cache") in DIRECT_CACHES
            out.append(Disk(target, path, fmt, _backing(d) if live else None, direct))
        return out, skipped

    def tops(self):
        """{target: current top file} from the governing XML."""
        return {d.target: d.path for d in self.disks()[0]}

    def defined(self):
        """The parsed inactive XML (the live one of a transient domain): the VM as it would start."""
        return ET.fromstring(self.xml(inactive=self.persistent()))

    def nvram(self, root=None):
        """The NVRAM file of `root` (a `defined()` just read), else of the inactive XML read now."""
        el = (root if root is not None else self.defined()).find("os/nvram")
        return el.text.strip() if el is not None and el.text else None

    def archived_xml(self, bases, root=None):
        """The inactive XML with each archived disk pointing at its base: the VM as it is archived.

        `bases` maps target -> (path, format); `root` is a `defined()` just
        read (changed in place), else it is read now.
        """
        root = root if root is not None else self.defined()
        for d in root.findall("devices/disk"):
            t = d.find("target").get("dev")
            if t in bases:
                _set_source(d, *bases[t])
        return ET.tostring(root, encoding="unicode")

    def redefine(self, sources):
        """Point the persistent config's disks at new files: `sources` maps target -> (path, format).

        The <backingStore> of each of those disks is dropped: libvirt probes
        the chain from the image headers when the domain starts.
        """
        root = ET.fromstring(self.xml(inactive=True))
        for d in root.findall("devices/disk"):
            t = d.find("target").get("dev")
            if t in sources:
                _set_source(d, *sources[t])
        xml = ET.tostring(root, encoding="unicode")
        self._call("define the new disk files", self.conn.defineXML, xml)

    def inactive_mentions(self, path):
        """True if the persistent config still names `path` (as a source or in a backing chain)."""
        if not self.persistent():
            return False
        root = ET.fromstring(self.xml(inactive=True))
        return any(s.get("file") == path for s in root.iter("source"))

    # -- guest agent and snapshot ----------------------------------------

    def agent(self, command, timeout=AGENT_TIMEOUT):
        """One guest agent command's "return" value; raises AgentFailed if it fails or times out."""
        import libvirt_qemu

        try:
            out = libvirt_qemu.qemuAgentCommand(self.dom, json.dumps({"execute": command}), timeout, 0)
        except self.libvirt.libvirtError as e:
            raise AgentFailed(e.get_error_message()) from None
        return json.loads(out).get("return")

    def agent_problem(self, root=None):
        """None if the domain's QEMU guest agent answers a ping, else why not (a phrase for the log).

        `root` is a live XML just read (`look()`): its channel's state, then the ping itself.
        """
        root = root if root is not None else ET.fromstring(self.xml())
        states = [t.get("state") for t in root.findall("devices/channel/target") if t.get("name") == AGENT_CHANNEL]
        if not states:
            return f"the domain has no guest agent channel ({AGENT_CHANNEL})"
        if "connected" not in states:
            return "the guest agent is not connected (is qemu-guest-agent running in the guest?)"
        try:
            self.agent("guest-ping")
        except AgentFailed as e:
            return f"the guest agent does not answer ({e})"
        return None

    def frozen(self, root=None):
        """True if the guest's file systems are frozen, False if not, None if no agent answers."""
        if self.agent_problem(root):
            return None
        try:
            return self.agent("guest-fsfreeze-status") == "frozen"
        except AgentFailed:
            return None

    def thaw(self):
        """Thaw the guest's file systems (harmless if they are not frozen); -> how many were thawed."""
        return self.agent("guest-fsfreeze-thaw")

    def snapshot(self, news, others, freeze=False, while_frozen=None):
        """External disk-only snapshot of all disks at once; -> (pause, frozen) in seconds.

        Works on a running domain (QEMU switches to the new overlays
        atomically) and on a shut-off one (libvirt points the config at
        them). `news` maps target -> new overlay path, each made already by
        the caller (qemuimg.NewLayer): libvirt only opens them (REUSE_EXT),
        so making them is neither in the pause nor in the freeze (a third
        of the call, benchmarks/README.md wave 23). `others` are targets
        left as they are.

        `pause` is the snapshot call (the guest's I/O stops within it). With
        `freeze` the guest agent freezes the file systems first and thaws
        them afterwards whatever happens, with SIGTERM, SIGINT and SIGHUP held
        back meanwhile so that stopping the archiver cannot leave the guest
        frozen; `frozen` runs from the freeze request to the thaw's answer
        (None without `freeze`). Raises FreezeFailed (nothing taken, guest
        thawed) if the agent cannot freeze. `while_frozen()` is called with
        the guest frozen (the tests' kill point).
        """
        lv = self.libvirt
        xml = snapshot_xml(f"foundation-{int(time.time() * 1000)}", news, others)
        flags = (lv.VIR_DOMAIN_SNAPSHOT_CREATE_DISK_ONLY | lv.VIR_DOMAIN_SNAPSHOT_CREATE_ATOMIC
                 | lv.VIR_DOMAIN_SNAPSHOT_CREATE_NO_METADATA | lv.VIR_DOMAIN_SNAPSHOT_CREATE_REUSE_EXT)
        if not freeze:
            t0 = time.monotonic()
            self._call("take an external disk-only snapshot", self.dom.snapshotCreateXML, xml, flags)
            return time.monotonic() - t0, None
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, HELD_SIGNALS)
        t0 = time.monotonic()
        try:
            try:
                self.agent("guest-fsfreeze-freeze", FREEZE_TIMEOUT)
            except AgentFailed as e:
                raise FreezeFailed(str(e)) from None
            if while_frozen:
                while_frozen()
            t1 = time.monotonic()
            self._call("take an external disk-only snapshot", self.dom.snapshotCreateXML, xml, flags)
            pause = time.monotonic() - t1
        finally:
            self._thaw_now()
            frozen = time.monotonic() - t0
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        return pause, frozen

    def _thaw_now(self):
        for attempt in range(THAW_ATTEMPTS):
            try:
                self.thaw()
                return
            except AgentFailed as e:
                if attempt == THAW_ATTEMPTS - 1:
                    log.error("%s: the guest's file systems may still be frozen: the agent did not thaw "
                              "them (%s). Run `virsh domfsthaw %s`; the next archive run thaws them too",
                              self.name, e, self.name)
                else:
                    time.sleep(0.5)

    # -- block commit -----------------------------------------------------

    def block_job(self, target):
        """The block job running on a disk (dict with type/cur/end), or None."""
        info = self._call("read the block job", self.dom.blockJobInfo, target, 0)
        return info or None

    def start_commit(self, target, top, base):
        """Start merging the (non-active) layer `top` into `base` while the guest runs."""
        self._call(f"block-commit {top} into {base}", self.dom.blockCommit, target, base, top, 0, 0)

    def wait_job(self, target, timeout=None):
        """Wait until no block job runs on the disk; -> (seconds waited, seconds of the job's tail).

        The tail runs from the last poll that saw the job still copying (or
        from the start of the wait) to the job's end: it bounds the final
        graph change, the only moment a non-active commit can hold guest I/O,
        plus libvirt's bookkeeping, to within one poll.
        """
        t0 = copying = time.monotonic()
        while True:
            try:
                info = self.dom.blockJobInfo(target, 0)
            except self.libvirt.libvirtError as e:
                if not self.active():
                    break                       # the domain stopped: the job went with it
                raise LibvirtFailed("follow the block job", self.name, e.get_error_message()) from None
            now = time.monotonic()
            if not info:
                break
            if not info.get("end") or info.get("cur", 0) < info["end"]:
                copying = now
            if timeout is not None and now - t0 > timeout:
                raise LibvirtFailed("finish the block job", self.name, f"still running after {timeout} s")
            time.sleep(JOB_POLL)
        end = time.monotonic()
        return end - t0, end - copying


def _backing(disk_el):
    """The file below the top in a live <disk>'s <backingStore>: "" if it has none, None if unsaid."""
    bs = disk_el.find("backingStore")
    if bs is None:
        return None
    src = bs.find("source")
    if src is None:
        return "" if not len(bs) and bs.get("type") is None else None
    return src.get("file") if bs.get("type", "file") == "file" else None


def _set_source(disk_el, path, fmt):
    src = disk_el.find("source")
    src.attrib.pop("index", None)
    src.set("file", path)
    drv = disk_el.find("driver")
    if drv is None:
        drv = ET.SubElement(disk_el, "driver", {"name": "qemu"})
    drv.set("type", fmt)
    for b in disk_el.findall("backingStore"):
        disk_el.remove(b)


def snapshot_xml(name, news, others):
    """The <domainsnapshot> of Domain.snapshot: `news` {target: new overlay path} external, `others` left."""
    root = ET.Element("domainsnapshot")
    ET.SubElement(root, "name").text = name
    ET.SubElement(root, "description").text = "Foundation nightly archive"
    disks = ET.SubElement(root, "disks")
    for target, path in news.items():
        disk = ET.SubElement(disks, "disk", {"name": target, "snapshot": "external"})
        ET.SubElement(disk, "driver", {"type": "qcow2"})
        ET.SubElement(disk, "source", {"file": path})
    for target in others:
        ET.SubElement(disks, "disk", {"name": target, "snapshot": "no"})
    return ET.tostring(root, encoding="unicode")
