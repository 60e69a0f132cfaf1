"""The files inside an archived disk, read with The Sleuth Kit from any byte source.

pytsk3 reads through an `Img_Info` subclass whose `read` we supply, so a
disk is interpreted straight from the archive: no loop device, no kernel
file-system driver, nothing ever written. The partition table (MBR with
logical partitions, GPT) is read with `Volume_Info`; each partition that
holds a file system TSK knows (ext2/3/4, FAT12/16/32, exFAT, NTFS, HFS+,
ISO 9660, ...) is a `Volume`. A disk with no partition table but a file
system at offset 0 has one volume, named "".

Never wrong data: TSK sometimes swallows a failed read and carries on
with what it has. So the byte source records every failure (and answers
TSK with an empty read, which TSK treats as an error), and each TSK call
is wrapped by `DiskFiles.call`, which raises the recorded error after the
call even if TSK returned normally. Callers map that to EIO. The one
failure forgiven is TSK's 64 KiB cache fill when TSK's immediate retry of
just the bytes it needs succeeds: one damaged block then fails only the
reads that touch it.
"""

import collections
import logging
import stat
import threading
import traceback

import pytsk3

log = logging.getLogger(__name__)

CHUNK = 64 << 10          # reads from TSK are served from 64 KiB aligned chunks
CACHE_CHUNKS = 256        # per disk: 16 MiB of metadata and small-file blocks

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


def scrub(exc):
    """Drop the frames an exception chain holds, by refcount, now.

    A store read that fails can leave memoryviews exported to cffi in its
    frames; if the cyclic GC collects them later it can crash the process
    (seen with foundation.store: "memoryview has 1 exported buffer", then
    SIGSEGV). Clearing the frames at once frees them in a safe order.
    """
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        traceback.clear_frames(exc.__traceback__)
        exc.__traceback__ = None
        exc = exc.__cause__ or exc.__context__
    return None


class ReadFailed(Exception):
    """A read of the archived disk failed under TSK; `cause` is the original error."""

    def __init__(self, cause):
        super().__init__(str(cause))
        self.cause = cause


class SourceImg(pytsk3.Img_Info):
    """A TSK image over `source.read(offset, length)` / `source.size`, with a chunk cache."""

    def __init__(self, source):
        self.source = source
        self.size = source.size
        self.errors = []            # (start, end, exception) of failed reads during a call
        self.just_failed = False
        self.cache = collections.OrderedDict()
        super().__init__(url="", type=pytsk3.TSK_IMG_TYPE_EXTERNAL)

    def get_size(self):
        return self.size

    def close(self):
        pass

    def read(self, offset, length):
        just_failed, self.just_failed = self.just_failed, False
        try:
            data = self._read(offset, length)
        except Exception as e:
            # Recorded, so the TSK call fails afterwards even if TSK carries on.
            # Not raised: pytsk3 would keep the exception pending and fail the
            # call even after TSK's own retry succeeded. An empty read is an
            # error to TSK.
            scrub(e)
            self.errors.append((offset, offset + length, e))
            self.just_failed = True
            return b""
        if just_failed:
            # TSK fills its 64 KiB cache with one read and, when that fails,
            # retries just the bytes it needs. A retry that succeeds right
            # after, inside the failed range, is all TSK uses: forgive that one.
            f0, f1, _ = self.errors[-1]
            if f0 <= offset and offset + length <= f1:
                self.errors.pop()
        return data

    def _read(self, offset, length):
        end = min(offset + length, self.size)
        if offset >= end:
            return b""
        first, last = offset // CHUNK, (end - 1) // CHUNK
        try:
            if first == last:
                c = self._chunk(first)
                return c[offset - first * CHUNK:end - first * CHUNK]
            parts = [self._chunk(i) for i in range(first, last + 1)]
        except Exception as e:
            # A damaged block somewhere in the chunk: read just what was asked,
            # so one bad block fails only the reads that touch it.
            scrub(e)
            del e
            return self.source.read(offset, end - offset)
        buf = b"".join(parts)
        return buf[offset - first * CHUNK:end - first * CHUNK]

    def _chunk(self, i):
        c = self.cache.get(i)
        if c is not None:
            self.cache.move_to_end(i)
            return c
        off = i * CHUNK
        c = self.source.read(off, min(CHUNK, self.size - off))
        self.cache[i] = c
        if len(self.cache) > CACHE_CHUNKS:
            self.cache.popitem(last=False)
        return c


