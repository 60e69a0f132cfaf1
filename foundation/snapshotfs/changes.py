"""What changed inside a guest's file systems between two archived days.

Two image trees of the same disk share every subtree whose blocks did not
change, and a shared subtree has the same ref in both. So the changed byte
ranges of a disk come from walking the two trees together and descending
only where refs differ: a day that rewrote 60 MB of a 20 GB disk reads a
few hundred tree nodes, not the disk. The file systems are then walked
with the same readers as the /snapshot tree (volumes.py) and each file is
judged exactly: different metadata or size is a change; equal metadata
with the same data extents, none of them in a changed range, is the same
content without reading it; anything else (extents moved, touched by a
changed range, resident data, a reader that cannot tell extents) is
decided by comparing the two contents byte for byte. A modified file is
never reported unchanged, whatever its mtime says.

Without trees (loose image files) every range counts as changed: the
result is the same, only slower.
"""

import bisect
import stat
from dataclasses import dataclass

import pytsk3

from foundation.catalog import format_size as human
from foundation.catalog import format_time
from foundation.errors import DataCorrupt, FilesUnreadable
from foundation.image import ImageReader
from foundation.guestfs.sources import Overlay, Slice
from foundation.snapshotfs.treediff import _merge, changed_ranges  # noqa: F401 (imported from here too)
from foundation.snapshotfs.volumes import DiskFiles, ReadFailed, scrub

READ = 1 << 20                     # bytes per read when contents are compared
_DATA_TYPES = {pytsk3.TSK_FS_ATTR_TYPE_DEFAULT, pytsk3.TSK_FS_ATTR_TYPE_NTFS_DATA}
_PLAIN = int(pytsk3.TSK_FS_ATTR_NONRES)
_ODD = int(pytsk3.TSK_FS_ATTR_RES) | int(pytsk3.TSK_FS_ATTR_COMP) | int(pytsk3.TSK_FS_ATTR_ENC)


class Ranges:
    """A sorted set of disk byte ranges; None means every byte may have changed."""

    def __init__(self, ranges):
        self.all = ranges is None
        self.starts = [o for o, _ in ranges or ()]
        self.ends = [o + n for o, n in ranges or ()]

    def pieces(self, lo, hi):
        """The parts of [lo, hi) inside the set, as (start, end) pairs."""
        if self.all:
            return [(lo, hi)]
        i = max(0, bisect.bisect_right(self.starts, lo) - 1)
        out = []
        while i < len(self.starts) and self.starts[i] < hi:
            a, b = max(lo, self.starts[i]), min(hi, self.ends[i])
            if a < b:
                out.append((a, b))
            i += 1
        return out


# ---- one disk of one day ------------------------------------------------------
class TreeSource:
    """An archived disk as a byte source (reads past the end are short, as a file's)."""

    def __init__(self, store, entry, record=False, readahead=8 << 20):
        self.r = ImageReader(store, entry.root, readahead=readahead)
        self.size = entry.size
        self.seen = [] if record else None      # with `record`: every (offset, length) read

    def read(self, offset, length):
        end = min(offset + length, self.size)
        if self.seen is not None and offset < end:
            self.seen.append((offset, end - offset))
        return self.r.read(offset, end - offset) if offset < end else b""


def label(snap):
    """NAME@TIME, as `restore` takes it."""
    return f"{snap.name}@{format_time(snap.time)}"


