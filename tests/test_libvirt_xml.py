"""The libvirt XML Foundation writes is built with ElementTree: any name or path survives, quotes and all."""

import xml.etree.ElementTree as ET

from snapshotfs_support import domain_xml

from foundation.vm.domain import snapshot_xml

ODD = "/var/lib/libvirt/images/it's <a> \"disk\" & more.qcow2"


def test_snapshot_xml():
    root = ET.fromstring(snapshot_xml("foundation-17", {"vda": ODD, "vdb": "/x/b.qcow2"}, ["sda"]))
    assert root.tag == "domainsnapshot" and root.findtext("name") == "foundation-17"
    disks = {d.get("name"): d for d in root.find("disks")}
    assert list(disks) == ["vda", "vdb", "sda"]
    assert disks["vda"].get("snapshot") == "external" and disks["vda"].find("source").get("file") == ODD
    assert disks["vda"].find("driver").get("type") == "qcow2"
    assert disks["sda"].get("snapshot") == "no" and len(disks["sda"]) == 0


def test_domain_xml():
    root = ET.fromstring(domain_xml("web & <db>", "6b3c6a8e-52cf-4c39-9a39-0e2b4c8e7a01", {"vdb": "/b.raw", "vda": ODD}))
    assert root.get("type") == "qemu" and root.findtext("name") == "web & <db>"
    assert [(d.find("target").get("dev"), d.find("source").get("file")) for d in root.iter("disk")] == \
        [("vda", ODD), ("vdb", "/b.raw")]
    assert root.find("devices/memballoon").get("model") == "none"


def test_a_disk_that_bypasses_the_page_cache_is_known():
    # QEMU opens cache='none' and 'directsync' disks around the page cache: a night reads their
    # overlay(k) around it too (vm/source.py), the others through it, where QEMU's merge reads
    from foundation.vm.domain import Domain

    disk = "<disk type='file' device='disk'><driver name='qemu' type='qcow2'{}/><source file='/{}.qcow2'/>" \
           "<target dev='{}'/></disk>"
    xml = "<domain><devices>{}</devices></domain>".format("".join(
        disk.format(f" cache='{c}'" if c else "", t, t) for t, c in
        (("vda", None), ("vdb", "none"), ("vdc", "writeback"), ("vdd", "directsync"), ("vde", "unsafe"))))
    dom = Domain.__new__(Domain)
    dom.name = "web"
    disks, skipped = dom.disks((False, ET.fromstring(xml)))
    assert [(d.target, d.direct) for d in disks] == [("vda", False), ("vdb", True), ("vdc", False),
                                                       ("vdd", True), ("vde", False)]
    assert skipped == []
