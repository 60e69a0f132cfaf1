"""One archived disk's layout, as the guest's installer made it: partitions, LVM, LUKS, swap.

The partition table (MBR with logical partitions, GPT) is read by TSK;
each partition, or the bare disk, is then recognised by its signature and
handed to one reader: LVM2 physical volumes to libvslvm (the metadata is
parsed, nothing is activated, the host's LVM never sees the group), whose
logical volumes are recognised in turn; XFS to libfsxfs; btrfs to Dissect
(optional); LUKS is named and never opened; swap is hidden; everything
else is tried with TSK (ext2/3/4, FAT, exFAT, NTFS), an ext file system
with its committed journal transactions replayed in memory first
(jbd2.py). A volume that cannot be opened is one log line naming the
disk, the partition and the reason; the rest of the disk is still shown.
"""

import logging
import struct
import threading

import pytsk3

try:
    import pyvslvm
except ImportError:          # an install from before LVM was read: one log line per PV, not a broken tree
    pyvslvm = None

from foundation.guestfs import btrfs, jbd2, tsk, xfs
from foundation.guestfs.sources import DiskBytes, FileObject, Lv, Overlay, ReadFailed, Slice, SourceImg, scrub
from foundation.guestfs.volume import Encrypted

log = logging.getLogger(__name__)

# Partition types that never hold a file system: not worth a log line.
_NOT_FS = ("extended", "bios boot", "unallocated", "safety table", "gpt header", "partition table")


def signature(src):
    """What a volume holds, from its magic numbers: a name, or None to let TSK try."""
    head = src.read(0, 4096)
    if head[:6] in (b"LUKS\xba\xbe", b"SKUL\xba\xbe"):
        return f"luks{struct.unpack('>H', head[6:8])[0]}"
    if head[512:520] == b"LABELONE" and head[536:544] == b"LVM2 001":
        return "lvm"
    if head[:4] == b"XFSB":
        return "xfs"
    if head[4086:4096] in (b"SWAPSPACE2", b"SWAP-SPACE"):
        return "swap"
    if src.read(0x10040, 8) == b"_BHRfS_M":
        return "btrfs"
    if head[1080:1082] == b"\x53\xef":
        return "ext"
    return None


def _reason(e):
    """One line from an error; of libyal's chain ("pyfsxfs_...: unable to open. libfsxfs_...: why."), the why."""
    msg = str(e) or type(e).__name__
    parts = msg.replace("\n", " ").split(". ")
    if len(parts) > 1 and parts[0].startswith("py"):
        return parts[1].rstrip(".")
    return parts[0] if len(parts[0]) > 20 else msg.replace("\n", " ")


