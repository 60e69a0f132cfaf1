"""Test and benchmark support for the /snapshot tree: real disk images, archived days, a real FUSE mount.

Disk images are built without loop devices or root-only mounts:
`mkfs.ext4 -d DIR` fills an ext4 image from a directory, `mkfs.vfat` +
`mcopy` a FAT one, `mkntfs` + `ntfscp` an NTFS one; `sfdisk` writes the
partition table into the image file and `dd` puts each file system in
place. Days are archived either into a real store (write_image + Catalog,
`StoreArchiver`) or listed in a manifest of raw files (`ImagesArchiver`,
the stand-in). `Mounted` runs `foundation mount` in a subprocess and always
unmounts.
"""

import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid as uuidlib
import xml.etree.ElementTree as ET

from foundation.snapshotfs.server import is_tree

GPT_LINUX = "0FC63DAF-8483-4772-8E79-3D69D8477DE4"
GPT_MSDATA = "EBD0A0A2-B9E5-4433-87C0-68B6B72699C7"


def have(cmd):
    return shutil.which(cmd) is not None


def write_tree(root, files, mtime=None):
    """Create `files` ({relpath: bytes}) under root; every file and dir gets `mtime` (epoch)."""
    os.makedirs(root, exist_ok=True)
    for rel, data in sorted(files.items()):
        p = os.path.join(root, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(data)
    if mtime is not None:
        for d, dirs, fs in os.walk(root, topdown=False):
            for n in fs + dirs:
                os.utime(os.path.join(d, n), (mtime, mtime))


def mkfs_image(kind, path, size, srcdir, label="FDN"):
    """A file-system image of `size` bytes holding srcdir's files: kind ext4, vfat or ntfs."""
    with open(path, "wb") as f:
        f.truncate(size)
    if kind == "ext4":
        _run(["mkfs.ext4", "-q", "-F", "-b", "4096", "-E", "root_owner=0:0", "-d", srcdir, path])
    elif kind == "vfat":
        _run(["mkfs.vfat", "-n", label, path])
        entries = sorted(os.listdir(srcdir))
        if entries:
            _run(["mcopy", "-s", "-m", "-i", path] + [os.path.join(srcdir, e) for e in entries] + ["::/"])
    elif kind == "ntfs":
        _run(["mkntfs", "-q", "-F", "-Q", "-L", label, path])
        for d, dirs, fs in os.walk(srcdir):
            rel = os.path.relpath(d, srcdir)
            if dirs:
                raise ValueError("ntfs test images hold files at the root only")
            for n in fs:
                _run(["ntfscp", "-q", path, os.path.join(d, n), n if rel == "." else f"{rel}/{n}"])
    else:
        raise ValueError(kind)


def partitioned_disk(path, size, parts, label="gpt"):
    """A disk image with a partition table; parts = [(fs image path, gpt type or mbr id)], 1 MiB aligned."""
    with open(path, "wb") as f:
        f.truncate(size)
    lines = [f"label: {label}"]
    start = 2048
    placed = []
    for img, ptype in parts:
        sectors = os.path.getsize(img) // 512
        lines.append(f"start={start}, size={sectors}, type={ptype}")
        placed.append((img, start))
        start += sectors + (-sectors) % 2048
    subprocess.run(["sfdisk", "-q", path], input="\n".join(lines) + "\n", text=True, check=True,
                   stdout=subprocess.DEVNULL)
    for img, start in placed:
        _run(["dd", f"if={img}", f"of={path}", "bs=1M", f"seek={start * 512}", "oflag=seek_bytes",
              "conv=notrunc,sparse", "status=none"])


def _run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {r.stderr.strip()}")


def domain_xml(name, uid, disks, mac="52:54:00:12:34:56"):
    """A small bootable-but-OS-less libvirt domain (TCG) with the given {dev: image path}.

    Built with ElementTree like every other libvirt XML of Foundation: names and paths are escaped.
    """
    def sub(parent, tag, text=None, **attrs):
        el = ET.SubElement(parent, tag, attrs)
        el.text = text
        return el

    dom = ET.Element("domain", type="qemu")
    sub(dom, "name", name)
    sub(dom, "uuid", str(uid))
    sub(dom, "memory", "64", unit="MiB")
    sub(dom, "vcpu", "1")
    sub(sub(dom, "os"), "type", "hvm", arch="x86_64", machine="pc")
    devices = sub(dom, "devices")
    for dev, path in sorted(disks.items()):
        disk = sub(devices, "disk", type="file", device="disk")
        sub(disk, "driver", name="qemu", type="raw")
        sub(disk, "source", file=str(path))
        sub(disk, "target", dev=dev, bus="virtio")
    nic = sub(devices, "interface", type="user")
    sub(nic, "mac", address=mac)
    sub(nic, "model", type="virtio")
    sub(devices, "serial", type="pty")
    sub(devices, "console", type="pty")
    sub(devices, "memballoon", model="none")
    return ET.tostring(dom, encoding="unicode")


class ImagesArchiver:
    """The stand-in archive: snapshots are listed in a JSON manifest of raw image files."""

    kind = "images"

    def __init__(self, workdir):
        self.dir = workdir
        self.manifest = os.path.join(workdir, "manifest.json")
        self.items = []
        self._flush()

    def _flush(self):
        tmp = self.manifest + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.items, f)
        os.replace(tmp, self.manifest)

    def add(self, name, when, disks, xml=None, uuid=None, damaged=None, nvram=None):
        """Archive a snapshot: disks {dev: raw image path} are copied (the originals may change later)."""
        sid = f"s{len(self.items) + 1}"
        copies = {}
        for dev, p in disks.items():
            c = os.path.join(self.dir, f"{sid}-{dev}.raw")
            _run(["cp", "--sparse=always", p, c])
            copies[dev] = c
        item = {"id": sid, "name": name, "uuid": uuid or str(uuidlib.uuid5(uuidlib.NAMESPACE_DNS, name)),
                "time": when.isoformat(), "disks": copies}
        if xml is not None:
            xp = os.path.join(self.dir, f"{sid}.xml")
            with open(xp, "w") as f:
                f.write(xml)
            item["domain_xml"] = xp
        if nvram is not None:
            np_ = os.path.join(self.dir, f"{sid}.nvram")
            with open(np_, "wb") as f:
                f.write(nvram)
            item["nvram"] = np_
        if damaged:
            item["damaged"] = damaged
        self.items.append(item)
        self._flush()
        return sid

    def mount_args(self):
        return ["mount", "--images", self.manifest]


