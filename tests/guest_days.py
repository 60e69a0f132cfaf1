"""Test support: guest file systems that live on from day to day, changed in place.

A real guest's file system is not made afresh each night: files keep
their blocks unless written. So these images are made once (mkfs.ext4 -d,
mkfs.vfat + mcopy) and then changed the way a guest would, without a
mount: debugfs -w for ext4, mtools for FAT, and plain pwrite at a file's
own blocks (found with pytsk3) for a rewrite in place that leaves every
byte of metadata alone. A disk image holds them at fixed offsets behind
a GPT or MBR table written once, or bare.
"""

import os
import random
import subprocess
import tempfile

import pytsk3

MIB = 1 << 20


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {r.stderr.strip()}")
    return r.stdout


def rnd(n, seed):
    return random.Random(seed).randbytes(n)


class GuestFS:
    """One file system image: kind "ext4", "vfat" or "ntfs" (files at the root only), made from {relpath: bytes}."""

    def __init__(self, kind, path, size, files, mtime=1_700_000_000):
        self.kind, self.path, self.size = kind, path, size
        with tempfile.TemporaryDirectory() as src:
            for rel, data in files.items():
                p = os.path.join(src, rel)
                os.makedirs(os.path.dirname(p), exist_ok=True)
                with open(p, "wb") as f:
                    f.write(data)
            for d, dirs, fs in os.walk(src):
                for n in fs + dirs:
                    os.utime(os.path.join(d, n), (mtime, mtime))
            with open(path, "wb") as f:
                f.truncate(size)
            if kind == "ext4":
                run(["mkfs.ext4", "-q", "-F", "-b", "4096", "-E", "root_owner=0:0", "-d", src, path])
            elif kind == "ntfs":
                run(["mkntfs", "-q", "-F", "-Q", path])
                for rel in files:
                    self.write(rel, files[rel])
            else:
                run(["mkfs.vfat", path])
                if files:
                    run(["mcopy", "-s", "-m", "-i", path] + [os.path.join(src, e) for e in sorted(os.listdir(src))]
                        + ["::/"])

    @classmethod
    def existing(cls, kind, path):
        """An image made elsewhere (a copy), to change the same way."""
        fs = cls.__new__(cls)
        fs.kind, fs.path, fs.size = kind, path, os.path.getsize(path)
        return fs

    def _debugfs(self, *cmds):
        with tempfile.NamedTemporaryFile("w", suffix=".cmds") as f:
            f.write("\n".join(cmds) + "\n")
            f.flush()
            out = subprocess.run(["debugfs", "-w", "-f", f.name, self.path], capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(f"debugfs {cmds} failed: {out.stderr.strip()}")

    def write(self, rel, data):
        """Create or replace a file (on ext4 a new inode and new blocks, as an editor's save)."""
        with tempfile.NamedTemporaryFile(delete=False) as t:
            t.write(data)
        try:
            if self.kind == "ntfs":
                run(["ntfscp", "-q", "-f", self.path, t.name, rel])      # the root directory only
            elif self.kind == "ext4":
                parts = rel.split("/")
                mk = [f"mkdir /{'/'.join(parts[:i])}" for i in range(1, len(parts))]
                self._debugfs(*mk, f"rm /{rel}", f"write {t.name} /{rel}")
            else:
                parts = rel.split("/")
                for i in range(1, len(parts)):
                    subprocess.run(["mmd", "-i", self.path, "::/" + "/".join(parts[:i])], capture_output=True)
                run(["mcopy", "-o", "-i", self.path, t.name, f"::/{rel}"])
        finally:
            os.unlink(t.name)

    def remove(self, rel):
        if self.kind == "ext4":
            self._debugfs(f"rm /{rel}")
        else:
            run(["mdel", "-i", self.path, f"::/{rel}"])

    def rename(self, old, new):
        if self.kind == "ext4":
            self._debugfs(f"ln /{old} /{new}", f"unlink /{old}")
        else:
            run(["mren", "-i", self.path, f"::/{old}", f"::/{new}"])

    def set_mtime(self, rel, when):
        """Touch: only the metadata changes."""
        self._debugfs(f"sif /{rel} mtime {when}")

    def extents(self, rel):
        """[(byte offset in this image, length)] of the file's data blocks."""
        fs = pytsk3.FS_Info(pytsk3.Img_Info(self.path))
        bsz = fs.info.block_size
        out = []
        for attr in fs.open("/" + rel):
            if attr.info.type not in (pytsk3.TSK_FS_ATTR_TYPE_DEFAULT, pytsk3.TSK_FS_ATTR_TYPE_NTFS_DATA):
                continue
            for r in attr:
                if r.len and not int(r.flags) & 3:
                    out.append((r.addr * bsz, r.len * bsz))
        return out

    def rewrite_in_place(self, rel, offset, data):
        """Overwrite file bytes [offset, offset+len) in its own blocks: size, mtime, inode untouched."""
        fd = os.open(self.path, os.O_WRONLY)
        try:
            pos = 0
            for off, n in self.extents(rel):
                if offset < pos + n and pos < offset + len(data):
                    lo = max(offset, pos)
                    hi = min(offset + len(data), pos + n)
                    os.pwrite(fd, data[lo - offset:hi - offset], off + lo - pos)
                pos += n
        finally:
            os.close(fd)

    def scribble_free(self, nbytes, seed):
        """Random bytes over free blocks only (what deleting and trimming nothing leaves)."""
        if self.kind != "ext4":
            raise ValueError("free space is found on ext4 images")
        out = run(["dumpe2fs", self.path])
        free = []
        for line in out.splitlines():
            line = line.strip()
            if line.startswith("Free blocks: ") and line[len("Free blocks: "):]:
                for part in line[len("Free blocks: "):].split(", "):
                    a, _, b = part.partition("-")
                    free.append((int(a), int(b or a)))
        fd = os.open(self.path, os.O_WRONLY)
        left = nbytes
        try:
            for a, b in reversed(free):      # the high free blocks: nowhere near metadata
                n = min((b - a + 1) * 4096, left)
                os.pwrite(fd, rnd(n, seed), (b + 1) * 4096 - n)
                left -= n
                if not left:
                    break
        finally:
            os.close(fd)

    def damage_superblock(self):
        """Make the file system unrecognisable (its magic number gone)."""
        fd = os.open(self.path, os.O_WRONLY)
        try:
            if self.kind == "ext4":
                os.pwrite(fd, b"\0\0", 1024 + 0x38)
            else:
                os.pwrite(fd, b"\0\0", 510)
        finally:
            os.close(fd)


class GuestDisk:
    """A disk image holding file systems: behind a "gpt" or "dos" table (1 MiB aligned), or bare."""

    def __init__(self, path, size, fss, label="gpt"):
        self.path, self.fss, self.label = path, fss, label
        with open(path, "wb") as f:
            f.truncate(size)
        self.starts = []
        if label is None:
            if len(fss) != 1:
                raise ValueError("a bare disk holds one file system")
            self.starts = [0]
        else:
            types = {"gpt": {"ext4": "0FC63DAF-8483-4772-8E79-3D69D8477DE4",
                             "vfat": "EBD0A0A2-B9E5-4433-87C0-68B6B72699C7",
                             "ntfs": "EBD0A0A2-B9E5-4433-87C0-68B6B72699C7"},
                     "dos": {"ext4": "83", "vfat": "c", "ntfs": "7"}}[label]
            lines, start = [f"label: {label}"], 2048
            for fs in fss:
                sectors = fs.size // 512
                lines.append(f"start={start}, size={sectors}, type={types[fs.kind]}")
                self.starts.append(start * 512)
                start += sectors + (-sectors) % 2048
            subprocess.run(["sfdisk", "-q", path], input="\n".join(lines) + "\n", text=True, check=True,
                           stdout=subprocess.DEVNULL)
        self.sync()

    def sync(self):
        """Copy every file system into its place (all its bytes: zeros too)."""
        with open(self.path, "r+b") as out:
            for fs, start in zip(self.fss, self.starts):
                with open(fs.path, "rb") as f:
                    out.seek(start)
                    while True:
                        b = f.read(4 * MIB)
                        if not b:
                            break
                        out.write(b)
