"""Where archived snapshots go: the store (image/ + catalog/), or a plain directory.

The archiver knows nothing of arenas or trees: it hands each disk's frozen
byte source, the day's changed runs and the swap ranges to a *sink* and
gets back an opaque root, then adds one snapshot record per run. Adding
the record is the commit point of a run's archive step; a sink must make
it durable before returning, and `find(name, id)` must see it afterwards
(that is how a run killed just after its catalog commit is not archived
twice).

`StoreSink` writes through `foundation.image` and `foundation.catalog`.
`DirSink` keeps each snapshot as raw files in a directory: it lets the
libvirt side be tested byte for byte without a store, and is handy when
debugging a chain.
"""

import abc
import json
import os
import shutil

CHUNK = 4 << 20
BATCH, SMALL_BATCH = 4 << 20, 1 << 20


class Sink(abc.ABC):
    """The interface (methods the archiver calls)."""

    def check_name(self, name):
        """Raise a BadInput error if snapshots cannot be named `name` (checked before any change)."""

    @abc.abstractmethod
    def find(self, name, run_id):
        """The snapshot of VM `name` made by run `run_id`, as {target: (root, size)}, or None."""

    @abc.abstractmethod
    def write_disk(self, src, size, prev, changed, zeros, progress, run_id, target):
        """Archive one disk; returns its root. `prev` is a root from find() or None."""

    @abc.abstractmethod
    def write_blob(self, data):
        """Archive small bytes (domain XML, NVRAM); returns a JSON-able reference."""

    @abc.abstractmethod
    def add(self, run_id, name, uuid, when, disks, meta):
        """Record the snapshot durably (meta gets run.id). `disks` maps target -> (root, size)."""


