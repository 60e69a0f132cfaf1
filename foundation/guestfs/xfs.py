"""XFS (v4 and v5), read by libfsxfs (pyfsxfs, LGPL-3.0-or-later).

TSK cannot open XFS at all; libfsxfs reads it from a Python file object
over the archived bytes. Addresses are XFS inode numbers; owners, modes,
nanosecond times, symlink targets and link counts come from the inode.
libfsxfs does not replay the XFS log, so a dirty log's committed
transactions are replayed in memory first (xfslog.py) and libfsxfs reads
the day through that overlay; a log that cannot be replayed is one log
line and the disk as it lies, marked `unreplayed`. libfsxfs cannot return
a name that is not UTF-8: such entries are left out, with one log line
per directory.
"""

import logging
import stat
import struct

try:
    import pyfsxfs
except ImportError:          # an install from before XFS was read: one log line per XFS, not a broken tree
    pyfsxfs = None

from foundation.guestfs import xfslog
from foundation.guestfs.sources import FileObject, Overlay, ReadFailed, scrub
from foundation.guestfs.volume import Entry, Volume, as_bytes

log = logging.getLogger(__name__)


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
        if pyfsxfs is None:
            raise RuntimeError("XFS needs libfsxfs-python: pip install 'foundation[fuse]'")
        super().__init__(disk, name)
        self.warned = set()
        self._open(source)          # as the disk holds it: a volume libfsxfs cannot read fails here
        try:
            blocks = disk.call(lambda: xfslog.replay(source.read, source.read(0, 512)))
            if blocks:
                bs, = struct.unpack_from(">I", disk.call(lambda: source.read(0, 8)), 4)
                self._open(Overlay(source, blocks, bs))
                self.replayed = True
        except Exception as e:
            why = (str(e.cause if isinstance(e, ReadFailed) else e) or type(e).__name__).splitlines()[0]
            scrub(e)
            self.unreplayed = True
            disk._unreplayed(name, "xfs", f"cannot replay the log: {why}")

    def _open(self, source):
        fobj = FileObject(source, self.disk.errors)
        fs = pyfsxfs.volume()
        self.disk.call(lambda: fs.open_file_object(fobj))
        root = self.disk.call(lambda: fs.get_root_directory().inode_number)
        self.fobj, self.fs, self.root_addr = fobj, fs, root

    def root(self):
        return self.disk.call(lambda: _entry(self.fs.get_file_entry_by_inode(self.root_addr), b""))

    def list_dir(self, addr):
        def work():
            d = self.fs.get_file_entry_by_inode(addr)
            out, bad = [], 0
            for fe in d.sub_file_entries:
                try:
                    name = fe.name
                except OSError:
                    bad += 1            # libfsxfs cannot return a name that is not UTF-8
                    continue
                out.append(_entry(fe, as_bytes(name)))
            return out, bad
        out, bad = self.disk.call(work)
        if bad and addr not in self.warned:
            self.warned.add(addr)
            log.warning("%s/%s: directory inode %d: %d names are not UTF-8, which libfsxfs does not "
                        "return; those entries are not shown", self.disk.label, self.name, addr, bad)
        return out

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
