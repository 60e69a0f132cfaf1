"""The files inside an archived disk: the names the tree (and diff, find) import.

The readers live in foundation.guestfs (partitions, LVM, LUKS, XFS,
btrfs, ext/FAT/NTFS through TSK); this module keeps the interface the
/snapshot tree was built on: `DiskFiles(source, label)`, `.volumes()`,
`DiskFiles.call`, `Entry`, `ReadFailed`, `scrub`.
"""

from foundation.guestfs.sources import CHUNK, ReadFailed, SourceImg, scrub
from foundation.guestfs.disk import DiskFiles
from foundation.guestfs.tsk import TskVolume
from foundation.guestfs.volume import Entry, Volume

__all__ = ["CHUNK", "DiskFiles", "Entry", "ReadFailed", "SourceImg", "TskVolume", "Volume", "scrub"]
