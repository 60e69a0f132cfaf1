"""The hot paths of the store, in C, with a pure-Python reference of each.

One API, implemented twice: by foundation._native (csrc/, built by cffi)
through the thin wrappers below, and by reference.py, which is the
specification in executable form and draws every byte layout. Python owns
files and meaning; the C core only loops over buffers handed to it.

The backend is chosen once, at import. FOUNDATION_NATIVE=0 selects the
reference; otherwise the compiled module must be present and speak this
API_VERSION, or importing fails: a backup that silently runs forty times
slower is a broken backup.

    backend                       "native" or "reference"
    native_impl, reference_impl   both backends (native_impl is None when
                                  FOUNDATION_NATIVE=0 and it is not built)
    get(name)                     the chosen backend's function or class

The API; every buf may be bytes, bytearray or memoryview. A buffer of
blocks holds n = len(buf) // bs whole blocks, or exactly one shorter block
when bs == len(buf).

    zero_flags(buf, bs) -> bytes                          n flags, 1 = all zero
    scores(buf, bs, btype, key=None, skip=None, threads=1) -> bytes    n * 32
    weak_hashes(buf, bs, btype, seed, skip=None) -> bytes               n * 8
    Codec(enc_key, mac_key, zlevel)
    pack(codec, arena, iv, offset, btype, buf, bs, keys, threads=1) -> (records, offsets)
    unpack(codec, arena, iv, offset, rec) -> (btype, key32, data)   or RecordError
    unpack_many(codec, arena, iv, buf, base, offsets, threads=1) -> [(btype, key32, data) | RecordError]
    scan(codec, arena, iv, buf, base, verify=True) -> (entries, end, error)
    bucket_home(key, nbuckets) -> int
    bucket_find(bucket, keylen, key) -> [addr]
    sort_entries(entries, entsize, keylen)                in place
    merge(region, first, nregion, bucket_size, keylen, entries, nbuckets) -> spill
    lookup(region, first, nregion, bucket_size, keylen, key, nbuckets) -> ([addr], more)
    Table(keylen, capacity_hint=0): add(keys, addrs), find(key), len, clear()
    tables_lookup(tables, keys, skip, keylen=None) -> ([addr], [which])
    equal(a, b) -> bool

unpack_many decodes a batch of records from one span of one arena: buf
holds arena offsets [base, base + len(buf)), and every offset (any order,
repeats allowed) must lie in that span, else ValueError. Item i is what
unpack(codec, arena, iv, offsets[i], buf[offsets[i] - base:]) returns, or
the RecordError it would raise: bad records are returned, never raised, so
the caller can name the arena and decide. threads splits the work and never
changes the result.
"""

import array
import operator
import os
import struct
import threading

API_VERSION = 1

SCORE_SIZE = 32  # SHA-256; the record's key field
WEAK_SIZE = 8  # weak hash, u64 big-endian
HEADER_SIZE = 4 + 1 + 1 + 2 + 4 + 4 + SCORE_SIZE + 16  # = 64, see reference.py
TAG_SIZE = 16  # HMAC-SHA256 truncated
KEY_SIZE = 32  # AES-256
IV_SIZE = 16  # an arena's initial AES-CTR counter block
RECORD_MAGIC = b"FDNr"
ARENA_LIMIT = 1 << 32  # arena offsets are u32
ZLEVEL_MIN, ZLEVEL_MAX = -(1 << 17), 22  # zstd's own bounds; 0 = never compress
MAX_THREADS = 64

API = ("zero_flags", "scores", "weak_hashes", "Codec", "pack", "unpack", "unpack_many",
       "scan", "bucket_home", "bucket_find", "sort_entries", "merge", "lookup", "Table",
       "tables_lookup", "equal")


class RecordError(ValueError):
    """A record in an arena that must not be believed.

    kind says what is wrong; offset is the record's arena offset:
      magic       not a record header (magic, codec or reserved bytes)
      length      impossible stored and raw lengths
      tag         the HMAC tag does not match: damaged, misplaced or forged
      decompress  authentic, yet the payload does not decode to its raw length
      truncated   the bytes end inside the record (a torn tail when it is the last)
    """

    KINDS = ("magic", "length", "tag", "decompress", "truncated")

    def __init__(self, kind, offset):
        if kind not in self.KINDS:
            raise AssertionError(f"unknown record error kind {kind!r}")
        super().__init__(kind, offset)
        self.kind = kind
        self.offset = offset

    def __str__(self):
        return f"bad record at arena offset {self.offset}: {self.kind}"


