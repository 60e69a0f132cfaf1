"""XFS (v4 and v5), read by libfsxfs (pyfsxfs, LGPL-3.0-or-later).

TSK cannot open XFS at all; libfsxfs reads it from a Python file object
over the archived bytes. Addresses are XFS inode numbers; owners, modes,
nanosecond times, symlink targets and link counts come from the inode.
libfsxfs does not replay the XFS log: a crash-consistent day is shown as
the disk lies (docs/design.md).
"""

import stat

import pyfsxfs

from foundation.guestfs.bytes import FileObject, ReadFailed
from foundation.guestfs.volume import Entry, Volume, as_bytes


def _entry(fe, name):
    mode = fe.file_mode
    link = as_bytes(fe.symbolic_link_target or "") if stat.S_ISLNK(mode) else None
    return Entry(name=name, addr=fe.inode_number, mode=mode, size=fe.size,
                 uid=fe.owner_identifier, gid=fe.group_identifier, nlink=fe.number_of_links,
                 atime_ns=fe.get_access_time_as_integer(), mtime_ns=fe.get_modification_time_as_integer(),
                 ctime_ns=fe.get_inode_change_time_as_integer(), link=link)


class XfsVolume(Volume):
    type_name = "xfs"

    def __init__(self, disk, name, source):
        super().__init__(disk, name)
        self.fobj = FileObject(source, disk.errors)
        self.fs = pyfsxfs.volume()
        disk.call(lambda: self.fs.open_file_object(self.fobj))
        self.root_addr = disk.call(lambda: self.fs.get_root_directory().inode_number)

    def root(self):
        return self.disk.call(lambda: _entry(self.fs.get_file_entry_by_inode(self.root_addr), b""))

    def list_dir(self, addr):
        def work():
            d = self.fs.get_file_entry_by_inode(addr)
            return [_entry(fe, as_bytes(fe.name)) for fe in d.sub_file_entries]
        return self.disk.call(work)

    def open_file(self, addr):
        return self.disk.call(lambda: self.fs.get_file_entry_by_inode(addr))

    def read_file(self, f, offset, length, size):
        end = min(offset + length, size)
        if offset >= end:
            return b""
        data = self.disk.call(lambda: f.read_buffer_at_offset(end - offset, offset))
        if len(data) != end - offset:
            raise ReadFailed(OSError(5, f"short read of {end - offset} bytes at {offset}: got {len(data)}"))
        return data
