"""The /snapshot tree as pyfuse3 operations: read-only, every day of every VM.

    /snapshot/.foundation                    marker: this is a Foundation tree
    /snapshot/latest/<vm> -> ../YYYY/MM/DD/HHMMSS/<vm>
    /snapshot/YYYY/MM/DD/<vm>/               that VM's newest snapshot that day
    /snapshot/YYYY/MM/DD/HHMMSS/<vm>/        the snapshot taken at that second
        vda.raw        the whole disk, raw, full logical size
        vda/           its files: p1/, p2/, ... per partition, p3/<vg>/<lv>/ per
                       LVM volume, p4.encrypted/ for LUKS (empty), or the file
                       system itself when the disk has no partition table
        domain.xml     the libvirt domain XML archived with it
        changes        the files changed since the VM's previous snapshot
        changes.json   the same, one JSON object per line (as `diff --json`)
        nvram.fd       its UEFI variables, when it has them
        snapshot.json  name, uuid, time, canonical path, disk sizes, volumes

Any date or HHMMSS that parses resolves by TimeLine's rule (see
timeindex.py) without being listed.

Inodes are allocated lazily and are a hash of (parent inode, name,
snapshot id), so a path keeps its inode for as long as it names the same
snapshot, even across remounts, and a day path that starts resolving to
a newer snapshot gets a new inode instead of changing under the kernel's
caches. A guest file with several hard links is one inode, a hash of
(snapshot, disk, volume, guest inode). Everything inside a snapshot is
immutable: long kernel cache timeouts and keep_cache; the top levels
change when a night is archived and time out after a second.

All archive and file-system work runs in one worker thread (a trio
capacity limiter of 1: the store and the readers are not assumed
thread-safe), so the event loop keeps answering cached lookups, and reads
of windows already decoded (rawstream.py), while a large read runs.
Any failure to read archived bytes is EIO with a log line naming the
path, the offset and the store's own description of the damage.
"""

import datetime as dt
import errno
import hashlib
import json
import logging
import os
import stat
import time

import pyfuse3
import trio

from foundation.errors import DataCorrupt, FilesUnreadable
from foundation.snapshotfs import MARKER
from foundation.snapshotfs import changes as ch
from foundation.snapshotfs import timeindex as ti
from foundation.snapshotfs import rawstream
from foundation.snapshotfs.rawstream import RawStream
from foundation.snapshotfs.volumes import DiskFiles, ReadFailed, scrub

log = logging.getLogger(__name__)

MARKER_TEXT = b"Foundation snapshot tree. Layout: docs/snapshot-tree.md\n"
TOP_TIMEOUT = 1.0          # top levels change when a night is archived
FIXED_TIMEOUT = 3600.0     # snapshot contents never change
READ_CHUNK = 64 << 10
MAX_READAHEAD = 8 << 20    # sequential reads grow their window up to this
META_FILES = (("domain.xml", "domain_xml"), ("nvram.fd", "nvram"))   # file name, Snapshot.meta key


def _ino(key):
    h = hashlib.blake2b(repr(key).encode("utf-8", "surrogateescape"), digest_size=8).digest()
    return (int.from_bytes(h, "big") >> 1) | 2     # never 0 or 1 (the root)


def _name(b):
    return b.decode("utf-8", "surrogateescape") if isinstance(b, bytes) else b


_TOP = ("root", "year", "month", "day", "time", "latest")     # kinds whose children change with new nights


def _vol_order(name):
    """Volumes in the guest's order: p2 before p10, then by name."""
    first, _, rest = name.partition("/")
    return (int(first[1:]) if first[:1] == "p" and first[1:].isdigit() else 1 << 30, first, rest)


def _ts_ns(t):
    return int(t.timestamp()) * 1_000_000_000


class Node:
    """An inode. `kind` picks the behaviour; other fields depend on it."""

    __slots__ = ("ino", "key", "kind", "path", "nlookup", "snap", "disk", "vol", "entry",
                 "data", "target", "day", "hhmmss", "year", "month", "mtime_ns", "files")

    def __init__(self, key, kind, path, **kw):
        self.key, self.kind, self.path = key, kind, path
        self.nlookup = 0
        for f in ("snap", "disk", "vol", "entry", "data", "target", "day", "hhmmss",
                  "year", "month", "files"):
            setattr(self, f, kw.get(f))
        self.mtime_ns = kw.get("mtime_ns", 0)