class DirSink(Sink):
    """Snapshots as DIR/<id>/<target>.raw plus DIR/<id>/snapshot.json (written last)."""

    def __init__(self, path):
        self.path = path
        os.makedirs(path, exist_ok=True)

    def _meta(self, run_id):
        return os.path.join(self.path, run_id, "snapshot.json")

    def find(self, name, run_id):
        try:
            with open(self._meta(run_id)) as f:
                rec = json.load(f)
        except FileNotFoundError:
            return None
        if rec["name"] != name:
            return None
        return {t: (d["root"], d["size"]) for t, d in rec["disks"].items()}

    def snapshots(self):
        out = []
        for sid in os.listdir(self.path):
            try:
                with open(self._meta(sid)) as f:
                    out.append(json.load(f))
            except (FileNotFoundError, NotADirectoryError):
                pass
        return sorted(out, key=lambda r: r["time"])

    def write_disk(self, src, size, prev, changed, zeros, progress, run_id, target):
        d = os.path.join(self.path, run_id)
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, f"{target}.raw")
        tmp = path + ".tmp"
        if prev is not None and changed is not None:
            shutil.copyfile(prev, tmp)
            runs = changed
        else:
            with open(tmp, "wb"):
                pass
            runs = [(0, size)]
        with open(tmp, "r+b") as f:
            f.truncate(size)
            for off, n in runs:
                pos = off
                while pos < off + n:
                    k = min(CHUNK, off + n - pos)
                    f.seek(pos)
                    f.write(src.read(pos, k))
                    if progress:
                        progress(k)
                    pos += k
            for off, n in zeros:
                f.seek(off)
                while n:
                    k = min(CHUNK, n)
                    f.write(bytes(k))
                    n -= k
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, path)
        return path

    def write_blob(self, data):
        return data.decode("utf-8", "surrogateescape") if isinstance(data, bytes) else data

    def add(self, run_id, name, uuid, when, disks, meta):
        rec = {"id": run_id, "name": name, "uuid": uuid, "time": when.isoformat(),
               "disks": {t: {"root": r, "size": s} for t, (r, s) in disks.items()},
               "meta": meta}
        p = self._meta(run_id)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p + ".tmp", "w") as f:
            json.dump(rec, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.rename(p + ".tmp", p)


_ARENAS = False   # set once per process, at the first disk written


def _one_malloc_arena():
    """glibc's malloc gives each thread that allocates an arena of its own (up to 8 per core): the
    write's threads (reads, fill, append, the early merge's) each kept their own freed blocks
    of batch buffers, and a night peaked ~1 MB higher (paired nights, benchmarks/README.md
    "wave 8, night7"). mallopt(M_ARENA_MAX, 1): threads that start allocating after this share
    the main arena, and reuse each other's freed blocks. Only memory (the same CPU within the
    noise; a fixed mmap threshold, also ~1 MB less, cost ~0.01-0.04 CPU s a night in page
    faults); elsewhere than glibc nothing is done."""
    global _ARENAS
    if _ARENAS is not False:
        return
    _ARENAS = None
    import ctypes  # here: the write imports it anyway (its O_DIRECT reads and write behind)

    try:
        _ARENAS = ctypes.CDLL(None).mallopt(-8, 1)    # M_ARENA_MAX (malloc.h)
    except (OSError, AttributeError):
        pass


def _batch(total):
    """Bytes handed to the store at a time: 4 MiB for a whole disk, down to 1 MiB for a night's
    few MiB (64 batches or more). The write path holds about six such buffers (three read, three
    packed), so a 64 MiB night peaks ~18 MB lower with 1 MiB, for the same CPU."""
    return min(BATCH, max(SMALL_BATCH, total // 64 // SMALL_BATCH * SMALL_BATCH))


class StoreSink(Sink):
    """Snapshots in a Foundation store: disk images as Merkle trees, one catalog record per run."""

    def __init__(self, store):
        from foundation.catalog import Catalog

        self.store = store
        self.catalog = Catalog.load(store)
        self._mark = self._written()
        # (previous root, new root, [(offset, length)]): outside those ranges the new tree is the
        # previous one (the blocks re-read or zeroed, whole), for the file listings (find.py)
        self.changes = []

    def _written(self):
        return self.store.counters.get("raw_bytes", 0)

    def check_name(self, name):
        from foundation.catalog import check_name

        check_name(name)

    def find(self, name, run_id):
        for s in self.catalog.snapshots(name):
            if s.meta.get("run", {}).get("id") == run_id:
                return {t: (d.root, d.size) for t, d in s.disks.items()}
        return None

    def write_disk(self, src, size, prev, changed, zeros, progress, run_id, target):
        from foundation.image import ranges as R
        from foundation.image import write_image

        total = sum(n for _, n in changed) if changed is not None else size
        zeros = list(zeros)
        _one_malloc_arena()
        # deep=False: an archive carries libvirt's libraries (~12 MB), and the deeper pipeline a raw
        # image gets (image/tree.py DEEP, DEEP_READS, ~8 MB more) put a first run at 105-107 MB, above
        # virtnbdbackup's 100 MB; a disk's two reads at once cost no memory (benchmarks/README.md,
        # wave 20).
        root = write_image(self.store, src, size, prev=prev, changed=changed,
                           zeros=zeros, progress=progress, batch=_batch(total), deep=False)
        if prev is not None and changed is not None and prev.size == size:
            bs = self.store.block_size  # the ranges widened to whole blocks, merged
            runs = R.outer_blocks(R.as_runs(list(changed) + zeros), bs, -(-size // bs))
            self.changes.append((prev, root, [(s * bs, (e - s) * bs) for s, e in runs]))
        return root

    def write_blob(self, data):
        from foundation.image import write_blob

        return write_blob(self.store, data).to_json()

    def add(self, run_id, name, uuid, when, disks, meta):
        from foundation.catalog import DiskEntry, Snapshot

        snap = Snapshot(id=None, name=name, uuid=uuid, time=when,
                        disks={t: DiskEntry(root=r, size=s) for t, (r, s) in disks.items()},
                        meta=meta, added_bytes=self._written() - self._mark)
        self.catalog.add(snap)
        self.catalog.commit(self.store)
        self._mark = self._written()