class BucketError(ValueError):
    """An index bucket claims more entries than it holds: the index is damaged.

    The index is derived data; `foundation rebuild` recreates it from the arenas.
    bucket is the bucket number, or None when the caller passed a lone bucket.
    """

    def __init__(self, bucket, count, cap):
        super().__init__(bucket, count, cap)
        self.bucket, self.count, self.cap = bucket, count, cap

    def __str__(self):
        where = "index bucket" if self.bucket is None else f"index bucket {self.bucket}"
        return f"{where} claims {self.count} entries but holds at most {self.cap}"


# ---- argument checks, shared by both backends so they fail alike -----------------

def _nbytes(buf):
    return memoryview(buf).nbytes


def _blocks(buf, bs):
    """(n, block length) of a buffer of blocks; see the module docstring."""
    size = _nbytes(buf)
    if isinstance(bs, int) and bs == size:
        return 1, size
    if not isinstance(bs, int) or bs <= 0 or size % bs:
        raise ValueError(f"a buffer of {size} bytes is not whole blocks of {bs} bytes")
    return size // bs, bs


def _byte(value, what):
    if not isinstance(value, int) or not 0 <= value <= 255:
        raise ValueError(f"{what} must be 0..255, not {value!r}")


def _uint(value, limit, what):
    if not isinstance(value, int) or not 0 <= value < limit:
        raise ValueError(f"{what} must be an integer in 0..{limit - 1}, not {value!r}")


def _flags(skip, n):
    if skip is not None and _nbytes(skip) != n:
        raise ValueError(f"skip must hold one flag per block ({n}), not {_nbytes(skip)}")


def _threads(threads):
    if not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be a positive integer, not {threads!r}")
    return min(threads, MAX_THREADS)


def _codec_args(enc_key, mac_key, zlevel):
    if enc_key is not None and _nbytes(enc_key) != KEY_SIZE:
        raise ValueError(f"enc_key must be {KEY_SIZE} bytes or None")
    _nbytes(mac_key)
    if not isinstance(zlevel, int) or not ZLEVEL_MIN <= zlevel <= ZLEVEL_MAX:
        raise ValueError(f"zlevel must be 0 (never compress) or a zstd level, not {zlevel!r}")


def _where(arena, iv, offset):
    _uint(arena, ARENA_LIMIT, "arena")
    if _nbytes(iv) != IV_SIZE:
        raise ValueError(f"iv must be {IV_SIZE} bytes")
    _uint(offset, ARENA_LIMIT, "offset")


def _pack_args(arena, iv, offset, btype, buf, bs, keys):
    _where(arena, iv, offset)
    _byte(btype, "btype")
    n, blen = _blocks(buf, bs)
    if _nbytes(keys) != n * SCORE_SIZE:
        raise ValueError(f"keys must be {SCORE_SIZE} bytes per block ({n} blocks)")
    if offset + n * (HEADER_SIZE + blen) > ARENA_LIMIT:
        raise ValueError("the records could run past the 4 GiB arena limit")
    return n, blen


def _span(buf, base):
    """The size of buf, a span of an arena from base."""
    size = _nbytes(buf)
    if base + size > ARENA_LIMIT:
        raise ValueError("the buffer runs past the 4 GiB arena limit")
    return size


def _outside(offsets, base, size):
    """ValueError for the first offset that is no record start inside buf, or None."""
    for off in offsets:
        if not isinstance(off, int) or not base <= off < base + size:
            return ValueError(f"offset {off!r} is not inside the buffer "
                              f"(arena offsets {base}..{base + size - 1})")
    return None