class ReadAhead:
    """Serves reads of one open file; sequential runs fetch a growing window in one go.

    The window doubles (64 KiB up to MAX_READAHEAD) while reads follow each
    other, so the layer below sees few large reads it can batch and sort by
    log address; a random read fetches only the 64 KiB chunk(s) it touches.
    """

    def __init__(self, read, size):
        self._read, self.size = read, size
        self.cur = (0, b"")          # (offset, bytes): replaced whole, never mutated
        self.next = None             # the window after cur, fetched ahead in the background
        self.pending = None          # (start, end, trio.Event) of a fetch ahead under way
        self.next_off = 0
        self.window = READ_CHUNK
        self.path = ""

    def cached(self, off, n):
        """The bytes if a buffer holds them all, else None (safe from any thread)."""
        end = min(off + n, self.size)
        for slot in (self.cur, self.next):
            if slot is None:
                continue
            b0, buf = slot
            if b0 <= off and end <= b0 + len(buf):
                if slot is not self.cur:
                    self.cur, self.next = slot, None
                self.next_off = end
                return buf[off - b0:end - b0]
        return None

    def ahead(self):
        """(start, length) of the window to fetch in the background now, or None.

        Only for a clearly sequential reader (the window has grown to its
        maximum) that has read past the middle of the current buffer.
        """
        b0, buf = self.cur
        b1 = b0 + len(buf)
        if self.pending or self.next or b1 >= self.size or self.window < MAX_READAHEAD:
            return None
        if self.next_off < b0 + len(buf) // 2 or self.next_off > b1:
            return None
        return b1, min(self.window, self.size - b1)

    def read(self, off, n):
        end = min(off + n, self.size)
        if off >= end:
            return b""
        b0, buf = self.cur
        b1 = b0 + len(buf)
        if b0 <= off and end <= b1:
            self.next_off = end
            return buf[off - b0:end - b0]
        if off == self.next_off or b0 <= off < b1:
            self.window = min(self.window * 2, MAX_READAHEAD)
        else:
            self.window = READ_CHUNK
        start = off - off % READ_CHUNK
        want = max(end - start, self.window)
        want += (-want) % READ_CHUNK
        want = min(want, self.size - start)
        try:
            data = self._read(start, want)
        except (ReadFailed, DataCorrupt) as e:
            if (start, want) == (off, end - off):
                raise
            scrub(e)
            # A damaged block inside the window but maybe not inside this read:
            # fail only a read that touches it.
            self.window = READ_CHUNK
            start, want = off, end - off
            data = self._read(start, want)
        if len(data) != want:
            raise ReadFailed(OSError(errno.EIO, f"short read of {want} bytes at {start}: got {len(data)}"))
        self.cur = (start, data)
        self.next_off = end
        return data[off - start:end - start]


def _guarded(fn, args):
    """(True, result) or (False, errno or message); no exception object leaves the thread."""
    try:
        return True, fn(*args)
    except pyfuse3.FUSEError as e:
        return False, e.errno
    except (ReadFailed, DataCorrupt) as e:
        msg = str(e.cause if isinstance(e, ReadFailed) else e)
        scrub(e)
        return False, msg
    except Exception as e:
        msg = f"unexpected {type(e).__name__}: {e}"
        log.debug("unexpected error", exc_info=True)
        scrub(e)
        return False, msg


