"""What the snapshot tree reads: the catalog's snapshots, their disks and domain XML.

`StoreArchive` reads a Foundation store through catalog/ and image/ only.
It notices new snapshots written by another process (the nightly archive)
by asking the store for its newest catalog record at most once a
`check_interval`; the mount never has to be restarted. Snapshots are
immutable, so everything read for one (a disk reader, a parsed file
system) can be cached under its id forever; an open file keeps the
reader it opened with, and so keeps reading the snapshot it opened even
if the catalog moves on.

`ImageFilesArchive` serves raw image files listed in a JSON manifest with
the same interface: a stand-in for tests of the tree itself, and a way to
browse loose raw images with the same code.
"""

import collections
import datetime as dt
import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

INDEX_CACHE = 8 << 20  # the mount's store: summaries kept, counted as Tuning.index_cache_bytes counts


class LRU:
    """A small thread-safe LRU map."""

    def __init__(self, limit):
        self.limit = limit
        self.d = collections.OrderedDict()
        self.lock = threading.Lock()

    def get(self, key, make):
        with self.lock:
            v = self.d.get(key)
            if v is not None:
                self.d.move_to_end(key)
                return v
        v = make()
        with self.lock:
            self.d[key] = v
            self.d.move_to_end(key)
            while len(self.d) > self.limit:
                self.d.popitem(last=False)
        return v


class StoreArchive:
    """Snapshots of a Foundation store, opened read-only."""

    def __init__(self, store_path, key_file=None, check_interval=1.0, passphrase=None):
        from foundation.store import Store

        self._Store = Store
        self.path = store_path
        self.key_file = key_file
        self.passphrase = passphrase  # as for Store.open: asked again at each reopen
        self.check_interval = check_interval
        self.description = f"Foundation store {store_path}"
        self.store = self._open()
        self.old_stores = []       # superseded by a reopen; still read by open files
        self._snaps = []
        self._catalog_ref = object()
        self._checked = 0.0
        self.readers = LRU(64)
        self.lock = threading.Lock()
        self._reload(force=True)

    def _open(self):
        from foundation.store.cache import Tuning

        # a reader's index cache: a copy of a day loads each summary once, in log order, and keeps
        # it (~25 MB for a 2 GiB day at the default bound, which is sized for a writer's dedup)
        return self._Store.open(self.path, key_file=self.key_file, passphrase=self.passphrase, writable=False,
                                tuning=Tuning(index_cache_bytes=INDEX_CACHE))

    def close(self):
        for s in [self.store] + self.old_stores:
            try:
                s.close()
            except Exception:
                pass

    def fresh(self):
        """True while refresh() would not look again: the tree may resolve names from memory."""
        return time.monotonic() - self._checked < self.check_interval

    def refresh(self):
        """Reload the catalog if the store has a newer one. True when the snapshots changed."""
        now = time.monotonic()
        if now - self._checked < self.check_interval:
            return False
        self._checked = now
        return self._reload()

    def _reload(self, force=False):
        from foundation.catalog import Catalog
        from foundation.store import BlockType

        with self.lock:
            store = self.store
            if hasattr(store, "refresh"):
                if not store.refresh() and not force:
                    return False        # nothing appended since: the cheap, common case
            elif not force:
                # A store without refresh(): a fresh read-only open sees what
                # other processes appended since.
                fresh = self._open()
                if fresh.latest(BlockType.CATALOG) == store.latest(BlockType.CATALOG):
                    fresh.close()
                    return False
                self.old_stores.append(store)
                self.store = store = fresh
            ref = store.latest(BlockType.CATALOG)
            if ref == self._catalog_ref and not force:
                return False
            cat = Catalog.load(store)
            self._snaps = [_Bound(s, store) for s in cat.snapshots()]
            self._catalog_ref = ref
            if not force:
                log.info("catalog changed: %d snapshots", len(self._snaps))
            return True

    def snapshots(self):
        return self._snaps

    def disk_reader(self, snap, disk):
        from foundation.image import ImageReader

        def make():
            entry = snap.disks[disk]
            return _Clipped(ImageReader(snap.store, entry.root), entry.size)

        return self.readers.get((snap.id, disk), make)

    def meta_blob(self, snap, key):
        """The bytes of blob `key` of the snapshot's meta ("domain_xml", "nvram"), or None."""
        from foundation.image import Root, read_blob

        ref = (snap.meta or {}).get(key)
        if not ref:
            return None
        if isinstance(ref, str):
            ref = json.loads(ref)
        if isinstance(ref, dict) and "blob" in ref:
            ref = ref["blob"]            # {"path": ..., "blob": Root JSON}, as vm/ keeps the NVRAM
        return read_blob(snap.store, Root.from_json(ref))


