"""Guest disks laid out as installers lay them out, built without a VM or device-mapper.

ext4 and FAT come from `mkfs -d` / `mcopy` (no mount); XFS and btrfs are
made with mkfs, then filled through a kernel loop mount in a mount
namespace of our own (`unshare -m`: a guest's mount namespace never keeps
it). LVM is laid out with pvcreate/vgcreate/lvcreate on a loop device,
every command limited to that device and told not to activate; each file
system is made in a file of its own and written at the extents LVM
reports. LUKS is formatted on a loop device, never opened.
"""

import os
import shutil
import subprocess

MIB = 1 << 20
GPT_LINUX = "0FC63DAF-8483-4772-8E79-3D69D8477DE4"
GPT_ESP = "C12A7328-F81F-11D2-BA4B-00A0C93EC93B"
GPT_LVM = "E6D6D379-F507-44C2-A23C-238F2A3DF928"
GPT_MSDATA = "EBD0A0A2-B9E5-4433-87C0-68B6B72699C7"
# mkfs.xfs refuses file systems under 300 MB unless it believes it runs under fstests
SMALL_XFS = dict(os.environ, TEST_DIR="1", TEST_DEV="1", QA_CHECK_FS="1")


def have(*cmds):
    return all(shutil.which(c) for c in cmds)


def run(cmd, env=None, input=None):
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, input=input)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {r.stderr.strip()}")
    return r.stdout


class Bytes:
    """A byte source over an image file, as the tree's archive gives one; reads of `bad` fail."""

    def __init__(self, path, bad=None):
        with open(path, "rb") as f:
            self.data = f.read()
        self.size = len(self.data)
        self.bad = bad                  # (start, end) or None

    def read(self, off, n):
        if self.bad and off < self.bad[1] and self.bad[0] < off + n:
            from foundation.errors import DataCorrupt
            raise DataCorrupt("test damage at arena 3")
        return self.data[off:off + n]


def blank(path, size):
    with open(path, "wb") as f:
        f.truncate(size)


def put(img, disk, offset):
    """Write image file img into disk at byte offset, keeping holes."""
    run(["dd", f"if={img}", f"of={disk}", "bs=1M", f"seek={offset}", "oflag=seek_bytes",
         "conv=notrunc,sparse", "status=none"])


def fill_by_mount(img, srcdir, setup=""):
    """Copy srcdir (owners, modes, times, links, holes) into img through a private loop mount."""
    mnt = img + ".mnt"
    os.makedirs(mnt, exist_ok=True)
    script = (f"set -e; mount -o loop {img} {mnt}; {setup}"
              f"cp -a --sparse=always {srcdir}/. {mnt}/; umount {mnt}")
    try:
        run(["unshare", "-m", "sh", "-c", script])
    finally:
        os.rmdir(mnt)


def xfs(path, size, srcdir):
    blank(path, size)
    run(["mkfs.xfs", "-q", "-f", path], env=SMALL_XFS)
    fill_by_mount(path, srcdir)


def ext4(path, size, srcdir):
    blank(path, size)
    run(["mkfs.ext4", "-q", "-F", "-b", "4096", "-E", "root_owner=0:0", "-d", srcdir, path])


def vfat(path, size, srcdir):
    blank(path, size)
    run(["mkfs.vfat", "-n", "ESP", path])
    entries = sorted(os.listdir(srcdir))
    if entries:
        run(["mcopy", "-s", "-m", "-i", path] + [os.path.join(srcdir, e) for e in entries] + ["::/"])


def exfat(path, size, srcdir):
    """exFAT filled through exfat-fuse (this kernel has no exFAT driver) on a loop device."""
    blank(path, size)
    run(["mkfs.exfat", "-L", "DATA", path])
    mnt = path + ".mnt"
    os.makedirs(mnt, exist_ok=True)
    try:
        with Loop(path) as dev:
            run(["unshare", "-m", "sh", "-c", f"set -e; mount.exfat-fuse {dev} {mnt}; cp -r {srcdir}/. {mnt}/; "
                 f"umount {mnt}"])
    finally:
        os.rmdir(mnt)


