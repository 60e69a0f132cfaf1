"""The on-disk index: a hash table from block key to log address.

Random seeks are what a USB disk cannot afford, so new entries never go to
the index one by one: they wait in a write buffer and are merged in one
sorted, sequential pass (Venti's icachewrite, paper §3.2). Buckets are
chosen by a monotonic map of the key's top 64 bits, so sorted entries meet
the buckets in file order; a full bucket spills into the next one (linear
probing) and the file ends with overflow buckets instead of wrapping. The
index is derived: it is rebuilt from the arenas whenever it is missing,
stale or left dirty by a crash mid-flush.

The index grows with the store instead of being made at its largest: a
new one holds INITIAL entries (about 1.5 MiB), and a flush that would load
it past GROW_LOAD writes a new one twice as large instead, in one pass
that streams the old buckets and the new entries in key order into a
fresh file renamed over the old one (a crash leaves the old index).
"""

import math
import os

from foundation import native
from foundation.errors import DerivedCorrupt
from foundation.faults import crash_point
from foundation.store import format as F
from foundation.store.disk import fsync_dir

BUCKET_SIZE = 4096
FILL = 0.9  # a new or grown index is sized for this load at its planned entries
INITIAL = 32768  # entries a new store's index and Bloom filter are sized for
GROW_LOAD = 0.75  # a flush past this load grows the index (linear probing stays short below it)
# The three below bound a flush's memory beside the write buffer (each buffer ~ 2x: a sort's or
# a merge's scratch): 5 MiB of entries, 1 MiB regions; the passes stay sequential.
CHUNK = 1 << 17  # entries sorted and merged at a time while growing (5 MiB in hash mode)
REGION = 256  # at most this many buckets per read/write of a flush or a scan (1 MiB)
GAP = 128  # buckets (512 KiB): about what one seek costs in transfer time
SLACK = 2  # extra buckets read after a region for entries that overflow
CRASH_ENV = "FOUNDATION_INDEX_CRASH"  # tests: "index.grow" or "bloom.grow" exits before the new file is renamed


class IndexFull(Exception):
    """The index overflowed its last bucket; it must be rebuilt larger."""


def plan(max_entries, keylen, bucket_size=BUCKET_SIZE):
    """Buckets for an index that is FILL full at `max_entries`: (home, in file)."""
    cap = (bucket_size - 4) // (keylen + 8)
    n = max(1, math.ceil(max_entries / (cap * FILL))) + 16
    # Every bucket is a home bucket; a run that spills past the last one
    # (rare below 90 % load with buckets of 100+ entries) grows the index.
    return n, n