class StoreArchiver:
    """Archive days into a real Foundation store through image/ and catalog/."""

    kind = "store"

    def __init__(self, workdir, mode="hash", block_size=4096, arena_size=4 << 20, encrypt=True):
        from foundation.store import Store

        self.dir = workdir
        self.store_path = os.path.join(workdir, "store")
        os.makedirs(self.store_path, exist_ok=True)
        self.key_file = os.path.join(workdir, "store.key") if encrypt else None
        Store.create(self.store_path, mode=mode, block_size=block_size, arena_size=arena_size,
                     max_log_size=1 << 30, encrypt=encrypt, key_file=self.key_file)
        self.prev = {}          # (name, dev) -> Root

    def add(self, name, when, disks, xml=None, uuid=None, nvram=None):
        from foundation.catalog import Catalog, DiskEntry, Snapshot
        from foundation.image import write_blob, write_image
        from foundation.store import Store

        with Store.open(self.store_path, key_file=self.key_file, writable=True) as s:
            entries = {}
            for dev, p in sorted(disks.items()):
                size = os.path.getsize(p)
                with _FileSource(p) as src:
                    root = write_image(s, src, size, prev=self.prev.get((name, dev)))
                self.prev[(name, dev)] = root
                entries[dev] = DiskEntry(root=root, size=size)
            meta = {}
            if xml is not None:
                meta["domain_xml"] = write_blob(s, xml.encode()).to_json()
            if nvram is not None:       # as vm/ keeps it: the original path and a blob
                meta["nvram"] = {"path": f"/var/lib/libvirt/qemu/nvram/{name}_VARS.fd",
                                 "blob": write_blob(s, nvram).to_json()}
            cat = Catalog.load(s)
            snap = Snapshot(id=None, name=name, uuid=uuid or str(uuidlib.uuid5(uuidlib.NAMESPACE_DNS, name)),
                            time=when, disks=entries, meta=meta, added_bytes=0)
            cat.add(snap)
            cat.commit(s)
            return snap.id

    def open_store(self):
        from foundation.store import Store

        return Store.open(self.store_path, key_file=self.key_file)

    def mount_args(self):
        key = ["--key-file", self.key_file] if self.key_file else []
        return ["--store", self.store_path] + key + ["mount"]

    def arena_files(self):
        out = []
        for d, _, fs in os.walk(self.store_path):
            out += [os.path.join(d, f) for f in fs if "arena" in f or "arena" in d]
        return sorted(out)


class _FileSource:
    def __init__(self, path):
        self.fd = os.open(path, os.O_RDONLY)

    def read(self, offset, length):
        return os.pread(self.fd, length, offset)

    def __enter__(self):
        return self

    def __exit__(self, *a):
        os.close(self.fd)


class Mounted:
    """`foundation ... mount MNT --utc` in a subprocess; unmounts on exit whatever happened."""

    def __init__(self, archiver, mountpoint, log_path=None, extra=()):
        self.archiver, self.mnt = archiver, mountpoint
        self.log_path = log_path or os.path.join(archiver.dir, os.path.basename(mountpoint.rstrip("/")) + ".log")
        self.extra = list(extra)
        self.proc = None
        self.clean_exit = None      # SIGTERM unmounted and exited 0 by itself

    def __enter__(self):
        try:
            os.makedirs(self.mnt, exist_ok=True)
            os.chmod(self.mnt, 0o755)
        except OSError:
            pass                    # a stale mount there: `foundation mount` clears it
        self.logf = open(self.log_path, "ab")
        cmd = [sys.executable, "-m", "foundation"] + self.archiver.mount_args() + [self.mnt, "--utc"] + self.extra
        self.proc = subprocess.Popen(cmd, stdout=self.logf, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while not is_tree(self.mnt):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.__exit__(None, None, None)
                raise RuntimeError(f"mount did not come up: {self.log()}")
            time.sleep(0.05)
        return self

    def log(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")

    def __exit__(self, *exc):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.clean_exit = self.proc.wait(20) == 0 and not os.path.ismount(self.mnt)
            except subprocess.TimeoutExpired:
                self.clean_exit = False
                self.proc.kill()
                self.proc.wait()
        if os.path.ismount(self.mnt) or _stale(self.mnt):
            subprocess.run(["umount", "-l", self.mnt], stderr=subprocess.DEVNULL)
        self.logf.close()
        try:
            os.rmdir(self.mnt)
        except OSError:
            pass
        return False


def _stale(p):
    try:
        os.stat(p)
        return False
    except OSError:
        return True


def utc(y, m, d, hh=3, mm=0, ss=0):
    return dt.datetime(y, m, d, hh, mm, ss, tzinfo=dt.timezone.utc)
