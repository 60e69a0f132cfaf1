"""ext2/3/4, FAT, exFAT and NTFS, read by The Sleuth Kit (pytsk3).

TSK reads through a `SourceImg` whose reads we supply, so a file system is
interpreted straight from the archive. It sometimes swallows a failed read
and carries on; every TSK call therefore goes through `DiskFiles.call`,
which fails it if any read under it failed.
"""

import stat

import pytsk3

from foundation.guestfs.sources import ReadFailed
from foundation.guestfs.volume import Entry, Volume, as_bytes

# TSK meta types -> st_mode file type bits
_S_TYPE = {
    pytsk3.TSK_FS_META_TYPE_REG: stat.S_IFREG,
    pytsk3.TSK_FS_META_TYPE_DIR: stat.S_IFDIR,
    pytsk3.TSK_FS_META_TYPE_LNK: stat.S_IFLNK,
    pytsk3.TSK_FS_META_TYPE_FIFO: stat.S_IFIFO,
    pytsk3.TSK_FS_META_TYPE_CHR: stat.S_IFCHR,
    pytsk3.TSK_FS_META_TYPE_BLK: stat.S_IFBLK,
    pytsk3.TSK_FS_META_TYPE_SOCK: stat.S_IFSOCK,
}
_SKIP_NAME_TYPES = {pytsk3.TSK_FS_NAME_TYPE_VIRT, pytsk3.TSK_FS_NAME_TYPE_VIRT_DIR}
_NTFS_TYPES = {pytsk3.TSK_FS_TYPE_NTFS}
_FAT_TYPES = {pytsk3.TSK_FS_TYPE_FAT12, pytsk3.TSK_FS_TYPE_FAT16, pytsk3.TSK_FS_TYPE_FAT32,
              getattr(pytsk3, "TSK_FS_TYPE_EXFAT", -1)}
_EXFAT = getattr(pytsk3, "TSK_FS_TYPE_EXFAT", -1)
# TSK shows exFAT's allocation bitmap, up-case table, TexFAT and GUID entries as files at the root
_EXFAT_META = (b"$ALLOC_BITMAP", b"$UPCASE_TABLE", b"$TEX_FAT", b"$VOLUME_GUID")
_TYPE_NAMES = {getattr(pytsk3, n): n[len("TSK_FS_TYPE_"):].lower() for n in dir(pytsk3)
               if n.startswith("TSK_FS_TYPE_") and not n.endswith(("_DETECT", "_ENUM"))}


def _ns(sec, nano):
    return int(sec or 0) * 1_000_000_000 + int(nano or 0)


def entry(name, meta, fs_type):
    ftype = _S_TYPE.get(meta.type, stat.S_IFREG)
    uid, gid, perm = int(meta.uid), int(meta.gid), int(meta.mode) & 0o7777
    if fs_type in _FAT_TYPES or fs_type in _NTFS_TYPES:
        # No POSIX owners or modes there (TSK invents 0777 and odd uids):
        # show them as root's, readable by all, as a read-only mount would.
        perm = 0o555 if ftype == stat.S_IFDIR else 0o444
        uid = gid = 0
    link = None
    if ftype == stat.S_IFLNK:
        link = as_bytes(meta.link or b"")
    ct = meta.ctime or meta.mtime
    return Entry(name=name, addr=meta.addr, mode=ftype | perm, size=int(meta.size), uid=uid, gid=gid,
                 nlink=meta.nlink, atime_ns=_ns(meta.atime, meta.atime_nano),
                 mtime_ns=_ns(meta.mtime, meta.mtime_nano),
                 ctime_ns=_ns(ct, meta.ctime_nano if meta.ctime else meta.mtime_nano), link=link)


# The families asked for, in the order of TSK's own detection, which also
# tries YAFFS2: a flash file system no VM disk holds, whose probe reads ~500
# places over the first tens of MiB of a disk it does not find (on an
# archived disk, a cold record run decoded for each). As in TSK's detection,
# two families that both open the volume are no answer.
_FAMILIES = tuple(getattr(pytsk3, f"TSK_FS_TYPE_{n}_DETECT") for n in ("NTFS", "FAT", "EXT", "FFS", "HFS", "ISO9660"))


def open_fs(img):
    """A TSK FS_Info on img, or None when TSK recognises no file system there."""
    found = []
    for family in _FAMILIES:
        try:
            found.append(pytsk3.FS_Info(img, type=family))
        except (OSError, IOError, RuntimeError):
            pass
    if img.errors:
        raise ReadFailed(img.errors[0][2])
    return found[0] if len(found) == 1 else None


class TskVolume(Volume):
    """A file system TSK reads; addresses are TSK inode numbers."""

    def __init__(self, disk, name, fs, img, replayed=False):
        super().__init__(disk, name)
        self.fs, self.img, self.replayed = fs, img, replayed
        self.ftype = fs.info.ftype
        self.root_addr = fs.info.root_inum
        self.first_virtual = None
        if self.ftype in _FAT_TYPES:
            # TSK appends virtual $MBR, $FAT1, $FAT2 and $OrphanFiles after the real inodes.
            self.first_virtual = fs.info.last_inum - 3

    @property
    def type_name(self):
        return _TYPE_NAMES.get(self.ftype, str(self.ftype))

    def root(self):
        return self.disk.call(lambda: entry(b"", self.fs.open_meta(inode=self.root_addr).info.meta, self.ftype))

    def list_dir(self, addr):
        """The entries of directory inode `addr`, skipping ., .., deleted and TSK's virtual ones."""
        def work():
            out = []
            seen = set()
            for f in self.fs.open_dir(inode=addr):
                info = f.info
                n = info.name
                name = n.name
                if name in (b".", b"..") or not name:
                    continue
                if not int(n.flags) & int(pytsk3.TSK_FS_NAME_FLAG_ALLOC):
                    continue
                if n.type in _SKIP_NAME_TYPES:
                    continue
                meta = info.meta
                if meta is None:
                    continue
                if self._hidden(addr, name, meta):
                    continue
                if b"/" in name or name in seen:
                    continue
                seen.add(name)
                out.append(entry(name, meta, self.ftype))
            return out
        return self.disk.call(work)

    def _hidden(self, parent, name, meta):
        if self.ftype in _NTFS_TYPES:
            # NTFS metadata files ($MFT, $Bitmap, $Extend, ...) live in MFT records 0-15.
            return parent == self.root_addr and name.startswith(b"$") and meta.addr < 16
        if self.ftype in _FAT_TYPES:
            if self.first_virtual is not None and meta.addr >= self.first_virtual:
                return True
            if self.ftype == _EXFAT and parent == self.root_addr and name in _EXFAT_META:
                return True
            return name.endswith(b"(Volume Label Entry)")
        return False

    def open_file(self, addr):
        return self.disk.call(lambda: self.fs.open_meta(inode=addr))

    def read_file(self, f, offset, length, size):
        """Bytes [offset, offset+length) of open TSK file `f` of `size` bytes."""
        end = min(offset + length, size)
        if offset >= end:
            return b""
        data = self.disk.call(lambda: f.read_random(offset, end - offset))
        if len(data) != end - offset:
            raise ReadFailed(OSError(5, f"short read of {end - offset} bytes at {offset}: got {len(data)}"))
        return data