class Index:
    def __init__(self, path, disk, fd, header):
        self.path, self.disk, self.fd, self.h = path, disk, fd, header
        self.entsize = header.keylen + 8
        self.cap = (header.bucket_size - 4) // self.entsize
        self.zero_from = header.nfile   # buckets from here on are known to be zeros: a merge need not read them

    @classmethod
    def create(cls, path, disk, keylen, home, nfile, uuid, covered=0, bucket_size=BUCKET_SIZE):
        h = F.IndexHeader(keylen, bucket_size, home, nfile, 0, covered, 0, uuid)
        tmp = path + ".new"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        # A sparse file: empty buckets are zeros and cost no disk space.
        os.ftruncate(fd, F.INDEX_HEADER_SIZE + nfile * bucket_size)
        disk.pwrite(fd, "index", 0, h.pack())
        idx = cls(tmp, disk, fd, h)
        idx.zero_from = 0
        return idx

    def install(self, path):
        """Make a freshly created index the store's index (atomic rename)."""
        self.disk.fsync(self.fd, "index")
        os.replace(self.path, path)
        fsync_dir(os.path.dirname(path))
        self.path = path

    @classmethod
    def open(cls, path, disk, keylen, uuid, writable):
        try:
            fd = os.open(path, os.O_RDWR if writable else os.O_RDONLY)
        except FileNotFoundError:
            raise DerivedCorrupt("the index is missing") from None
        try:
            h = F.IndexHeader.unpack(os.pread(fd, F.INDEX_HEADER_SIZE, 0))
            if h.keylen != keylen or h.uuid != uuid:
                raise ValueError("index belongs to another store or mode")
            if h.dirty:
                raise ValueError("a flush or a gc was interrupted")
            if os.fstat(fd).st_size < F.INDEX_HEADER_SIZE + h.nfile * h.bucket_size:
                raise ValueError("index file is truncated")
        except ValueError as e:
            os.close(fd)
            raise DerivedCorrupt(f"the index is damaged ({e})") from None
        return cls(path, disk, fd, h)

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def _off(self, bucket):
        return F.INDEX_HEADER_SIZE + bucket * self.h.bucket_size

    def willneed(self, keys):
        """Ask the kernel to start reading the buckets these keys live in (and the next three,
        where an overflow may lead), lowest first: a hint, the lookups that follow read them."""
        if self.fd is None:
            return
        h = self.h
        homes = sorted({native.bucket_home(k, h.nbuckets) for k in keys})
        for b in homes:
            try:
                os.posix_fadvise(self.fd, self._off(b), min(4, h.nfile - b) * h.bucket_size,
                                 os.POSIX_FADV_WILLNEED)
            except OSError:
                return  # only a hint: the lookups report any error

    def reread_header(self):
        """For a reader: a writer may have merged into this file since, or grown the index into a new
        one renamed over it (installed only once clean): then read that one."""
        try:
            if os.stat(self.path).st_ino != os.fstat(self.fd).st_ino:
                fd = os.open(self.path, os.O_RDONLY)
                os.close(self.fd)
                self.fd = fd
        except OSError:
            pass   # gone (a writer rebuilding it): keep the old file, whose entries still hold
        self.h = F.IndexHeader.unpack(os.pread(self.fd, F.INDEX_HEADER_SIZE, 0))

    # ---- lookup: one seek and one bucket read, more only on overflow ---------

    def lookup(self, key):
        h = self.h
        b = native.bucket_home(key, h.nbuckets)
        found = []
        while b < h.nfile:
            n = min(4, h.nfile - b)
            region = self.disk.pread(self.fd, "index", self._off(b), n * h.bucket_size)
            try:
                addrs, more = native.lookup(region, b, n, h.bucket_size, h.keylen, key, h.nbuckets)
            except native.BucketError as e:
                raise DerivedCorrupt(f"the index is damaged ({e})") from None
            found += addrs
            if not more:
                break
            b += n
        return found

    # ---- writes ----------------------------------------------------------------

    def mark_dirty(self):
        """Entries may name records that are about to move: a crash from here on rebuilds the index."""
        self._header(1)
        self.disk.fsync(self.fd, "index")

    def _header(self, dirty, covered=None):
        self.h.dirty = dirty
        if covered is not None:
            self.h.covered = covered
        self.disk.pwrite(self.fd, "index", 0, self.h.pack())

    def slots(self):
        return self.h.nbuckets * self.cap

    def flush(self, entries, covered):
        """Merge sorted entries (bytes, entsize each) in one sequential pass, or grow the index
        around them when they would load it past GROW_LOAD. Raises IndexFull if the last bucket
        overflows (the caller rebuilds the index larger)."""
        h = self.h
        n = len(entries) // self.entsize
        if n and h.entries + n > GROW_LOAD * self.slots():
            return self.grow(entries, covered)
        # The file is written in place (its size set when it was made): fdatasync makes its
        # bytes and their blocks durable without a journal commit for the mtime, three times.
        if n:
            self._header(1)
            self.disk.fdatasync(self.fd, "index")
            self._merge(entries)
            h.entries += n
            # The buckets must be on disk before the header calls them clean.
            self.disk.fdatasync(self.fd, "index")
        self._header(0, covered)
        self.disk.fdatasync(self.fd, "index")

    def grow(self, entries, covered):
        """Write an index sized for twice the entries (old ones and `entries`, sorted), in one pass
        over the old buckets, and rename it over this one; this object then is the new index."""
        h, es, kl = self.h, self.entsize, self.h.keylen
        total = h.entries + len(entries) // es
        home, nfile = plan(max(2 * total, INITIAL), kl, h.bucket_size)
        new = Index.create(self.path, self.disk, kl, home, nfile, h.uuid, 0, h.bucket_size)
        mv, i, chunk = memoryview(entries), 0, bytearray()
        try:
            # The old buckets come in key order but for entries spilled past their home; each
            # chunk is sorted, and takes the new entries up to its last key along.
            for part in self.scan():
                chunk += part
                if len(chunk) >= CHUNK * es:
                    native.sort_entries(chunk, es, kl)
                    j = _upper(mv, es, kl, bytes(chunk[-es:len(chunk) - es + kl]), i)
                    chunk += mv[i * es:j * es]
                    new.merge_sorted(chunk)
                    i, chunk = j, bytearray()
            if chunk:
                native.sort_entries(chunk, es, kl)
                j = _upper(mv, es, kl, bytes(chunk[-es:len(chunk) - es + kl]), i)
                chunk += mv[i * es:j * es]
                new.merge_sorted(chunk)
                i, chunk = j, None
            if i < len(mv) // es:  # the rest of the new entries, sorted already: merged in place
                new._merge(mv[i * es:])
                new.h.entries += len(mv) // es - i
            new.flush(b"", covered)
            crash_point(CRASH_ENV, "index.grow")
        except BaseException:
            new.close()
            os.unlink(new.path)
            raise
        new.install(self.path)
        os.close(self.fd)
        self.fd, self.h, self.zero_from = new.fd, new.h, new.zero_from

    def merge_sorted(self, chunk):
        """Sort a bytearray of entries and merge it into an index not yet installed (no dirty
        flag: a crash leaves the old index, or none, in place)."""
        if chunk:
            native.sort_entries(chunk, self.entsize, self.h.keylen)
            self._merge(chunk)
            self.h.entries += len(chunk) // self.entsize

    def _merge(self, entries):
        h, es, bs = self.h, self.entsize, self.h.bucket_size
        mv = memoryview(entries)
        n = len(entries) // es
        i = nxt = 0
        spill = b""  # entries carried over to the region starting at `nxt`
        # One buffer for every region, read into in place: a flush night's peak memory is the
        # write's, not 4 MiB regions read as fresh bytes and copied (+8 MB on a 57 MB night).
        buf = zeros = None
        # Many entries: one sequential pass in fixed regions; few: seek to each cluster.
        dense = n * GAP >= h.nfile
        while i < n or spill:
            # The first region starts at the home of the next entry (or where the spill goes).
            if spill:
                first = nxt
            else:
                first = native.bucket_home(bytes(mv[i * es:i * es + es]), h.nbuckets)
            if first >= h.nfile:
                raise IndexFull()
            # A region ends where the next entry's home is far away: reading a
            # gap of GAP buckets costs about one seek on a USB disk, so a dense
            # buffer makes one sequential pass and a sparse one seeks.
            last = first
            j = n if dense else i
            while j < n:
                hj = native.bucket_home(bytes(mv[j * es:j * es + es]), h.nbuckets)
                if hj - last > GAP or hj - first >= REGION:
                    break
                last = hj
                j += 1
            count = min(REGION if dense else last - first + 1 + SLACK, h.nfile - first)
            stop = first + count
            j = self._first_home_at_or_after(mv, i, n, stop)
            batch = spill + bytes(mv[i * es:j * es])
            if buf is None:
                buf = bytearray((REGION + SLACK) * bs)
            region = memoryview(buf)[:count * bs]
            # Buckets a new index has not written yet are zeros: reading them is wasted time.
            known = max(0, min(count, self.zero_from - first)) * bs
            if known and self.disk.pread_into(self.fd, "index", self._off(first), region[:known]) < known:
                raise DerivedCorrupt("the index is damaged (its file ends early)")
            if known < count * bs:
                if zeros is None:
                    zeros = bytes(len(buf))
                region[known:] = memoryview(zeros)[:count * bs - known]
            try:
                spill = native.merge(region, first, count, bs, h.keylen, batch, h.nbuckets)
            except native.BucketError as e:
                raise DerivedCorrupt(f"the index is damaged ({e})") from None
            self.disk.pwrite(self.fd, "index", self._off(first), region)
            self.zero_from = max(self.zero_from, stop)
            i = j
            nxt = stop
            if spill and stop >= h.nfile:
                raise IndexFull()

    def _first_home_at_or_after(self, mv, lo, hi, bucket):
        es, nb = self.entsize, self.h.nbuckets
        while lo < hi:
            mid = (lo + hi) // 2
            if native.bucket_home(bytes(mv[mid * es:mid * es + es]), nb) < bucket:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def scan(self):
        """Every entry, region by region (bytes of whole entries), in one sequential pass."""
        h = self.h
        for first in range(0, h.nfile, REGION):   # 1 MiB reads: sequential, and little memory
            count = min(REGION, h.nfile - first)
            region = self.disk.pread(self.fd, "index", self._off(first), count * h.bucket_size)
            yield b"".join(_bucket_entries(region, count, h.bucket_size, self.entsize))

    def insert(self, entries):
        """Venti's path: each entry read-modify-writes its home bucket at once."""
        h, es = self.h, self.entsize
        if h.entries + len(entries) // es > GROW_LOAD * self.slots():
            self.grow(b"", h.covered)
            h = self.h
        for i in range(0, len(entries), es):
            spill = bytes(entries[i:i + es])
            b = native.bucket_home(spill, h.nbuckets)
            while spill:
                if b >= h.nfile:
                    raise IndexFull()
                region = bytearray(self.disk.pread(self.fd, "index", self._off(b), h.bucket_size))
                spill = native.merge(region, b, 1, h.bucket_size, h.keylen, spill, h.nbuckets)
                self.disk.pwrite(self.fd, "index", self._off(b), region)
                b += 1
            h.entries += 1


def _bucket_entries(region, count, bucket_size, es):
    for k in range(count):
        o = k * bucket_size
        c = int.from_bytes(region[o:o + 4], "little")
        if c:
            yield region[o + 4:o + 4 + c * es]


def _upper(mv, es, kl, key, lo):
    """Index past the last of the sorted entries in mv (from lo on) whose key is at most key."""
    hi = len(mv) // es
    while lo < hi:
        mid = (lo + hi) // 2
        if bytes(mv[mid * es:mid * es + kl]) <= key:
            lo = mid + 1
        else:
            hi = mid
    return lo


class MemIndex:
    """A stand-in for a damaged index when the store is opened read-only: every
    entry of every summary, in memory (a writer rebuilds the real index)."""

    def __init__(self, table, entries, covered, keylen):
        self.t = table
        self.h = F.IndexHeader(keylen, BUCKET_SIZE, 1, 1, entries, covered, 0, b"")
        self.cap = entries + 1

    def lookup(self, key):
        return self.t.find(key)

    def reread_header(self):
        pass

    def willneed(self, keys):
        pass  # in memory: nothing to ask the disk for

    def close(self):
        pass