class SnapshotFS(pyfuse3.Operations):
    """The operations of the /snapshot tree over an archive (see archive.py)."""

    enable_writeback_cache = False

    def __init__(self, archive, tz=None, raw_gid=0, raw_mode=0o440):
        super().__init__()
        self.archive = archive
        self._fresh = getattr(archive, "fresh", lambda: False)    # an archive that says when it last looked
        self.tz = tz
        self.raw_gid, self.raw_mode = raw_gid, raw_mode
        self.index = ti.TimeIndex(archive.snapshots(), tz)
        self.start_ns = time.time_ns()
        self.nodes = {}
        self.handles = {}
        self.next_fh = 1
        self.disks = {}             # (snap id, disk) -> DiskFiles
        self.limiter = trio.CapacityLimiter(1)
        self.nursery = None         # set by the server: runs fetches ahead
        root = Node(("root",), "root", "")
        root.ino = pyfuse3.ROOT_INODE
        root.nlookup = 1
        self.nodes[root.ino] = root

    # -- the inode table ------------------------------------------------------

    def _node(self, key, kind, path, **kw):
        ino = _ino(key)
        while True:
            n = self.nodes.get(ino)
            if n is None:
                n = Node(key, kind, path, **kw)
                n.ino = ino
                self.nodes[ino] = n
                return n
            if n.key == key:
                return n
            ino += 1                 # a hash collision: probe on

    def _get(self, ino):
        n = self.nodes.get(ino)
        if n is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return n

    async def _work(self, what, fn, *args):
        """Run blocking archive/TSK work in the worker thread; map read failures to EIO."""
        ok, value = await trio.to_thread.run_sync(_guarded, fn, args, limiter=self.limiter)
        if ok:
            return value
        if isinstance(value, int):
            raise pyfuse3.FUSEError(value)
        log.error("EIO: %s: %s", what, value)
        raise pyfuse3.FUSEError(errno.EIO)

    async def _attempt(self, fn, *args):
        """(True, result) or (False, why) of fn run in the worker thread; never raises a read failure."""
        return await trio.to_thread.run_sync(_guarded, fn, args, limiter=self.limiter)

    def _refresh(self):
        """Pick up snapshots archived since (rate-limited inside the archive)."""
        if self.archive.refresh():
            self.index = ti.TimeIndex(self.archive.snapshots(), self.tz)

    # -- attributes -----------------------------------------------------------

    def _attr(self, n):
        a = pyfuse3.EntryAttributes()
        a.st_ino = n.ino
        a.generation = 0
        a.st_blksize = 128 << 10
        a.st_uid = a.st_gid = 0
        a.st_nlink = 1
        t = n.mtime_ns or self.start_ns
        k = n.kind
        if k in ("root", "year", "month", "day", "time", "latest"):
            a.st_mode = stat.S_IFDIR | 0o555
            a.entry_timeout = a.attr_timeout = TOP_TIMEOUT
        elif k in ("snap", "disk", "vdir", "part"):
            a.st_mode = stat.S_IFDIR | 0o555
            # <vm> under a day may resolve to a newer snapshot tonight: never cache the name
            a.entry_timeout = 0 if k == "snap" else FIXED_TIMEOUT
            a.attr_timeout = FIXED_TIMEOUT
            if k == "part" and n.entry is not None:
                e = n.entry
                a.st_mode, a.st_uid, a.st_gid = e.mode, e.uid, e.gid
        elif k == "raw":
            a.st_mode = stat.S_IFREG | self.raw_mode
            a.st_gid = self.raw_gid
            a.st_size = n.snap.disks[n.disk].size
            a.st_blksize = rawstream.BLKSIZE     # what cp reads at once
            a.entry_timeout = a.attr_timeout = FIXED_TIMEOUT
        elif k == "blob":
            a.st_mode = stat.S_IFREG | 0o444
            a.st_size = len(n.data)
            a.entry_timeout = a.attr_timeout = FIXED_TIMEOUT if n.snap is not None else TOP_TIMEOUT
        elif k == "changes":
            # worked out on first open; the size is known only then
            a.st_mode = stat.S_IFREG | 0o444
            a.st_size = len(n.data) if n.data is not None else 0
            a.entry_timeout, a.attr_timeout = FIXED_TIMEOUT, 0 if n.data is None else FIXED_TIMEOUT
        elif k == "link":
            a.st_mode = stat.S_IFLNK | 0o777
            a.st_size = len(n.target)
            a.entry_timeout = 0           # latest/<vm> moves on each night
            a.attr_timeout = FIXED_TIMEOUT
        elif k == "fs":
            e = n.entry
            a.st_mode, a.st_uid, a.st_gid = e.mode, e.uid, e.gid
            a.st_size = e.size
            a.st_nlink = e.nlink
            a.st_atime_ns, a.st_mtime_ns, a.st_ctime_ns = e.atime_ns, e.mtime_ns, e.ctime_ns
            a.st_blocks = (e.size + 511) // 512
            a.entry_timeout = a.attr_timeout = FIXED_TIMEOUT
            return a
        a.st_blocks = (a.st_size + 511) // 512
        a.st_atime_ns = a.st_mtime_ns = a.st_ctime_ns = t
        return a

    async def getattr(self, inode, ctx=None):
        return self._attr(self._get(inode))

    async def statfs(self, ctx):
        s = pyfuse3.StatvfsData()
        s.f_bsize = s.f_frsize = 4096
        s.f_blocks = s.f_bfree = s.f_bavail = 0
        s.f_files = len(self.nodes)
        s.f_ffree = s.f_favail = 0
        s.f_namemax = 255
        return s

    # -- lookup and listing ---------------------------------------------------

    async def lookup(self, parent_inode, name, ctx=None):
        p = self._get(parent_inode)
        if name == b".":
            n = p
        elif name == b"..":
            raise pyfuse3.FUSEError(errno.ENOENT)   # the kernel keeps parents itself
        elif p.files is not None:
            n = p.files.get(name)        # a listed snapshot directory: no trip to the worker
        elif p.kind in _TOP and self._fresh():
            # Checked for new nights a moment ago: resolve from the index in memory. `<vm>` under a
            # day is never cached by the kernel, so every path walk through it comes here.
            n = self._lookup(p, name, refresh=False)
        else:
            n = await self._work(f"lookup {p.path}/{_name(name)}", self._lookup, p, name)
        if n is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        n = self._pin(n)
        n.nlookup += 1
        return self._attr(n)

    def _pin(self, n):
        """The table's node for n's inode, re-entering n if a forget dropped it meanwhile."""
        cur = self.nodes.get(n.ino)
        if cur is None:
            self.nodes[n.ino] = cur = n
        return cur if cur.key == n.key else n

    def _lookup(self, p, name, refresh=True):
        k = p.kind
        if k in _TOP and refresh:
            self._refresh()
        s = _name(name)
        idx = self.index
        if k == "root":
            if s == MARKER:
                return self._node((p.ino, s), "blob", s, data=MARKER_TEXT + self._describe())
            if s == "latest":
                return self._node(("latest",), "latest", s)
            y = ti.parse_year(s)
            if y is None or not idx.day_list or idx.day_list[0].year > y:
                return None
            return self._node(("year", y), "year", s, year=y)
        if k == "year":
            m = ti.parse_month(s)
            if m is None or not idx.day_list or (idx.day_list[0].year, idx.day_list[0].month) > (p.year, m):
                return None
            return self._node(("month", p.year, m), "month", f"{p.path}/{s}", year=p.year, month=m)
        if k == "month":
            d = ti.parse_day(p.year, p.month, s)
            if d is None or idx.effective_day(d) is None:
                return None
            return self._node(("day", d), "day", f"{p.path}/{s}", day=d)
        if k == "day":
            t = ti.parse_hhmmss(s)
            if t is not None:
                if not any(idx.at(vm, dt.datetime.combine(p.day, t)) for vm in idx.vms):
                    return None
                return self._node(("time", p.day, s), "time", f"{p.path}/{s}", day=p.day, hhmmss=s)
            return self._snap_node(p, s, idx.at_day(s, p.day))
        if k == "time":
            return self._snap_node(p, s, idx.at(s, dt.datetime.combine(p.day, ti.parse_hhmmss(p.hhmmss))))
        if k == "latest":
            snap = idx.latest().get(s)
            if snap is None:
                return None
            target = "../" + idx.canonical(snap)
            return self._node((p.ino, s, snap.id), "link", f"latest/{s}",
                              target=target.encode("utf-8", "surrogateescape"), mtime_ns=_ts_ns(snap.time))
        if k in ("snap", "disk", "vdir", "part", "fs"):
            return self._children(p).get(name)
        return None

    def _snap_node(self, parent, vm, snap):
        if snap is None:
            return None
        return self._node((parent.ino, vm, snap.id), "snap", f"{parent.path}/{vm}",
                          snap=snap, mtime_ns=_ts_ns(snap.time))

    def _describe(self):
        return f"source: {getattr(self.archive, 'description', '')}\n".encode()

    def _children(self, p):
        """{name bytes: Node} of directory node p, in listing order (worker thread)."""
        if p.files is not None:
            return p.files
        k = p.kind
        idx = self.index
        out = []
        if k in ("root", "year", "month", "day", "time", "latest"):
            self._refresh()
            idx = self.index
        if k == "root":
            for y in idx.year_names():
                out.append((y, self._node(("year", int(y)), "year", y, year=int(y))))
            out.append(("latest", self._node(("latest",), "latest", "latest")))
            out.append((MARKER, self._node((p.ino, MARKER), "blob", MARKER, data=MARKER_TEXT + self._describe())))
        elif k == "year":
            for m in idx.month_names(p.year):
                out.append((m, self._node(("month", p.year, int(m)), "month", f"{p.path}/{m}",
                                          year=p.year, month=int(m))))
        elif k == "month":
            for d in idx.day_names(p.year, p.month):
                day = ti.parse_day(p.year, p.month, d)
                out.append((d, self._node(("day", day), "day", f"{p.path}/{d}", day=day)))
        elif k == "day":
            vms, times = idx.day_listing(p.day)
            for t in times:
                out.append((t, self._node(("time", p.day, t), "time", f"{p.path}/{t}", day=p.day, hhmmss=t)))
            for vm in vms:
                n = self._lookup(p, vm.encode("utf-8", "surrogateescape"))
                if n is not None:
                    out.append((vm, n))
        elif k == "time":
            for vm in idx.time_listing(p.day, p.hhmmss):
                n = self._lookup(p, vm.encode("utf-8", "surrogateescape"))
                if n is not None:
                    out.append((vm, n))
        elif k == "latest":
            for vm in idx.latest():
                n = self._lookup(p, vm.encode("utf-8", "surrogateescape"))
                if n is not None:
                    out.append((vm, n))
        elif k == "snap":
            out = self._snap_children(p)
        elif k == "disk":
            out = self._disk_children(p)
        elif k == "vdir":
            out = self._vol_dir(p, self._diskfiles(p.snap, p.disk).volumes(), p.data)
        elif k in ("part", "fs"):
            out = self._fs_children(p, p.vol, p.entry.addr)
        files = {(c.encode("utf-8", "surrogateescape") if isinstance(c, str) else c): n for c, n in out}
        if k in ("snap", "disk", "vdir", "part", "fs"):
            p.files = files          # immutable: kept while the kernel keeps the inode
        return files

    def _snap_children(self, p):
        snap = p.snap
        out = []
        t = _ts_ns(snap.time)
        for disk in sorted(snap.disks):
            out.append((f"{disk}.raw", self._node((p.ino, f"{disk}.raw"), "raw", f"{p.path}/{disk}.raw",
                                                   snap=snap, disk=disk, mtime_ns=t)))
            out.append((disk, self._node((p.ino, disk), "disk", f"{p.path}/{disk}", snap=snap, disk=disk,
                                         mtime_ns=t)))
        for fname, key in META_FILES:
            data = self.archive.meta_blob(snap, key)
            if data is not None:
                out.append((fname, self._node((p.ino, fname), "blob", f"{p.path}/{fname}",
                                              snap=snap, data=data, mtime_ns=t)))
        for fname in ("changes", "changes.json"):
            out.append((fname, self._node((p.ino, fname), "changes", f"{p.path}/{fname}", snap=snap,
                                          target=fname, mtime_ns=t)))
        info = {
            "name": snap.name, "uuid": str(snap.uuid), "id": str(snap.id),
            "time": snap.time.isoformat(), "path": self.index.canonical(snap),
            "disks": {d: snap.disks[d].size for d in sorted(snap.disks)},
            "volumes": {d: self._volume_info(snap, d) for d in sorted(snap.disks)},
        }
        data = (json.dumps(info, indent=2) + "\n").encode()
        out.append(("snapshot.json", self._node((p.ino, "snapshot.json"), "blob", f"{p.path}/snapshot.json",
                                                snap=snap, data=data, mtime_ns=t)))
        return out

    def _changes(self, snap, as_json):
        """The text of `changes` (or `changes.json`): each disk against the VM's previous snapshot."""
        before = [s for s in self.archive.snapshots() if s.name == snap.name and (s.time, s.id) < (snap.time, snap.id)]
        prev = before[-1] if before else None
        lines = [] if as_json else [f"changes since {self.index.canonical(prev) if prev else 'nothing'}"]
        for disk in sorted(snap.disks):
            try:
                found = ch.snapshot_changes(self.archive.disk_reader, prev, snap, disk, getattr(snap, "store", None))
            except FilesUnreadable as e:
                log.error("%s: %s", snap.name, e)
                lines.append(json.dumps({"disk": disk, "error": str(e)}) if as_json else f"! {disk}: {e}")
                continue
            lines += [json.dumps(c.to_json(), ensure_ascii=False) if as_json else ch.human_line(c) for c in found]
        return ("\n".join(lines) + "\n" if lines else "").encode()

    def _volume_info(self, snap, disk):
        """{volume name: {type, encrypted, replayed, unreplayed} or {error}} of one disk, for snapshot.json."""
        d = self._diskfiles(snap, disk)
        try:
            vols = d.volumes()
        except (ReadFailed, DataCorrupt) as e:
            msg = str(e)
            scrub(e)
            return {"": {"error": msg}}
        out = {name: {"type": v.type_name, "encrypted": v.encrypted, "replayed": v.replayed,
                      "unreplayed": v.unreplayed}
               for name, v in vols.items()}
        out.update({name: {"error": why} for name, why in d.failed.items()})
        return dict(sorted(out.items()))

    def _diskfiles(self, snap, disk):
        key = (snap.id, disk)
        d = self.disks.get(key)
        if d is None:
            d = DiskFiles(self.archive.disk_reader(snap, disk), label=f"{self.index.canonical(snap)}/{disk}")
            if len(self.disks) > 256:
                self.disks.pop(next(iter(self.disks)))
            self.disks[key] = d
        return d

    def _disk_children(self, p):
        vols = self._diskfiles(p.snap, p.disk).volumes()
        if "" in vols:
            vol = vols[""]
            return self._fs_children(p, vol, vol.root_addr)
        return self._vol_dir(p, vols, "")

    def _vol_dir(self, p, vols, prefix):
        """The volumes named prefix + "<component>[/...]": file systems, and directories of more."""
        out = {}
        for name in sorted(vols, key=_vol_order):
            if not name.startswith(prefix):
                continue
            first, _, rest = name[len(prefix):].partition("/")
            if rest:
                out.setdefault(first, self._node((p.ino, first), "vdir", f"{p.path}/{first}", snap=p.snap,
                                                 disk=p.disk, data=prefix + first + "/"))
                continue
            vol = vols[name]
            shown = f"{first}.encrypted" if vol.encrypted else first
            out[shown] = self._node((p.ino, shown), "part", f"{p.path}/{shown}", snap=p.snap,
                                    disk=p.disk, vol=vol, entry=vol.root())
        return list(out.items())

    def _fs_children(self, p, vol, addr):
        out = []
        for e in vol.list_dir(addr):
            # A hard-linked file is one inode under all its names (keyed by the guest's inode).
            key = ("inode", p.snap.id, p.disk, vol.name, e.addr) if e.nlink > 1 and not e.is_dir \
                else (p.ino, e.name)
            out.append((e.name, self._node(key, "fs", f"{p.path}/{_name(e.name)}",
                                           snap=p.snap, disk=p.disk, vol=vol, entry=e)))
        return out

    async def opendir(self, inode, ctx):
        n = self._get(inode)
        if n.kind not in ("root", "year", "month", "day", "time", "latest", "snap", "disk", "vdir", "part") \
                and not (n.kind == "fs" and n.entry.is_dir):
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        entries = await self._work(f"list {n.path}/", self._children, n)
        fh = self.next_fh
        self.next_fh += 1
        self.handles[fh] = list(entries.items())
        return fh

    async def readdir(self, fh, start_id, token):
        entries = self.handles[fh]
        for i in range(start_id, len(entries)):
            name, node = entries[i]
            node = self._pin(node)                 # it may have been forgotten since opendir
            if not pyfuse3.readdir_reply(token, name, self._attr(node), i + 1):
                return
            node.nlookup += 1

    async def releasedir(self, fh):
        self.handles.pop(fh, None)

    async def forget(self, inode_list):
        for ino, count in inode_list:
            n = self.nodes.get(ino)
            if n is None or ino == pyfuse3.ROOT_INODE:
                continue
            n.nlookup -= count
            if n.nlookup <= 0:
                del self.nodes[ino]

    async def readlink(self, inode, ctx):
        n = self._get(inode)
        if n.kind == "link":
            return n.target
        if n.kind == "fs" and n.entry.link is not None:
            return n.entry.link
        raise pyfuse3.FUSEError(errno.EINVAL)

    # -- files ----------------------------------------------------------------

    async def open(self, inode, flags, ctx):
        n = self._get(inode)
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND):
            raise pyfuse3.FUSEError(errno.EROFS)
        if n.kind == "raw":
            reader = await self._work(f"open {n.path}", self.archive.disk_reader, n.snap, n.disk)
            h = RawStream(reader, n.snap.disks[n.disk].size)
        elif n.kind == "blob":
            h = ReadAhead(lambda o, k, d=n.data: d[o:o + k], len(n.data))
        elif n.kind == "changes":
            if n.data is None:
                n.data = await self._work(f"open {n.path}", self._changes, n.snap, n.target == "changes.json")
            h = ReadAhead(lambda o, k, d=n.data: d[o:o + k], len(n.data))
        elif n.kind == "fs" and stat.S_ISREG(n.entry.mode):
            f = await self._work(f"open {n.path}", n.vol.open_file, n.entry.addr)
            size = n.entry.size
            h = ReadAhead(lambda o, k, v=n.vol, f=f, s=size: v.read_file(f, o, k, s), size)
        elif n.kind == "fs" and n.entry.is_dir or n.kind in ("root", "snap", "disk", "vdir", "part"):
            raise pyfuse3.FUSEError(errno.EISDIR)
        else:
            raise pyfuse3.FUSEError(errno.EACCES)
        fh = self.next_fh
        self.next_fh += 1
        h.path = n.path
        self.handles[fh] = h
        direct = n.kind == "changes" or (n.kind == "raw" and rawstream.direct(ctx.pid))
        return pyfuse3.FileInfo(fh=fh, keep_cache=n.snap is not None, direct_io=direct)

    async def read(self, fh, off, size):
        h = self.handles[fh]
        if off >= h.size:
            return b""
        if isinstance(h, RawStream):
            return await h.read(off, size, self)
        data = h.cached(off, size)
        if data is None and h.pending is not None and h.pending[0] <= off < h.pending[1]:
            await h.pending[2].wait()         # being fetched ahead right now
            data = h.cached(off, size)
        if data is None:
            data = await self._work(f"read {h.path} at offset {off} ({size} bytes)", h.read, off, size)
        nxt = h.ahead()
        if nxt is not None and self.nursery is not None:
            ev = trio.Event()
            h.pending = (nxt[0], nxt[0] + nxt[1], ev)
            self.nursery.start_soon(self._fetch_ahead, h, nxt[0], nxt[1], ev)
        return data

    async def _fetch_ahead(self, h, start, n, ev):
        """Fill h.next while the kernel is served from h.cur; failures are left to the real read."""
        try:
            ok, value = await trio.to_thread.run_sync(_guarded, h._read, (start, n), limiter=self.limiter)
            if ok and len(value) == n:
                h.next = (start, value)
        finally:
            h.pending = None
            ev.set()

    async def release(self, fh):
        self.handles.pop(fh, None)

    async def access(self, inode, mode, ctx):
        if mode & os.W_OK:
            raise pyfuse3.FUSEError(errno.EROFS)
        return True