class DiskFiles:
    """The volumes of one archived disk (opened lazily, read-only). `label` names it in log lines."""

    def __init__(self, source, label=""):
        self.label = label
        self.bytes = DiskBytes(source)
        self.errors = []             # (start, end, exception) of failed reads during a call
        self.img = SourceImg(self.bytes, self.errors)
        self.lock = threading.RLock()
        self._volumes = None
        self.failed = {}             # volume name -> reason it could not be opened
        self.keep = []               # libvslvm handles and their file objects, alive with the volumes

    def call(self, fn):
        """Run a reader's operation; fail it if any underlying read failed, even if it went on."""
        with self.lock:
            del self.errors[:]
            try:
                result = fn()
            except Exception as e:
                if self.errors:
                    raise ReadFailed(self.errors[0][2]) from e
                raise
            finally:
                errs = list(self.errors)
                del self.errors[:]
            if errs:
                raise ReadFailed(errs[0][2])
            return result

    def volumes(self):
        """{name: Volume}: "p1", "p3/<vg>/<lv>", ... or "" for a bare file system (see volume.py)."""
        if self._volumes is None:
            self._volumes = self._probe()
        return self._volumes

    def _probe(self):
        vols = {}
        parts = self.call(self._partitions)
        if parts is None:
            self._open("", self.bytes, vols, bare=True)
        else:
            for name, start, length, desc in parts:
                self._open(name, Slice(self.bytes, start, length), vols, desc=desc)
        return vols

    def _partitions(self):
        """[(name, offset, size, description)] by guest partition number, or None without a table."""
        try:
            vs = pytsk3.Volume_Info(self.img)
        except (OSError, IOError, RuntimeError):
            return None
        bs = vs.info.block_size
        dos = vs.info.vstype == pytsk3.TSK_VS_TYPE_DOS
        logical = 4
        out = []
        for p in vs:
            if not int(p.flags) & int(pytsk3.TSK_VS_PART_FLAG_ALLOC):
                continue
            if dos and p.table_num > 0:
                logical += 1
                num = logical
            else:
                num = p.slot_num + 1
            desc = p.desc.decode("utf-8", "replace") if isinstance(p.desc, bytes) else str(p.desc)
            out.append((f"p{num}", p.start * bs, p.len * bs, desc))
        return out

    def _open(self, name, src, vols, bare=False, desc=""):
        """Recognise what src holds and add its volume(s) to vols; failures are logged, not raised."""
        kind = None
        try:
            kind = self.call(lambda: signature(src))
            if kind == "swap":
                return
            if kind == "lvm":
                for lv_name, lv in self.call(lambda: self._lvs(src)):
                    self._open(f"{name}/{lv_name}".lstrip("/"), lv, vols)
                return
            if kind is not None and kind.startswith("luks"):
                vol = Encrypted(self, name, kind[4:])
            elif kind == "xfs":
                vol = xfs.XfsVolume(self, name, src)
            elif kind == "btrfs":
                vol = btrfs.BtrfsVolume(self, name, src)
            else:
                vol = self._open_tsk(name, src, ext=kind == "ext")
            if vol is None:
                if not bare and not any(w in desc.lower() for w in _NOT_FS):
                    # Often a BIOS boot or empty partition (GPT gives TSK names, not types): not a warning.
                    self._fail(name, kind, "no file system recognised", level=logging.INFO)
                return
            vol.root()                  # a root that cannot be read fails here, not in a listing
            vols[name] = vol
        except Exception as e:
            msg = _reason(e.cause if isinstance(e, ReadFailed) else e)
            scrub(e)
            self._fail(name, kind, msg)

    def _fail(self, name, kind, reason, level=logging.WARNING):
        what = f"{self.label}/{name}".rstrip("/")
        self.failed[name] = reason
        log.log(level, "cannot read %s%s: %s; the rest of the disk is shown", what,
                f" ({kind})" if kind else "", reason)

    def _lvs(self, src):
        """[(<vg>/<lv>, Lv source)] of the LVM2 physical volume src (one-PV groups only)."""
        if pyvslvm is None:
            raise RuntimeError("LVM needs libvslvm-python: pip install 'foundation[fuse]'")
        h = pyvslvm.handle()
        fobj = FileObject(src, self.errors)
        h.open_file_object(fobj)
        vg = h.get_volume_group()
        if vg.number_of_physical_volumes != 1:
            raise RuntimeError(f"volume group {vg.name} spans {vg.number_of_physical_volumes} physical "
                               f"volumes; only groups on one are read")
        h.open_physical_volume_files_as_file_objects([fobj])
        vg = h.get_volume_group()        # again: LVs of the group taken before the PV was opened cannot read
        self.keep += [h, fobj]
        return [(f"{vg.name}/{lv.name}", Lv(lv)) for lv in vg.logical_volumes]

    def _open_tsk(self, name, src, ext):
        img = SourceImg(src, self.errors)
        fs = self.call(lambda: tsk.open_fs(img))
        if fs is None:
            return None
        blocks = self._replay(name, fs, src) if ext else {}
        if not blocks:
            vol = tsk.TskVolume(self, name, fs, img)
            vol.unreplayed = blocks is None
            return vol
        img = SourceImg(Overlay(src, blocks, fs.info.block_size), self.errors)
        return tsk.TskVolume(self, name, self.call(lambda: tsk.open_fs(img)), img, replayed=True)

    def _replay(self, name, fs, src):
        """The blocks ext's journal would write at the guest's next mount ({} for none), or None
        when the journal cannot be replayed (logged)."""
        try:
            inum = jbd2.needs_replay(self.call(lambda: src.read(1024, 1024)))
            if inum is None:
                return {}
            bs = fs.info.block_size
            journal = self.call(lambda: fs.open_meta(inode=inum))
            n = int(journal.info.meta.size) // bs
            return jbd2.replay(lambda i: self.call(lambda: journal.read_random(i * bs, bs)), n)
        except Exception as e:
            msg = _reason(e.cause if isinstance(e, ReadFailed) else e)
            scrub(e)
            self._unreplayed(name, "ext", f"cannot replay the journal: {msg}")
            return None

    def _unreplayed(self, name, kind, why):
        what = f"{self.label}/{name}".rstrip("/")
        log.warning("%s (%s): %s; shown as the disk holds it", what, kind, why)
