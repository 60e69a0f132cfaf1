"""btrfs, read by Dissect (dissect.btrfs, AGPL-3.0-or-later) when the optional extra is installed.

No LGPL or MIT library reads btrfs from a byte source, and the project is
MIT: dissect.btrfs comes only with `pip install foundation[btrfs]`, and
without it a btrfs volume is one log line saying so. The tree shows the
top-level subvolume (id 5): every named subvolume (Fedora's `root` and
`home`, ...) appears as a directory at its path, as in a mount of
`subvolid=5`. Addresses are (subvolume id, inode number).
"""

import stat

from foundation.guestfs.sources import FileObject, ReadFailed
from foundation.guestfs.volume import Entry, Volume, as_bytes


def _dissect():
    """dissect.btrfs's reader class, or None when the optional extra is not installed. Imported
    when a btrfs volume is met, not with this module: its import builds its structures from C
    declarations, ~125 ms and several MB, which every listing that probes a disk paid (a night's
    listing of a disk without btrfs included)."""
    try:
        from dissect.btrfs import Btrfs
    except ImportError:
        return None
    return Btrfs


MISSING = "btrfs needs the optional AGPL extra: pip install 'foundation[btrfs]' (see README, Licences)"


def _entry(node, name):
    i = node.inode
    mode = i.mode
    link = as_bytes(node.link) if stat.S_ISLNK(mode) else None
    return Entry(name=name, addr=(node.subvolume.objectid, node.inum), mode=mode, size=i.size,
                 uid=i.uid, gid=i.gid, nlink=i.nlink, atime_ns=node.atime_ns, mtime_ns=node.mtime_ns,
                 ctime_ns=node.ctime_ns, link=link)


class BtrfsVolume(Volume):
    type_name = "btrfs"

    def __init__(self, disk, name, source):
        reader = _dissect()
        if reader is None:
            raise RuntimeError(MISSING)
        super().__init__(disk, name)
        self.fobj = FileObject(source, disk.errors)
        self.fs = disk.call(lambda: reader(self.fobj))
        top = disk.call(lambda: self.fs.open_subvolume(5))
        self.root_addr = (5, top.root.inum)

    def _node(self, addr):
        return self.fs.open_subvolume(addr[0]).inode(addr[1])

    def root(self):
        return self.disk.call(lambda: _entry(self._node(self.root_addr), b""))

    def list_dir(self, addr):
        def work():
            return [_entry(node, as_bytes(name)) for name, node in self._node(addr).iterdir()
                    if name not in (".", "..")]
        return self.disk.call(work)

    def open_file(self, addr):
        return self.disk.call(lambda: self._node(addr).open())

    def read_file(self, f, offset, length, size):
        end = min(offset + length, size)
        if offset >= end:
            return b""

        def work():
            f.seek(offset)
            return f.read(end - offset)
        data = self.disk.call(work)
        if len(data) != end - offset:
            raise ReadFailed(OSError(5, f"short read of {end - offset} bytes at {offset}: got {len(data)}"))
        return data
