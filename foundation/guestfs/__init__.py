"""The files inside every guest, as the guest saw them: one layer for the tree, diff and find.

Readers are well-kept libraries that take any byte source, chosen per
file system (docs/design.md, "Which library reads which file system"); nothing is
mounted on the host and nothing is written.

    sources.py  byte sources (disk cache, partition, LV, overlay) and the adapters readers take
    disk.py     DiskFiles: partitions, LVM (libvslvm), LUKS named, swap hidden; picks a reader
    volume.py   Volume and Entry: the one interface callers see
    tsk.py      ext2/3/4, FAT, exFAT, NTFS (pytsk3)
    jbd2.py     ext3/4 journal replay in memory: a crash-consistent day as the guest saw it
    xfs.py      XFS (libfsxfs)
    xfslog.py   XFS (v5) log replay in memory: what the guest would see after its own recovery
    btrfs.py    btrfs (dissect.btrfs, AGPL, optional extra)
"""

from foundation.guestfs.sources import ReadFailed, scrub
from foundation.guestfs.disk import DiskFiles
from foundation.guestfs.volume import Entry, Volume

__all__ = ["DiskFiles", "Entry", "ReadFailed", "Volume", "scrub"]