def ntfs(path, size, srcdir):
    """NTFS filled with ntfscp (no mount); srcdir holds files at its root only."""
    blank(path, size)
    run(["mkntfs", "-q", "-F", "-Q", "-L", "DATA", path])
    for n in sorted(os.listdir(srcdir)):
        run(["ntfscp", "-q", path, os.path.join(srcdir, n), n])


def btrfs(path, size, top, subvols):
    """A btrfs whose top level holds top's files and a subvolume per {name: srcdir}, as Fedora's."""
    blank(path, size)
    run(["mkfs.btrfs", "-q", "-f", path])
    mnt = path + ".mnt"
    os.makedirs(mnt, exist_ok=True)
    steps = [f"mount -o loop {path} {mnt}"]
    for name, src in subvols.items():
        steps += [f"btrfs -q subvolume create {mnt}/{name}", f"cp -a --sparse=always {src}/. {mnt}/{name}/"]
    steps += [f"cp -a --sparse=always {top}/. {mnt}/", f"umount {mnt}"]
    try:
        run(["unshare", "-m", "sh", "-c", "set -e; " + "; ".join(steps)])
    finally:
        os.rmdir(mnt)


def swap(path, size):
    blank(path, size)
    run(["mkswap", "-q", path])


class Loop:
    """A loop device over a file, detached on exit."""

    def __init__(self, path):
        self.path = path

    def __enter__(self):
        self.dev = run(["losetup", "-f", "--show", self.path]).strip()
        return self.dev

    def __exit__(self, *exc):
        subprocess.run(["losetup", "-d", self.dev], capture_output=True)


def luks(path, size, version=2):
    """A LUKS container with a throwaway passphrase; formatted, never opened."""
    blank(path, size)
    with Loop(path) as dev:
        run(["cryptsetup", "-q", "luksFormat", "--type", f"luks{version}", "--pbkdf-force-iterations", "1000",
             "--pbkdf", "pbkdf2", "--key-file", "-", dev], input="not a secret")


def lvm_pv(path, size, vg, lvs):
    """An LVM2 physical volume holding vg with linear LVs [(name, image file)], never activated."""
    blank(path, size)
    with Loop(path) as dev:
        # Only this device, no devices file, no backups in the host's /etc/lvm, never auto-activated.
        lvm = ["--devices", dev, "--config", "devices { use_devicesfile = 0 } backup { backup = 0 archive = 0 }"]
        run(["pvcreate", "-q"] + lvm + [dev])
        run(["vgcreate", "-q", "--setautoactivation", "n"] + lvm + [vg, dev])
        for name, img in lvs:
            run(["lvcreate", "-q"] + lvm + ["--driverloaded", "n", "-an", "-Zn", "-Wn",
                                             "-L", f"{os.path.getsize(img)}b", "-n", name, vg])
        pe_start = int(run(["pvs"] + lvm + ["--noheadings", "--units", "b", "--nosuffix", "-o", "pe_start", dev]))
        extent = int(run(["vgs"] + lvm + ["--noheadings", "--units", "b", "--nosuffix", "-o", "vg_extent_size",
                                          vg]))
        ranges = {}
        for line in run(["lvs"] + lvm + ["--noheadings", "-o", "lv_name,seg_pe_ranges", vg]).splitlines():
            name, rng = line.split()
            ranges[name] = int(rng.split(":")[1].split("-")[0])
        run(["vgchange", "-q"] + lvm + ["--driverloaded", "n", "-an", vg])
    for name, img in lvs:
        put(img, path, pe_start + ranges[name] * extent)