class Side:
    """One archived disk of one day: its byte source and its file systems."""

    def __init__(self, source, label):
        self.source = source
        self.label = label
        self.files = DiskFiles(source, label=label)
        self.dirs = {}              # (volume, dir addr) -> entries; one day is walked once
        self.runs = {}              # (volume, addr) -> extents
        self.own = {}               # volume name -> layout (see layout()) or None

    def list_dir(self, vol, addr):
        key = (vol.name, addr)
        if key not in self.dirs:
            self.dirs[key] = vol.list_dir(addr)
        return self.dirs[key]

    def volumes(self):
        try:
            return self.files.volumes()
        except (ReadFailed, DataCorrupt) as e:
            raise unreadable(self.label, e) from None

    def extents(self, vol, addr):
        key = (vol.name, addr)
        if key not in self.runs:
            self.runs[key] = self._extents(vol, addr)
        return self.runs[key]

    def layout(self, vol):
        """Where a TSK file system's blocks lie on this disk, or None when that is not known.

        -> (FS_Info, disk offset of its block 0, {block: bytes} its journal
        replay put over the disk's own bytes). Block numbers mean disk bytes
        only for a file system read straight from a slice of this disk (a
        partition, or the bare disk), never one inside a container (LVM) or
        read by another library: those are compared by content.
        """
        if vol.name not in self.own:
            self.own[vol.name] = None
            fs, img = getattr(vol, "fs", None), getattr(vol, "img", None)
            src = getattr(img, "source", None)
            overlay = {}
            if isinstance(src, Overlay):
                overlay, src = src.blocks, src.base
            disk = getattr(self.files, "bytes", None)
            if isinstance(fs, pytsk3.FS_Info) and disk is not None and not (
                    fs.info.block_pre_size or fs.info.block_post_size):
                if src is disk:
                    self.own[vol.name] = (fs, 0, overlay)
                elif isinstance(src, Slice) and src.base is disk:
                    self.own[vol.name] = (fs, src.offset, overlay)
        return self.own[vol.name]

    def span(self, vol):
        """(first, end) disk bytes of the file system, or None if unknown."""
        t = self.layout(vol)
        return None if t is None else (t[1], t[1] + int(t[0].info.block_count) * int(t[0].info.block_size))

    def _extents(self, vol, addr):
        """Byte runs [(offset in the file, offset on the disk, length, TSK flags)] of a file's data, or None.

        None when the data is not simply blocks on this disk (resident,
        compressed, encrypted) or when the volume's layout is unknown: then
        only comparing contents is exact.
        """
        t = self.layout(vol)
        if t is None:
            return None
        fs, base, _ = t
        bsz = int(fs.info.block_size)
        f = self.files.call(lambda: fs.open_meta(inode=addr))

        def runs():
            out = []
            for attr in f:
                info = attr.info
                if int(info.type) not in _DATA_TYPES:
                    continue
                if int(info.flags) & _ODD or not int(info.flags) & _PLAIN:
                    return None
                for r in attr:
                    out.append((int(r.offset) * bsz, base + int(r.addr) * bsz, int(r.len) * bsz, int(r.flags)))
            return out

        return self.files.call(runs)


def replayed_differences(la, lb):
    """Disk ranges of the blocks the two days' journal replays put differently over the disk."""
    (fs, off, oa), (_, _, ob) = la, lb
    bs = int(fs.info.block_size)
    return [(off + n * bs, bs) for n in sorted(set(oa) | set(ob)) if oa.get(n) != ob.get(n)]


def unreadable(label, e):
    msg = str(e.cause if isinstance(e, ReadFailed) else e)
    scrub(e)
    return FilesUnreadable(label, msg)


@dataclass
class Change:
    """One difference: change is "added", "removed", "modified" or "type"."""

    disk: str
    partition: str
    path: str
    change: str
    before: object          # Entry or None
    after: object
    content: bool           # the bytes differ (or the entry came or went)
    volumes: tuple = (None, None)   # the Volumes before and after, to read the files

    def to_json(self):
        return {"disk": self.disk, "partition": self.partition, "path": self.path, "change": self.change,
                "size_before": size_of(self.before), "size_after": size_of(self.after),
                "type_before": kind_of(self.before), "type_after": kind_of(self.after),
                "content": self.content}


def size_of(e):
    return None if e is None else (0 if e.is_dir else e.size)


def kind_of(e):
    if e is None:
        return None
    m = e.mode
    return ("dir" if stat.S_ISDIR(m) else "file" if stat.S_ISREG(m) else "symlink" if stat.S_ISLNK(m)
            else "other")


def path_text(parts):
    return "/" + "/".join(p.decode("utf-8", "backslashreplace") for p in parts)