class Entry:
    """One directory entry inside a guest file system, with its attributes."""

    __slots__ = ("name", "addr", "mode", "size", "uid", "gid", "nlink",
                 "atime_ns", "mtime_ns", "ctime_ns", "link")

    @classmethod
    def from_meta(cls, name, meta, fs_type):
        e = cls()
        e.name = name
        e.addr = meta.addr
        ftype = _S_TYPE.get(meta.type, stat.S_IFREG)
        perm = int(meta.mode) & 0o7777
        if fs_type in _FAT_TYPES or fs_type in _NTFS_TYPES:
            # No POSIX owners or modes there (TSK invents 0777 and odd uids):
            # show them as root's, readable by all, as a read-only mount would.
            perm = 0o555 if ftype == stat.S_IFDIR else 0o444
        e.mode = ftype | perm
        e.size = int(meta.size) if ftype != stat.S_IFDIR else int(meta.size or 4096)
        e.uid, e.gid = int(meta.uid), int(meta.gid)
        if fs_type in _FAT_TYPES or fs_type in _NTFS_TYPES:
            e.uid = e.gid = 0
        e.nlink = max(int(meta.nlink or 1), 1)
        e.mtime_ns = _ns(meta.mtime, meta.mtime_nano)
        e.atime_ns = _ns(meta.atime, meta.atime_nano)
        ct = meta.ctime or meta.mtime
        e.ctime_ns = _ns(ct, meta.ctime_nano if meta.ctime else meta.mtime_nano)
        e.link = None
        if ftype == stat.S_IFLNK:
            e.link = meta.link or b""
            if isinstance(e.link, str):
                e.link = e.link.encode("utf-8", "surrogateescape")
            e.size = len(e.link)
        return e

    @property
    def is_dir(self):
        return stat.S_ISDIR(self.mode)


def _ns(sec, nano):
    return int(sec or 0) * 1_000_000_000 + int(nano or 0)


class Volume:
    """One file system inside a disk: `name` is "p1", "p5", ... or "" for a whole disk."""

    def __init__(self, disk, name, offset, fs):
        self.disk, self.name, self.offset, self.fs = disk, name, offset, fs
        self.ftype = fs.info.ftype
        self.root_addr = fs.info.root_inum
        self.first_virtual = None
        if self.ftype in _FAT_TYPES:
            # TSK appends virtual $MBR, $FAT1, $FAT2 and $OrphanFiles after the real inodes.
            self.first_virtual = fs.info.last_inum - 3

    @property
    def type_name(self):
        for n in dir(pytsk3):
            if n.startswith("TSK_FS_TYPE_") and not n.endswith(("_DETECT", "_ENUM")) and getattr(pytsk3, n) == self.ftype:
                return n[len("TSK_FS_TYPE_"):].lower()
        return str(self.ftype)

    def root(self):
        return self.disk.call(lambda: Entry.from_meta(b"", self.fs.open_meta(inode=self.root_addr).info.meta, self.ftype))

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
                out.append(Entry.from_meta(name, meta, self.ftype))
            return out
        return self.disk.call(work)

    def _hidden(self, parent, name, meta):
        if self.ftype in _NTFS_TYPES:
            # NTFS metadata files ($MFT, $Bitmap, $Extend, ...) live in MFT records 0-15.
            return parent == self.root_addr and name.startswith(b"$") and meta.addr < 16
        if self.ftype in _FAT_TYPES:
            if self.first_virtual is not None and meta.addr >= self.first_virtual:
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


class DiskFiles:
    """The partitions and file systems of one archived disk (opened lazily, read-only)."""

    def __init__(self, source, label=""):
        self.label = label
        self.img = SourceImg(source)
        self.lock = threading.RLock()
        self._volumes = None

    def call(self, fn):
        """Run a TSK operation; fail it if any underlying read failed, even if TSK went on."""
        with self.lock:
            self.img.errors.clear()
            self.img.just_failed = False
            try:
                result = fn()
            except Exception as e:
                if self.img.errors:
                    raise ReadFailed(self.img.errors[0][2]) from e
                raise
            finally:
                errs = list(self.img.errors)
                self.img.errors.clear()
            if errs:
                raise ReadFailed(errs[0][2])
            return result

    def volumes(self):
        """{name: Volume}: "p1", "p2", ... by guest partition number, or {"": Volume} for a bare file system."""
        if self._volumes is None:
            self._volumes = self.call(self._probe)
        return self._volumes

    def _probe(self):
        vols = {}
        try:
            vs = pytsk3.Volume_Info(self.img)
        except (OSError, IOError, RuntimeError):
            vs = None
        if self.img.errors:
            raise ReadFailed(self.img.errors[0][2])
        if vs is not None:
            bs = vs.info.block_size
            dos = vs.info.vstype == pytsk3.TSK_VS_TYPE_DOS
            logical = 4
            for p in vs:
                if not int(p.flags) & int(pytsk3.TSK_VS_PART_FLAG_ALLOC):
                    continue
                if dos and p.table_num > 0:
                    logical += 1
                    num = logical
                else:
                    num = p.slot_num + 1
                name = f"p{num}"
                fs = self._open_fs(p.start * bs)
                if fs is not None:
                    vols[name] = Volume(self, name, p.start * bs, fs)
        if not vols:
            fs = self._open_fs(0)
            if fs is not None:
                vols[""] = Volume(self, "", 0, fs)
        return vols

    def _open_fs(self, offset):
        try:
            return pytsk3.FS_Info(self.img, offset=offset)
        except (OSError, IOError, RuntimeError):
            if self.img.errors:
                raise ReadFailed(self.img.errors[0][2]) from None
            return None