def _index_args(region, first, nregion, bucket_size, keylen, nbuckets):
    _uint(nbuckets, 1 << 64, "nbuckets")
    if nbuckets == 0:
        raise ValueError("nbuckets must be positive")
    _uint(first, nbuckets + 1, "first")
    _uint(nregion, nbuckets - first + 1, "nregion")
    if not isinstance(keylen, int) or keylen < 1:
        raise ValueError(f"keylen must be positive, not {keylen!r}")
    if not isinstance(bucket_size, int) or bucket_size < 4 + keylen + 8:
        raise ValueError(f"a bucket of {bucket_size} bytes cannot hold one entry")
    if _nbytes(region) < nregion * bucket_size:
        raise ValueError(f"region holds {_nbytes(region)} bytes, not {nregion} buckets")
    return (bucket_size - 4) // (keylen + 8)


def _bad_bucket(region, first, start, stop, bucket_size, cap):
    """BucketError for the first bucket in [start, stop) whose count exceeds cap."""
    mv = memoryview(region).cast("B")
    for b in range(start, stop):
        at = (b - first) * bucket_size
        count = int.from_bytes(mv[at:at + 4], "little")
        if count > cap:
            return BucketError(b, count, cap)
    return None


def _addrs(addrs):
    """addrs as a list of u64, or ValueError."""
    out = list(addrs)
    for a in out:
        if not isinstance(a, int) or not 0 <= a < 1 << 64:
            raise ValueError(f"an addr must be a u64, not {a!r}")
    return out


def _lookup_count(tables, keys, skip, keylen):
    """How many keys tables_lookup was given (shared by both backends)."""
    if keylen is None:
        if not tables:
            raise ValueError("tables_lookup takes keylen from the tables: pass keylen= with none")
        keylen = tables[0].keylen
    if any(t.keylen != keylen for t in tables):
        raise ValueError("tables_lookup needs tables of one key length")
    if _nbytes(keys) % keylen:
        raise ValueError(f"keys must be whole keys of {keylen} bytes")
    n = _nbytes(keys) // keylen
    _flags(skip, n)
    return n


# The reference needs the names above; import it only now.
from foundation.native import reference as reference_impl  # noqa: E402


# ---- the C core behind thin wrappers ------------------------------------------------

# C functions added within API_VERSION 1: a module built before them is stale too.
_NEWEST = ("fdn_unpack_many",)


def _load_native():
    """foundation._native, or None and why not."""
    try:
        from foundation import _native
    except ImportError as e:
        return None, (f"the C core foundation._native is not built ({e}). Build it with "
                      "`pip install -e .` (needs gcc, pkg-config, libssl-dev, libzstd-dev), "
                      "or set FOUNDATION_NATIVE=0 to run on the slow pure-Python reference")
    version = _native.lib.fdn_api_version()
    missing = [f for f in _NEWEST if not hasattr(_native.lib, f)]
    if version != API_VERSION or missing:
        return None, (f"the C core foundation._native is stale: API version {version}"
                      f"{', without ' + ', '.join(missing) if missing else ''}, "
                      f"this package needs {API_VERSION}. Rebuild it with `pip install -e .` "
                      "or `python foundation/native/build.py`")
    return _native, None


_native, _why = _load_native()
_ffi = _native.ffi if _native else None
_lib = _native.lib if _native else None