# ---- comparing two days ---------------------------------------------------------
def snapshot_changes(source_of, a, b, disk, store=None, sides=None):
    """[Change] of one disk from snapshot `a` (None: an empty disk) to snapshot `b`.

    source_of(snapshot, disk) gives a disk's byte source; with `store`, the
    snapshots' disk entries carry tree roots there and only changed
    ranges are looked at. `sides`, a dict kept by the caller, lends one
    day's walk to the next comparison. Raises FilesUnreadable.
    """
    sides = {} if sides is None else sides

    def side(s):
        if (s.id, disk) not in sides:
            sides[(s.id, disk)] = Side(source_of(s, disk), f"{label(s)} disk {disk}")
        return sides[(s.id, disk)]

    ea, eb = a.disks.get(disk) if a else None, b.disks.get(disk)
    sa = side(a) if ea else None
    sb = side(b) if eb else None
    ranges = None
    if store is not None and ea is not None and eb is not None:
        ranges = changed_ranges(store, ea.root, eb.root)
    return list(compare_disks(sa, sb, ranges, disk))


def compare_disks(a, b, changed, disk):
    """Yield a Change for every difference between Sides `a` (before) and `b` (after).

    `changed`: the disk byte ranges that may differ (list), or None for
    unknown. A file system on the same span of the disk, with no changed
    range inside it, is not walked at all. Raises FilesUnreadable.
    """
    rng = Ranges(changed)
    va = a.volumes() if a is not None else {}
    vb = b.volumes() if b is not None else {}
    if b is not None:
        # A damaged file system is not seen at all: never take that for every file removed.
        # Only a volume no longer there at all (its partition deleted, made swap) took its files.
        failed = getattr(b.files, "failed", {})
        lost = [n for n in sorted(set(va) - set(vb), key=_part_key)
                if any(p in failed for p in _prefixes(n)) or (n == "" and not vb)]
        if lost:
            why = "".join(f" ({failed[p]})" for n in lost for p in _prefixes(n) if p in failed)
            what = ", ".join("the disk" if not n else f"volume {n}" if "/" in n else f"partition {n}" for n in lost)
            raise FilesUnreadable(b.label, f"{what} held a file system the day before and none that can be read "
                                           f"now{why}")
    for name in sorted(set(va) | set(vb), key=_part_key):
        x, y = va.get(name), vb.get(name)
        vrng = rng
        if x is not None and y is not None and changed is not None:
            la, lb = a.layout(x), b.layout(y)
            if la is not None and lb is not None:
                extra = replayed_differences(la, lb)
                span = a.span(x)
                if span == b.span(y) and not extra and not rng.pieces(*span):
                    continue            # not one of its bytes changed, so none of its files did
                if extra:
                    vrng = Ranges(_merge(list(changed) + extra))
        try:
            yield from _compare_dir(a, x, b, y, vrng, disk, name)
        except (ReadFailed, DataCorrupt) as e:
            label = (b or a).label + (f" partition {name}" if name else "")
            raise unreadable(label, e) from None


def _prefixes(name):
    """"p3/vg/lv" -> ["p3", "p3/vg", "p3/vg/lv"]: the containers a volume is found in, and itself."""
    parts = name.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]


def _part_key(name):
    head = name.split("/")[0]
    return (0, int(head[1:]), name) if head[1:].isdigit() else (1, 0, name)


def _compare_dir(a, x, b, y, rng, disk, part):
    """Walk volumes x (of side a) and y (of side b) together, depth first, in name order."""
    stack = [((), x.root().addr if x is not None else None, y.root().addr if y is not None else None)]
    while stack:
        parts, da, db = stack.pop()
        ea = {e.name: e for e in a.list_dir(x, da)} if da is not None else {}
        eb = {e.name: e for e in b.list_dir(y, db)} if db is not None else {}
        sub = []
        for n in sorted(set(ea) | set(eb)):
            p, q = ea.get(n), eb.get(n)
            path = parts + (n,)
            c, content = _judge(a, x, p, b, y, q, rng)
            if c is not None:
                yield Change(disk, part, path_text(path), c, p, q, content, (x, y))
            if (p is not None and p.is_dir) or (q is not None and q.is_dir):
                sub.append((path, p.addr if p is not None and p.is_dir else None,
                            q.addr if q is not None and q.is_dir else None))
        stack.extend(reversed(sub))


