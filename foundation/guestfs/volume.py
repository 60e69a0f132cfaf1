"""What every guest file system looks like to the tree, diff and find: one interface.

A `Volume` has a `name` ("p1", "p3/<vg>/<lv>", "" for a bare disk), a
`type_name` ("ext4", "xfs", "btrfs", "luks2", ...), an `encrypted` flag,
`replayed` (its journal held committed transactions, replayed in memory)
and `unreplayed` (it held some the guest would replay, and they are not:
an XFS log, or a journal that cannot be replayed), and four operations on opaque addresses: `root()`,
`list_dir(addr)`, `open_file(addr)`, `read_file(f, offset, length, size)`.
Each reader (tsk.py, xfs.py, btrfs.py) maps its own inodes to `Entry`, so
callers never see which library read a file.
"""

import stat


class Entry:
    """One directory entry inside a guest file system, with its attributes."""

    __slots__ = ("name", "addr", "mode", "size", "uid", "gid", "nlink",
                 "atime_ns", "mtime_ns", "ctime_ns", "link")

    def __init__(self, name=b"", addr=None, mode=stat.S_IFDIR | 0o555, size=0, uid=0, gid=0, nlink=1,
                 atime_ns=0, mtime_ns=0, ctime_ns=0, link=None):
        self.name, self.addr, self.mode = name, addr, mode
        self.uid, self.gid, self.nlink = uid, gid, max(int(nlink or 1), 1)
        self.atime_ns, self.mtime_ns, self.ctime_ns = atime_ns, mtime_ns, ctime_ns
        self.link = link
        if stat.S_ISDIR(mode):
            size = size or 4096
        if link is not None:
            size = len(link)
        self.size = size

    @property
    def is_dir(self):
        return stat.S_ISDIR(self.mode)


def as_bytes(s):
    return s.encode("utf-8", "surrogateescape") if isinstance(s, str) else s


class Volume:
    """One file system of a disk (see the module docstring); subclasses read it."""

    type_name = "?"
    encrypted = False
    replayed = False
    unreplayed = False
    root_addr = None

    def __init__(self, disk, name):
        self.disk, self.name = disk, name

    def root(self):
        raise NotImplementedError

    def list_dir(self, addr):
        raise NotImplementedError

    def open_file(self, addr):
        raise NotImplementedError

    def read_file(self, f, offset, length, size):
        raise NotImplementedError


class Encrypted(Volume):
    """A LUKS container: named, never opened. No key is asked for, stored or guessed."""

    encrypted = True

    def __init__(self, disk, name, version):
        super().__init__(disk, name)
        self.type_name = f"luks{version}"
        self.root_addr = 0

    def root(self):
        return Entry(addr=0)

    def list_dir(self, addr):
        return []

    def open_file(self, addr):
        raise OSError(13, f"{self.name} is encrypted ({self.type_name})")