def disk(path, size, parts, label="gpt"):
    """A partitioned disk: parts = [(image file, type)], 1 MiB aligned; with label "dos", a part
    whose type is given as ("logical", type) goes into an extended partition (p5, p6, ...)."""
    blank(path, size)
    lines = [f"label: {label}"]
    start = 2048
    placed = []
    logical = [p for p in parts if isinstance(p[1], tuple)]
    for img, ptype in parts:
        if isinstance(ptype, tuple):
            continue
        sectors = os.path.getsize(img) // 512
        lines.append(f"start={start}, size={sectors}, type={ptype}")
        placed.append((img, start))
        start += sectors + (-sectors) % 2048
    if logical:
        lines.append(f"start={start}, type=5")
        for img, (_, ptype) in logical:
            start += 2048                          # room for the EBR
            sectors = os.path.getsize(img) // 512
            lines.append(f"start={start}, size={sectors}, type={ptype}")
            placed.append((img, start))
            start += sectors + (-sectors) % 2048
    run(["sfdisk", "-q", path], input="\n".join(lines) + "\n")
    for img, s in placed:
        put(img, path, s * 512)


def unreplayed(before, after, out, bs=4096):
    """out: the ext4 image `before` whose journal holds, committed but not replayed, one
    transaction writing every block in which `after` differs from it: a crash-consistent day."""
    shutil.copy(before, out)
    changed, data = [], []
    with open(before, "rb") as a, open(after, "rb") as b:
        i = 0
        while True:
            x, y = a.read(bs), b.read(bs)
            if not y:
                break
            if x != y:
                changed.append(str(i))
                data.append(y)
            i += 1
    tx = out + ".tx"
    with open(tx, "wb") as f:
        f.write(b"".join(data))
    run(["debugfs", "-w", "-f", "-", out], input=f"jo\njw -b {','.join(changed)} {tx}\njc\n")
    os.remove(tx)


def in_mount(img, script, opts="loop"):
    """Run sh `script` with image img mounted at $M in a private mount namespace."""
    mnt = img + ".mnt"
    os.makedirs(mnt, exist_ok=True)
    try:
        run(["unshare", "-m", "sh", "-c", f"set -e; mount -o {opts} {img} {mnt}; M={mnt}; {script}; umount {mnt}"])
    finally:
        os.rmdir(mnt)


def copied_while_mounted(img, out, script, opts="loop,commit=1"):
    """out: a copy of image img taken while the kernel has it mounted and `script` (sh, run in the
    mount as $M) has written, after a journal commit (ext4's commit=1) but before the metadata is
    written in place: what a nightly archive without a guest agent catches."""
    in_mount(img, f"{script}; sleep 2.5; cp --sparse=always {img} {out}", opts)


def debugfs(img, *cmds):
    run(["debugfs", "-w", "-f", "-", img], input="\n".join(cmds) + "\n")


def files_of(img, dest, opts="ro,loop"):
    """Copy the files of file-system image img to dest through a private (read-only) loop mount."""
    os.makedirs(dest, exist_ok=True)
    in_mount(img, f"cp -a $M/. {dest}/", opts)


def xfs_crashed(img, out, script):
    """out: a copy of XFS image img after `script` (sh, run in the mount as $M) wrote and the file
    system was shut down with its log forced (xfs_io godown): the log holds committed transactions
    that were never written in place, as in a guest that lost power."""
    in_mount(img, f"{script}; xfs_io -x -c 'shutdown -f' $M")
    shutil.copy(img, out)


def xfs_records(img):
    """(byte offset of the internal log, [block of each record header from the tail to the head]) of
    XFS image img, as xfs_logprint reads them (independent of the code under test)."""
    out = run(["xfs_logprint", "-t", img])
    log_daddr = int(out.split("daddr: ")[1].split()[0])
    tail, head = (int(out.split(f"{w}: ")[1].split()[0]) for w in ("log tail", "head"))
    if tail > head:
        raise RuntimeError(f"the log of {img} wraps; xfs_records reads only one that does not")
    headers = [int(ln.split()[0]) for ln in run(["xfs_logprint", "-d", img]).splitlines()
               if " HEADER Cycle " in ln]
    return log_daddr * 512, [b for b in headers if tail <= b < head]