def _judge(a, x, p, b, y, q, rng):
    """-> (change or None, whether the content differs). atime and ctime are not compared."""
    if p is None:
        return "added", True
    if q is None:
        return "removed", True
    if stat.S_IFMT(p.mode) != stat.S_IFMT(q.mode):
        return "type", True
    if p.is_dir:
        return None, False          # its entries speak for it
    content = _content_differs(a, x, p, b, y, q, rng)
    if content or (p.mode, p.uid, p.gid, p.mtime_ns) != (q.mode, q.uid, q.gid, q.mtime_ns):
        return "modified", content
    return None, False


def _content_differs(a, x, p, b, y, q, rng):
    """Whether two regular files' bytes differ; reads them only when the extents cannot tell."""
    if not stat.S_ISREG(q.mode) or not stat.S_ISREG(p.mode):
        return p.link != q.link
    if p.size != q.size:
        return True
    if q.size == 0:
        return False
    ra, rb = a.extents(x, p.addr), b.extents(y, q.addr)
    if ra is None or ra != rb:
        return not same_bytes(x, p, y, q)
    # Same blocks on both days: only the bytes in changed regions can differ.
    # (Sparse and filler runs, flags 1 and 2, hold no blocks: zeros on both days.)
    spans = [(f + lo - o, hi - lo) for f, o, n, fl in rb if not fl & 3 for lo, hi in rng.pieces(o, o + n)]
    return bool(spans) and not same_bytes(x, p, y, q, spans)


def same_bytes(x, p, y, q, spans=None):
    """Compare two files' contents (only the (offset, length) `spans`, if given), a megabyte at a time."""
    fa, fb = x.open_file(p.addr), y.open_file(q.addr)
    for start, n in spans or [(0, q.size)]:
        end = min(start + n, q.size)
        for off in range(start, end, READ):
            k = min(READ, end - off)
            if x.read_file(fa, off, k, p.size) != y.read_file(fb, off, k, q.size):
                return False
    return True


def find_entry(vol, path):
    """The Entry at absolute text path `path` in volume `vol`, or None."""
    addr, e = vol.root().addr, None
    for n in path.strip("/").split("/"):
        if not n:
            continue
        e = next((c for c in vol.list_dir(addr) if c.name.decode("utf-8", "backslashreplace") == n), None)
        if e is None:
            return None
        addr = e.addr
    return e


# ---- how a change reads ------------------------------------------------------------
MARK = {"added": "+", "removed": "-", "type": "T"}


def show_path(disk, partition, path):
    """vda/p1/etc/motd, or vda/etc/motd for a disk without a partition table (as in /snapshot)."""
    return f"{disk}/{partition}{path}" if partition else f"{disk}{path}"


def human_line(c):
    """One line as `restic diff` prints it: + added, - removed, M content, U metadata only, T type."""
    mark = ("M" if c.content else "U") if c.change == "modified" else MARK[c.change]
    j = c.to_json()
    if c.change in ("added", "removed"):
        what = human(j["size_after"] if c.change == "added" else j["size_before"])
    elif c.change == "type":
        what = f"{j['type_before']} -> {j['type_after']}"
    elif c.content:
        what = f"{human(j['size_before'])} -> {human(j['size_after'])}"
    else:
        what = "metadata only"
    slash = "/" if (c.after or c.before).is_dir else ""
    return f"{mark}  {show_path(c.disk, c.partition, c.path)}{slash}  ({what})"


def summary(changes):
    n = {k: sum(1 for c in changes if c.change == k) for k in ("added", "removed", "modified", "type")}
    grew = sum((size_of(c.after) or 0) - (size_of(c.before) or 0) for c in changes)
    return (f"{n['added']} added, {n['removed']} removed, {n['modified']} modified, "
            f"{n['type']} changed type; {'+' if grew >= 0 else '-'}{human(abs(grew))}")