class _Bound:
    """A catalog Snapshot plus the store object it must be read from."""

    def __init__(self, snap, store):
        self._snap = snap
        self.store = store

    def __getattr__(self, name):
        return getattr(self._snap, name)


class _Clipped:
    """An image reader that answers reads past the end with fewer bytes, like a file."""

    def __init__(self, reader, size):
        self.reader = reader
        self.size = size

    def read(self, offset, length):
        end = min(offset + length, self.size)
        if offset >= end:
            return b""
        return self.reader.read(offset, end - offset)

    def window(self, offset, length, alloc=None):
        """Like read, for a large aligned piece read whole in log order (a stream's window), into
        buffers from alloc(nbytes) when given (buffers the caller recycles)."""
        end = min(offset + length, self.size)
        if offset >= end:
            return b""
        return self.reader.read_window(offset, end - offset, alloc)


# -- a stand-in archive over loose raw image files ---------------------------

@dataclass
class FileDisk:
    path: str
    size: int


@dataclass
class FileSnapshot:
    id: str
    name: str
    uuid: str
    time: dt.datetime
    disks: dict
    meta: dict = field(default_factory=dict)


class _FileReader:
    def __init__(self, path, size, damaged=()):
        self.fd = os.open(path, os.O_RDONLY)
        self.path, self.size = path, size
        self.damaged = damaged

    def read(self, offset, length):
        end = min(offset + length, self.size)
        if offset >= end:
            return b""
        for d0, dn in self.damaged:
            if offset < d0 + dn and d0 < end:
                from foundation.errors import DataCorrupt

                raise DataCorrupt(f"stand-in damage at bytes {d0}-{d0 + dn} of {self.path}")
        return os.pread(self.fd, end - offset, offset)


class ImageFilesArchive:
    """Snapshots described by a JSON manifest of raw image files.

    The manifest is a list of {"id", "name", "uuid", "time" (ISO 8601 with
    offset), "disks": {"vda": "/path/to.raw"}, "domain_xml": "/path/to.xml"};
    it is re-read when its mtime changes. An optional "damaged": {"vda":
    [[offset, length], ...]} makes reads of those bytes raise DataCorrupt,
    as a damaged store block would (tests of the EIO path).
    """

    def __init__(self, manifest, check_interval=0.2):
        self.manifest = manifest
        self.check_interval = check_interval
        self.description = f"image files listed in {manifest}"
        self._mtime = None
        self._checked = 0.0
        self._snaps = []
        self.readers = LRU(64)
        self._load()

    def close(self):
        pass

    def _load(self):
        st = os.stat(self.manifest)
        if st.st_mtime_ns == self._mtime:
            return False
        self._mtime = st.st_mtime_ns
        with open(self.manifest) as f:
            items = json.load(f)
        snaps = []
        for it in items:
            disks = {d: FileDisk(p, os.path.getsize(p)) for d, p in it["disks"].items()}
            meta = {k: it.get(k) for k in ("domain_xml", "nvram")}
            meta["damaged"] = it.get("damaged") or {}
            snaps.append(FileSnapshot(it["id"], it["name"], it.get("uuid", ""),
                                      dt.datetime.fromisoformat(it["time"]), disks, meta))
        self._snaps = sorted(snaps, key=lambda s: s.time)
        return True

    fresh = StoreArchive.fresh

    def refresh(self):
        now = time.monotonic()
        if now - self._checked < self.check_interval:
            return False
        self._checked = now
        return self._load()

    def snapshots(self):
        return self._snaps

    def disk_reader(self, snap, disk):
        d = snap.disks[disk]
        bad = snap.meta["damaged"].get(disk, ())
        return self.readers.get((snap.id, disk), lambda: _FileReader(d.path, d.size, bad))

    def meta_blob(self, snap, key):
        p = snap.meta.get(key)
        if not p:
            return None
        with open(p, "rb") as f:
            return f.read()