class _Native:
    """The native backend: check arguments, allocate outputs, map error codes."""

    name = "native"

    @staticmethod
    def zero_flags(buf, bs):
        n, _ = _blocks(buf, bs)
        out = _alloc("uint8_t[]", n)
        _ok(_lib.fdn_zero_flags(_ro(buf), _nbytes(buf), bs, out, n))
        return _ffi.buffer(out, n)[:]

    @staticmethod
    def scores(buf, bs, btype, key=None, skip=None, threads=1):
        n, _ = _blocks(buf, bs)
        _byte(btype, "btype")
        _flags(skip, n)
        threads = _threads(threads)
        out = _alloc("uint8_t[]", n * SCORE_SIZE)
        k = _ffi.NULL if key is None else _ro(key)
        _ok(_lib.fdn_scores(_ro(buf), _nbytes(buf), bs, btype, k,
                            0 if key is None else _nbytes(key), key is not None,
                            _opt(skip), n, out, n * SCORE_SIZE, threads))
        return _ffi.buffer(out, n * SCORE_SIZE)[:]

    @staticmethod
    def weak_hashes(buf, bs, btype, seed, skip=None):
        n, _ = _blocks(buf, bs)
        _byte(btype, "btype")
        _uint(seed, 1 << 64, "seed")
        _flags(skip, n)
        out = _alloc("uint8_t[]", n * WEAK_SIZE)
        _ok(_lib.fdn_weak_hashes(_ro(buf), _nbytes(buf), bs, btype, seed, _opt(skip), n,
                                 out, n * WEAK_SIZE))
        return _ffi.buffer(out, n * WEAK_SIZE)[:]

    class Codec:
        """Keys and compression level for records; pools C contexts, thread-safe."""

        def __init__(self, enc_key, mac_key, zlevel):
            _codec_args(enc_key, mac_key, zlevel)
            c = _lib.fdn_codec_new(_ffi.NULL if enc_key is None else _ro(enc_key),
                                   0 if enc_key is None else KEY_SIZE,
                                   _ro(mac_key), _nbytes(mac_key), zlevel)
            if c == _ffi.NULL:
                raise MemoryError("cannot set up a record codec")
            self._c = _ffi.gc(c, _lib.fdn_codec_free)
            self.encrypted = enc_key is not None
            self.zlevel = zlevel

        def __repr__(self):
            return f"<native Codec encrypted={self.encrypted} zlevel={self.zlevel}>"

    @staticmethod
    def pack(codec, arena, iv, offset, btype, buf, bs, keys, threads=1):
        n, blen = _pack_args(arena, iv, offset, btype, buf, bs, keys)
        threads = _threads(threads)
        cap = n * (HEADER_SIZE + blen)
        offs = _alloc("uint64_t[]", n)
        out = _take(cap)  # room for the worst case; the records are copied out
        try:
            size = _ok(_lib.fdn_pack(_codec(codec, _Native), arena, _ro(iv), offset, btype,
                                     _ro(buf), _nbytes(buf), bs, _ro(keys), n * SCORE_SIZE,
                                     out, cap, offs, n, threads))
            return _ffi.buffer(out, size)[:], _ffi.unpack(offs, n)
        finally:
            _give(out)

    @staticmethod
    def unpack(codec, arena, iv, offset, rec):
        _where(arena, iv, offset)
        c = _codec(codec, _Native)
        size = _nbytes(rec)
        r = _ro(rec)
        e = _ffi.new("fdn_entry *")
        out = _take(0)
        try:
            rc = _lib.fdn_unpack(c, arena, _ro(iv), offset, r, size, e, out, len(out))
            if rc == _lib.FDN_ESPACE:  # a large block, its tag already checked
                _give(out)
                out = _take(e.rlen)
                rc = _lib.fdn_unpack(c, arena, _ro(iv), offset, r, size, e, out, len(out))
            _ok(rc, offset)
            return e.btype, _ffi.buffer(e.key)[:], _ffi.buffer(out, rc)[:]
        finally:
            _give(out)

    @staticmethod
    def unpack_many(codec, arena, iv, buf, base, offsets, threads=1):
        _where(arena, iv, base)
        c = _codec(codec, _Native)
        size = _span(buf, base)
        threads = _threads(threads)
        if isinstance(offsets, array.array) and offsets.itemsize == 8 and offsets.typecode in "QL":
            offs = _ffi.from_buffer("uint64_t[]", offsets)
        else:
            if not isinstance(offsets, (list, tuple)):
                offsets = list(offsets)
            try:
                offs = _ffi.new("uint64_t[]", offsets)
            except (TypeError, OverflowError):
                raise _outside(offsets, base, size) or ValueError("offsets must be integers") from None
        n = len(offs)
        if n == 0:
            return []
        b = _ro(buf)
        pos = _alloc("uint64_t[]", n + 1)
        errs = _alloc("int32_t[]", n)
        btypes = _alloc("uint8_t[]", n)
        keys = _alloc("uint8_t[]", n * SCORE_SIZE)
        datas = []
        done = 0
        out = _take(UNPACK_CHUNK * threads)
        try:
            # one C call per chunk of records whose data fit in out, while it is in cache
            cap = min(len(out), UNPACK_CHUNK * threads)
            while done < n:
                k = _lib.fdn_unpack_many(c, arena, _ro(iv), b, size, base, offs + done, n - done,
                                         out, cap, pos, errs + done, btypes + done,
                                         keys + done * SCORE_SIZE, (n - done) * SCORE_SIZE,
                                         threads)
                if k == _lib.FDN_EARG:
                    raise _outside(offs, base, size) or ValueError("the C core refused its arguments")
                if _ok(k) == 0:
                    raise RuntimeError("the C core decoded no record")  # never: no endless loop
                # the records' data as bytes, cut by struct: no Python code per record
                p = _ffi.unpack(pos, k + 1)
                cut = "s".join(map(str, map(operator.sub, p[1:], p)))
                datas += struct.Struct(f"={cut}s").unpack(_ffi.buffer(out, p[k]))
                done += k
        finally:
            _give(out)
        keyed = struct.Struct("=" + f"{SCORE_SIZE}s" * n).unpack(_ffi.buffer(keys))
        items = list(zip(_ffi.buffer(btypes)[:], keyed, datas))
        if _ffi.buffer(errs)[:].count(0) != 4 * n:  # some record is bad, or too big to batch
            mv = memoryview(buf).cast("B")
            for i, rc in enumerate(_ffi.unpack(errs, n)):
                if rc == _lib.FDN_ESPACE:  # its tag is checked before room is made for it
                    off = offs[i]
                    try:
                        items[i] = _Native.unpack(codec, arena, iv, off, mv[off - base:])
                    except RecordError as bad:
                        items[i] = bad
                elif rc:
                    items[i] = RecordError(_KINDS[rc], offs[i])
        return items

    @staticmethod
    def scan(codec, arena, iv, buf, base, verify=True):
        _where(arena, iv, base)
        c = _codec(codec, _Native)
        size = _span(buf, base)
        b = _ro(buf)
        cap = min(size // HEADER_SIZE + 1, 4096)
        ents = _ffi.new("fdn_entry[]", cap)
        end = _ffi.new("uint64_t *", base)
        err = _ffi.new("int *")
        entries = []
        while True:
            done = end[0] - base
            k = _lib.fdn_scan(c, arena, b + done, size - done, end[0], bool(verify),
                              ents, cap, end, err)
            for e in ents[0:k]:
                entries.append((e.off, e.btype, _ffi.buffer(e.key)[:], e.slen, e.rlen))
            if err[0] != _lib.FDN_ESPACE:
                break
        if err[0] == _lib.FDN_OK:
            return entries, end[0], None
        if err[0] in _KINDS:
            return entries, end[0], RecordError(_KINDS[err[0]], end[0])
        _ok(err[0])

    @staticmethod
    def bucket_home(key, nbuckets):
        _uint(nbuckets, 1 << 64, "nbuckets")
        return _lib.fdn_bucket_home(_ro(key), _nbytes(key), nbuckets)

    @staticmethod
    def bucket_find(bucket, keylen, key):
        size = _nbytes(bucket)
        if not isinstance(keylen, int) or keylen < 1 or _nbytes(key) != keylen or size < 4:
            raise ValueError("bucket_find needs a bucket of at least 4 bytes and a key of keylen bytes")
        cap = (size - 4) // (keylen + 8)
        out = _alloc("uint64_t[]", cap)
        k = _lib.fdn_bucket_find(_ro(bucket), size, keylen, _ro(key), out, cap)
        if k == _lib.FDN_EBUCKET:
            raise BucketError(None, int.from_bytes(_ffi.buffer(_ro(bucket), 4), "little"), cap)
        return _ffi.unpack(out, _ok(k))

    @staticmethod
    def sort_entries(entries, entsize, keylen):
        if not isinstance(keylen, int) or keylen < 1 or not isinstance(entsize, int) \
                or entsize < keylen + 8 or _nbytes(entries) % entsize:
            raise ValueError("sort_entries needs whole entries of entsize >= keylen + 8 bytes")
        _ok(_lib.fdn_sort_entries(_rw(entries), _nbytes(entries), entsize, keylen))

    @staticmethod
    def merge(region, first, nregion, bucket_size, keylen, entries, nbuckets):
        cap = _index_args(region, first, nregion, bucket_size, keylen, nbuckets)
        size = _nbytes(entries)
        if size % (keylen + 8):
            raise ValueError(f"entries must be whole entries of {keylen + 8} bytes")
        spill = _alloc("uint8_t[]", size)
        k = _lib.fdn_merge(_rw(region), _nbytes(region), first, nregion, bucket_size, keylen,
                           _ro(entries), size, nbuckets, spill, size)
        if k == _lib.FDN_EBUCKET:
            raise _bad_bucket(region, first, first, first + nregion, bucket_size, cap)
        return _ffi.buffer(spill, _ok(k))[:]

    @staticmethod
    def lookup(region, first, nregion, bucket_size, keylen, key, nbuckets):
        cap = _index_args(region, first, nregion, bucket_size, keylen, nbuckets)
        if _nbytes(key) != keylen:
            raise ValueError(f"key must be keylen ({keylen}) bytes")
        home = max(_lib.fdn_bucket_home(_ro(key), keylen, nbuckets), first)
        if home >= first + nregion:
            raise ValueError(f"the key's home bucket {home} is past the region")
        more = _ffi.new("int *")
        want = 16
        while True:
            out = _alloc("uint64_t[]", want)
            k = _lib.fdn_lookup(_ro(region), _nbytes(region), first, nregion, bucket_size,
                                keylen, _ro(key), nbuckets, out, want, more)
            if k == _lib.FDN_EBUCKET:
                raise _bad_bucket(region, first, home, first + nregion, bucket_size, cap)
            if _ok(k) <= want:
                return _ffi.unpack(out, k), bool(more[0])
            want = k

    class Table:
        """The index cache: a multimap key -> addrs in insertion order."""

        def __init__(self, keylen, capacity_hint=0):
            if not isinstance(keylen, int) or keylen < 1:
                raise ValueError(f"keylen must be positive, not {keylen!r}")
            _uint(capacity_hint, 1 << 31, "capacity_hint")
            t = _lib.fdn_table_new(keylen, capacity_hint)
            if t == _ffi.NULL:
                raise MemoryError("cannot allocate a summary table")
            self._t = _ffi.gc(t, _lib.fdn_table_free)
            self.keylen = keylen

        def add(self, keys, addrs):
            if isinstance(addrs, array.array) and addrs.itemsize == 8 and addrs.typecode in "QL":
                n, a = len(addrs), _ffi.from_buffer("uint64_t[]", addrs)
            else:
                a = _addrs(addrs)
                n, a = len(a), _ffi.new("uint64_t[]", a)
            if _nbytes(keys) != n * self.keylen:
                raise ValueError(f"keys must be {self.keylen} bytes per addr ({n} addrs)")
            _ok(_lib.fdn_table_add(self._t, _ro(keys), n * self.keylen, a, n))

        def find(self, key):
            if _nbytes(key) != self.keylen:
                raise ValueError(f"key must be {self.keylen} bytes")
            want = 8
            while True:
                out = _alloc("uint64_t[]", want)
                k = _ok(_lib.fdn_table_find(self._t, _ro(key), self.keylen, out, want))
                if k <= want:
                    return _ffi.unpack(out, k)
                want = k

        def __len__(self):
            return _lib.fdn_table_len(self._t)

        def clear(self):
            _lib.fdn_table_clear(self._t)

    @staticmethod
    def tables_lookup(tables, keys, skip, keylen=None):
        tables = list(tables)
        for t in tables:
            if not isinstance(t, _Native.Table):
                raise TypeError("tables_lookup needs native Tables")
        n = _lookup_count(tables, keys, skip, keylen)
        addrs = _alloc("uint64_t[]", n)
        which = _alloc("int32_t[]", n)
        ts = _ffi.new("fdn_table *[]", [t._t for t in tables])
        _ok(_lib.fdn_tables_lookup(ts, len(tables), _ro(keys), _nbytes(keys), _opt(skip), n,
                                   addrs, which, n))
        return _ffi.unpack(addrs, n), _ffi.unpack(which, n)

    @staticmethod
    def equal(a, b):
        return bool(_lib.fdn_equal(_ro(a), _nbytes(a), _ro(b), _nbytes(b)))


if _native is not None:
    _alloc = _ffi.new_allocator(should_clear_after_alloc=False)
    _KINDS = {_lib.FDN_EMAGIC: "magic", _lib.FDN_ELENGTH: "length", _lib.FDN_ETAG: "tag",
              _lib.FDN_EDECOMPRESS: "decompress", _lib.FDN_ETRUNCATED: "truncated"}
    if (_lib.FDN_HEADER_SIZE, _lib.FDN_TAG_SIZE, _lib.FDN_KEY_SIZE, _lib.FDN_SCORE_SIZE) != \
            (HEADER_SIZE, TAG_SIZE, KEY_SIZE, SCORE_SIZE):
        _native, _why = None, "the C core disagrees with foundation.native on record sizes"


_tls = threading.local()
SCRATCH_MIN, SCRATCH_KEEP = 1 << 16, 1 << 25
UNPACK_CHUNK = 1 << 20  # unpack_many's output per call and thread: small enough to stay in cache


def _take(size):
    """A scratch output buffer of at least size bytes, this thread's if it has one.

    Fresh multi-megabyte buffers come from mmap and pay a page fault per
    page on first touch; the store packs ~16 MiB per call, so keeping one
    warm buffer per thread (up to SCRATCH_KEEP bytes) saves a third of pack.
    Taken, not borrowed: a signal handler packing meanwhile gets its own.
    """
    buf = _tls.__dict__.pop("scratch", None)
    if buf is None or len(buf) < size:
        buf = _alloc("uint8_t[]", max(size, SCRATCH_MIN))
    return buf


def _give(buf):
    if len(buf) <= SCRATCH_KEEP:
        _tls.scratch = buf


def _ro(buf):
    return _ffi.from_buffer("uint8_t[]", buf)


def _rw(buf):
    try:
        return _ffi.from_buffer("uint8_t[]", buf, require_writable=True)
    except BufferError:
        raise TypeError(f"a writable buffer is needed, not {type(buf).__name__}") from None


def _opt(buf):
    return _ffi.NULL if buf is None else _ro(buf)


def _codec(codec, impl):
    if not isinstance(codec, impl.Codec):
        raise TypeError(f"expected a {impl.name} Codec, not {type(codec).__name__}")
    return codec._c


def _ok(rc, offset=None):
    """rc if it is a count, else the exception the C error code stands for."""
    if rc >= 0:
        return rc
    if rc in _KINDS and offset is not None:
        raise RecordError(_KINDS[rc], offset)
    if rc == _lib.FDN_ENOMEM:
        raise MemoryError("the C core ran out of memory")
    if rc == _lib.FDN_EARG:
        raise ValueError("the C core refused its arguments")
    if rc == _lib.FDN_ECRYPTO:
        raise RuntimeError("OpenSSL failed in the C core")
    if rc == _lib.FDN_EZSTD:
        raise RuntimeError("zstd failed in the C core")
    raise RuntimeError(f"the C core failed with code {rc}")


# ---- the choice --------------------------------------------------------------------

native_impl = _Native if _native is not None else None

if os.environ.get("FOUNDATION_NATIVE", "1") == "0":
    _impl = reference_impl
elif native_impl is None:
    raise ImportError(_why)
else:
    _impl = native_impl

backend = _impl.name


def get(name):
    """The chosen backend's function or class called name."""
    if name not in API:
        raise AttributeError(f"foundation.native has no {name!r}")
    return getattr(_impl, name)


zero_flags = _impl.zero_flags
scores = _impl.scores
weak_hashes = _impl.weak_hashes
Codec = _impl.Codec
pack = _impl.pack
unpack = _impl.unpack
unpack_many = _impl.unpack_many
scan = _impl.scan
bucket_home = _impl.bucket_home
bucket_find = _impl.bucket_find
sort_entries = _impl.sort_entries
merge = _impl.merge
lookup = _impl.lookup
Table = _impl.Table
tables_lookup = _impl.tables_lookup
equal = _impl.equal
