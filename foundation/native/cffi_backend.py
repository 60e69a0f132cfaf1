"""The C core (foundation._native, built by cffi from csrc/) behind thin wrappers.

Each wrapper checks its arguments with checks.py, allocates the outputs
and maps the C error codes to RecordError, BucketError or a Python error,
so that it behaves exactly as its reference.py twin. Loading never fails:
`impl` is the backend, or None and `why` says what to do; the package
decides whether that is fatal.
"""

import array
import operator
import struct
import threading

from foundation.native import checks
from foundation.native.checks import (API_VERSION, ARENA_LIMIT, HEADER_SIZE, KEY_SIZE, SCORE_SIZE, TAG_SIZE, WEAK_SIZE, BucketError,
                                      RecordError)

# C functions added within API_VERSION 1: a module built before them is stale too.
_NEWEST = ("fdn_unpack_many", "fdn_unpack_at", "fdn_check", "fdn_tables_absent", "fdn_scan_cols", "fdn_table_take",
           "fdn_bloom_add", "fdn_plan_sweep", "fdn_fill", "fdn_seal", "fdn_bloom_test",
           "fdn_lanes")


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
# fdn_entry as laid out by the C compiler (off, slen, rlen, btype, codec, key[32], padding); checked below
_ENTRY = struct.Struct("=QIIBx32s6x")  # (the 6 bytes: runj, runk and padding)
if _ffi is not None and (_ffi.sizeof("fdn_entry"), _ffi.offsetof("fdn_entry", "key")) != (_ENTRY.size, 18):
    raise ImportError("the C core's fdn_entry layout is not the one cffi_backend reads: rebuild the C core")


class _Native:
    """The native backend: check arguments, allocate outputs, map error codes."""

    name = "native"

    @staticmethod
    def zero_flags(buf, bs):
        n, _ = checks.blocks(buf, bs)
        out = _alloc("uint8_t[]", n)
        _ok(_lib.fdn_zero_flags(_ro(buf), checks.nbytes(buf), bs, out, n))
        return _ffi.buffer(out, n)[:]

    @staticmethod
    def scores(buf, bs, btype, key=None, skip=None, threads=1):
        n, _ = checks.blocks(buf, bs)
        checks.byte(btype, "btype")
        checks.flags(skip, n)
        threads = checks.thread_count(threads)
        out = _alloc("uint8_t[]", n * SCORE_SIZE)
        k = _ffi.NULL if key is None else _ro(key)
        _ok(_lib.fdn_scores(_ro(buf), checks.nbytes(buf), bs, btype, k,
                            0 if key is None else checks.nbytes(key), key is not None,
                            _opt(skip), n, out, n * SCORE_SIZE, threads))
        return _ffi.buffer(out, n * SCORE_SIZE)[:]

    @staticmethod
    def lanes(on):
        """Scores four blocks at a time where the CPU has SHA instructions (on: True, the default),
        or one at a time through OpenSSL (False) -> whether the lanes are on. Not in the API: a knob
        of the C core's for tests and benchmarks, which compare the two."""
        return bool(_lib.fdn_lanes(1 if on else 0))

    @staticmethod
    def weak_hashes(buf, bs, btype, seed, skip=None):
        n, _ = checks.blocks(buf, bs)
        checks.byte(btype, "btype")
        checks.uint(seed, 1 << 64, "seed")
        checks.flags(skip, n)
        out = _alloc("uint8_t[]", n * WEAK_SIZE)
        _ok(_lib.fdn_weak_hashes(_ro(buf), checks.nbytes(buf), bs, btype, seed, _opt(skip), n,
                                 out, n * WEAK_SIZE))
        return _ffi.buffer(out, n * WEAK_SIZE)[:]

    class Codec:
        """Keys and compression level for records; pools C contexts, thread-safe."""

        def __init__(self, enc_key, mac_key, zlevel, tag_key=None):
            checks.codec_args(enc_key, mac_key, zlevel, tag_key)
            c = _lib.fdn_codec_new(_ffi.NULL if enc_key is None else _ro(enc_key),
                                   0 if enc_key is None else KEY_SIZE,
                                   _ro(mac_key), checks.nbytes(mac_key),
                                   _ffi.NULL if tag_key is None else _ro(tag_key),
                                   0 if tag_key is None else KEY_SIZE, zlevel)
            if c == _ffi.NULL:
                raise MemoryError("cannot set up a record codec: out of memory, or this OpenSSL lacks "
                                  "AES-256-CTR, SHA-256 or Poly1305")
            self._c = _ffi.gc(c, _lib.fdn_codec_free)
            self.encrypted = enc_key is not None
            self.zlevel = zlevel
            self.tag = "hmac" if tag_key is None else "poly1305"

        def __repr__(self):
            return f"<native Codec encrypted={self.encrypted} zlevel={self.zlevel} tag={self.tag}>"

    @staticmethod
    def pack(codec, arena, iv, offset, btype, buf, bs, keys, threads=1, out=None, scratch=None, run=1):
        n, blen = checks.pack_args(arena, iv, offset, btype, buf, bs, keys)
        threads = checks.thread_count(threads)
        run = checks.run_arg(run)
        cap = n * (HEADER_SIZE + blen)
        offs = _alloc("uint64_t[]", n)
        sc, sccap = (_ffi.NULL, 0) if scratch is None else (_rw(scratch), checks.nbytes(scratch))
        if out is not None:  # the caller's buffer: packed in place, nothing copied or allocated
            checks.pack_out(out, cap)
            size = _ok(_lib.fdn_pack(_codec(codec, _Native), arena, _ro(iv), offset, btype,
                                     _ro(buf), checks.nbytes(buf), bs, _ro(keys), n * SCORE_SIZE,
                                     _rw(out), cap, offs, n, threads, sc, sccap, run))
            return memoryview(out)[:size], _ffi.unpack(offs, n)
        out = _take(cap)  # room for the worst case; the records are copied out
        try:
            size = _ok(_lib.fdn_pack(_codec(codec, _Native), arena, _ro(iv), offset, btype,
                                     _ro(buf), checks.nbytes(buf), bs, _ro(keys), n * SCORE_SIZE,
                                     out, cap, offs, n, threads, sc, sccap, run))
            return _ffi.buffer(out, size)[:], _ffi.unpack(offs, n)
        finally:
            _give(out)

    @staticmethod
    def fill(codec, buf, bs, threads=1, scratch=None, run=1):
        n, blen = checks.blocks(buf, bs)
        threads = checks.thread_count(threads)
        run = checks.run_arg(run)
        payloads = checks.fill_scratch(scratch, n, blen)
        sizes, codecs, runs = array.array("I", bytes(4 * n)), bytearray(n), bytearray(2 * n)
        _ok(_lib.fdn_fill(_codec(codec, _Native), _ro(buf), checks.nbytes(buf), bs, _rw(payloads),
                          checks.nbytes(payloads), _ffi.from_buffer("uint32_t[]", sizes), _rw(codecs), n, threads,
                          run, _ffi.from_buffer("uint8_t[]", runs)))
        return checks.Filled(n, blen, sizes, codecs, payloads, runs)

    @staticmethod
    def seal(codec, arena, iv, offset, btype, buf, bs, keys, filled, first=0, room=ARENA_LIMIT, out=None,
             threads=1):
        n, blen = checks.seal_args(arena, iv, offset, btype, buf, bs, keys, filled, first, room)
        threads = checks.thread_count(threads)
        left = n - first
        offs = _alloc("uint64_t[]", max(1, left))
        tags = bytearray(left * TAG_SIZE)
        count = _ffi.new("size_t *")
        cap = min(room, left * (HEADER_SIZE + blen))
        if out is not None:
            checks.pack_out(out, 0)
            dst, cap = _rw(out), min(cap, checks.nbytes(out))
        else:
            dst = _take(cap)
        try:
            size = _ok(_lib.fdn_seal(_codec(codec, _Native), arena, _ro(iv), offset, btype, _ro(buf),
                                     checks.nbytes(buf), bs, _ro(keys), n * SCORE_SIZE, _ro(filled.payloads),
                                     checks.nbytes(filled.payloads), _ffi.from_buffer("uint32_t[]", filled.sizes),
                                     _ro(filled.codecs), _opt(filled.runs), n, first, room, dst, cap, offs, _rw(tags),
                                     count, threads))
            k = count[0]
            recs = memoryview(out)[:size] if out is not None else _ffi.buffer(dst, size)[:]
        finally:
            if out is None:
                _give(dst)
        return recs, _ffi.unpack(offs, k), bytes(tags[:k * TAG_SIZE])

    @staticmethod
    def unpack(codec, arena, iv, offset, rec, base=None):
        checks.where(arena, iv, offset)
        base = checks.rec_base(rec, offset, base)
        c = _codec(codec, _Native)
        size = checks.nbytes(rec)
        r = _ro(rec)
        e = _ffi.new("fdn_entry *")
        out = _take(0)
        try:
            rc = _lib.fdn_unpack(c, arena, _ro(iv), offset, r, size, base, e, out, len(out))
            if rc == _lib.FDN_ESPACE:  # a large block, its tag already checked
                _give(out)
                out = _take(e.rlen)
                rc = _lib.fdn_unpack(c, arena, _ro(iv), offset, r, size, base, e, out, len(out))
            if rc == _lib.FDN_EARG:
                raise ValueError("the C core refused its arguments")
            _ok(rc, e.off if rc in (_lib.FDN_EMAGIC, _lib.FDN_ELENGTH, _lib.FDN_ETAG, _lib.FDN_ETRUNCATED)
                else offset)
            return e.btype, _ffi.buffer(e.key)[:], _ffi.buffer(out, rc)[:]
        finally:
            _give(out)

    @staticmethod
    def unpack_many(codec, arena, iv, buf, base, offsets, threads=1):
        c, size, threads, offs = _many_args(codec, arena, iv, buf, base, offsets, threads)
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
                    raise checks.outside(offs, base, size) or ValueError("the C core refused its arguments")
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
            for i, rc in enumerate(_ffi.unpack(errs, n)):
                if rc == _lib.FDN_ESPACE:  # too big to batch: decoded alone, its tag checked first
                    try:
                        items[i] = _Native.unpack(codec, arena, iv, offs[i], buf, base)
                    except RecordError as bad:
                        items[i] = RecordError(bad.kind, bad.offset)  # (no traceback: it holds buf)
                elif rc:
                    items[i] = _why_bad(rc, codec, arena, iv, offs[i], buf, base)
        return items

    @staticmethod
    def unpack_blocks(codec, arena, iv, buf, base, offsets, bs, out=None, threads=1, slots=None):
        if slots is not None:
            return _Native._unpack_at(codec, arena, iv, buf, base, offsets, bs, out, threads, slots)
        c, size, threads, offs = _many_args(codec, arena, iv, buf, base, offsets, threads)
        n = len(offs)
        out = checks.blocks_out(out, n, bs)
        keys = bytearray(n * SCORE_SIZE)
        bad = {}
        if n == 0:
            return out, bytes(keys), bad
        o, kb, b, ivb = _rw(out), _ffi.from_buffer("uint8_t[]", keys), _ro(buf), _ro(iv)
        pos = _alloc("uint64_t[]", n + 1)
        errs = _alloc("int32_t[]", n)
        btypes = _alloc("uint8_t[]", n)
        done = 0
        while done < n:
            # out's room is exactly the blocks left: records of bs bytes each land in their own slot
            k = _lib.fdn_unpack_many(c, arena, ivb, b, size, base, offs + done, n - done, o + done * bs,
                                     (n - done) * bs, pos, errs + done, btypes + done, kb + done * SCORE_SIZE,
                                     (n - done) * SCORE_SIZE, threads)
            if k == _lib.FDN_EARG:
                raise checks.outside(offs, base, size) or ValueError("the C core refused its arguments")
            if _ok(k) == 0:
                raise RuntimeError("the C core decoded no record")
            if _ffi.buffer(pos, (k + 1) * 8)[:] != array.array("Q", range(0, (k + 1) * bs, bs)).tobytes():
                # a record of another size (or a header too damaged to plan) moved its followers:
                # decode these one by one
                view = memoryview(out).cast("B")
                for i, item in enumerate(_Native.unpack_many(codec, arena, iv, buf, base, offs[done:done + k])):
                    j = done + i
                    if isinstance(item, RecordError) or len(item[2]) != bs:
                        bad[j] = item if isinstance(item, RecordError) else RecordError("length", offs[j])
                        keys[j * SCORE_SIZE:(j + 1) * SCORE_SIZE] = bytes(SCORE_SIZE)
                    else:
                        view[j * bs:(j + 1) * bs] = item[2]
                        keys[j * SCORE_SIZE:(j + 1) * SCORE_SIZE] = item[1]
            elif _ffi.buffer(errs + done, 4 * k)[:].count(0) != 4 * k:
                for i, rc in enumerate(_ffi.unpack(errs + done, k)):
                    if rc:
                        bad[done + i] = _why_bad(rc, codec, arena, iv, offs[done + i], buf, base)
            done += k
        return out, bytes(keys), bad

    @staticmethod
    def _unpack_at(codec, arena, iv, buf, base, offsets, bs, out, threads, slots):
        """unpack_blocks with slots: one C call decodes every record to its slot (fdn_unpack_at)."""
        c, size, threads, offs = _many_args(codec, arena, iv, buf, base, offsets, threads)
        n = len(offs)
        if isinstance(slots, array.array) and slots.itemsize == 8 and slots.typecode in "qQlL" and \
                (not n or min(slots) >= 0) and len(slots) == n and out is not None:
            sl = _ffi.from_buffer("uint64_t[]", slots)  # in place: non-negative, the same bits
        else:
            sl = _ffi.new("uint64_t[]", checks.blocks_at(out, slots, n, bs) or [0])
        keys = bytearray(n * SCORE_SIZE)
        bad = {}
        if n == 0:
            return out, bytes(keys), bad
        errs = _alloc("int32_t[]", n)
        btypes = _alloc("uint8_t[]", n)
        k = _lib.fdn_unpack_at(c, arena, _ro(iv), _ro(buf), size, base, offs, n, _rw(out), checks.nbytes(out),
                               sl, bs, errs, btypes, _ffi.from_buffer("uint8_t[]", keys), n * SCORE_SIZE, threads)
        if k == _lib.FDN_EARG:
            raise checks.outside(offs, base, size) or ValueError("a slot is not a block of out")
        _ok(k)
        if _ffi.buffer(errs)[:].count(0) != 4 * n:  # some record is bad, or holds other than bs bytes
            view = memoryview(out).cast("B")
            for i, rc in enumerate(_ffi.unpack(errs, n)):
                if rc == _lib.FDN_ESPACE:  # another length: decoded alone, its tag checked first
                    try:
                        item = _Native.unpack(codec, arena, iv, offs[i], buf, base)
                    except RecordError as e:
                        item = RecordError(e.kind, e.offset)  # (no traceback: it holds buf)
                    if not isinstance(item, RecordError) and len(item[2]) == bs:
                        view[sl[i] * bs:(sl[i] + 1) * bs] = item[2]
                        keys[i * SCORE_SIZE:(i + 1) * SCORE_SIZE] = item[1]
                        continue
                    bad[i] = item if isinstance(item, RecordError) else RecordError("length", offs[i])
                elif rc:
                    bad[i] = _why_bad(rc, codec, arena, iv, offs[i], buf, base)
        return out, bytes(keys), bad

    @staticmethod
    def scan(codec, arena, iv, buf, base, verify=True):
        checks.where(arena, iv, base)
        c = _codec(codec, _Native)
        size = checks.span(buf, base)
        b = _ro(buf)
        cap = min(size // HEADER_SIZE + 1, 4096)
        ents = _ffi.new("fdn_entry[]", cap)
        end = _ffi.new("uint64_t *", base)
        err = _ffi.new("int *")
        entries = []
        while True:
            done = end[0] - base
            k = _lib.fdn_scan(c, arena, _ro(iv), b + done, size - done, end[0], bool(verify),
                              ents, cap, end, err)
            # the array's bytes in one struct pass, not a cdata field access per record
            entries += [(off, btype, key, slen, rlen)
                        for off, slen, rlen, btype, key in _ENTRY.iter_unpack(_ffi.buffer(ents, k * _ENTRY.size))]
            if err[0] != _lib.FDN_ESPACE:
                break
        return _walked(entries, end[0], err[0])

    @staticmethod
    def scan_columns(codec, arena, iv, buf, base, keylen=SCORE_SIZE, verify=True):
        checks.where(arena, iv, base)
        checks.key_length(keylen)
        c = _codec(codec, _Native)
        size = checks.span(buf, base)
        b = _ro(buf)
        cap = min(size // HEADER_SIZE + 1, 4096)
        ents, offs, btypes = _alloc("fdn_entry[]", cap), _alloc("uint64_t[]", cap), _alloc("uint8_t[]", cap)
        keys, tags = _alloc("uint8_t[]", cap * keylen), _alloc("uint8_t[]", cap * TAG_SIZE)
        end = _ffi.new("uint64_t *", base)
        err = _ffi.new("int *")
        got_offs, got_types, got_keys, got_tags = array.array("Q"), bytearray(), bytearray(), bytearray()
        while True:
            done = end[0] - base
            k = _lib.fdn_scan_cols(c, arena, _ro(iv), b + done, size - done, end[0], bool(verify), ents, cap,
                                   offs, btypes, keys, keylen, tags, end, err)
            if k > 0:
                got_offs.frombytes(_ffi.buffer(offs, 8 * k))
                got_types += _ffi.buffer(btypes, k)
                got_keys += _ffi.buffer(keys, k * keylen)
                got_tags += _ffi.buffer(tags, k * TAG_SIZE)
            if err[0] != _lib.FDN_ESPACE:
                break
        got = checks.Scanned(got_offs, bytes(got_types), bytes(got_keys), bytes(got_tags))
        return _walked(got, end[0], err[0])

    @staticmethod
    def check_span(codec, arena, iv, buf, base, depth=checks.DECODED, score_key=None, threads=1, start=None):
        checks.where(arena, iv, base)
        checks.depth(depth)
        c = _codec(codec, _Native)
        size = checks.span(buf, base)
        start = checks.walk_start(base, size, start)
        threads = checks.thread_count(threads)
        b = _ro(buf)
        k = _ffi.NULL if score_key is None else _ro(score_key)
        cap = min(size // HEADER_SIZE + 1, CHECK_BATCH)
        ents, errs = _alloc("fdn_entry[]", cap), _alloc("int32_t[]", cap)
        offs, raws = _alloc("uint64_t[]", cap), _alloc("uint32_t[]", cap)
        btypes, tags = _alloc("uint8_t[]", cap), _alloc("uint8_t[]", cap * TAG_SIZE)
        end = _ffi.new("uint64_t *", start)
        err = _ffi.new("int *")
        got = checks.Checked([], b"", [], b"", {})
        while True:
            # the whole of buf each call, the walk from where the last stopped: a run's members
            # before that are still there to decode it
            n = _ok(_lib.fdn_check(c, arena, _ro(iv), b, size, base, end[0], depth, k,
                                   0 if score_key is None else checks.nbytes(score_key), ents, cap, offs, raws,
                                   btypes, tags, errs, end, err, threads))
            if _ffi.buffer(errs, 4 * n)[:].count(0) != 4 * n:   # no Python per record unless one is bad
                first = len(got.offs)
                got.problems.update((first + i, _PROBLEM[r]) for i, r in enumerate(_ffi.unpack(errs, n)) if r)
            got = got._replace(offs=got.offs + _ffi.unpack(offs, n), btypes=got.btypes + _ffi.buffer(btypes, n)[:],
                               raws=got.raws + _ffi.unpack(raws, n),
                               tags=got.tags + _ffi.buffer(tags, n * TAG_SIZE)[:])
            if err[0] != _lib.FDN_ESPACE:
                break
        return _walked(got, end[0], err[0])

    @staticmethod
    def bucket_home(key, nbuckets):
        checks.uint(nbuckets, 1 << 64, "nbuckets")
        return _lib.fdn_bucket_home(_ro(key), checks.nbytes(key), nbuckets)

    @staticmethod
    def bucket_find(bucket, keylen, key):
        size = checks.nbytes(bucket)
        if not isinstance(keylen, int) or keylen < 1 or checks.nbytes(key) != keylen or size < 4:
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
                or entsize < keylen + 8 or checks.nbytes(entries) % entsize:
            raise ValueError("sort_entries needs whole entries of entsize >= keylen + 8 bytes")
        _ok(_lib.fdn_sort_entries(_rw(entries), checks.nbytes(entries), entsize, keylen))

    @staticmethod
    def merge(region, first, nregion, bucket_size, keylen, entries, nbuckets):
        cap = checks.index_args(region, first, nregion, bucket_size, keylen, nbuckets)
        size = checks.nbytes(entries)
        if size % (keylen + 8):
            raise ValueError(f"entries must be whole entries of {keylen + 8} bytes")
        spill = _alloc("uint8_t[]", size)
        k = _lib.fdn_merge(_rw(region), checks.nbytes(region), first, nregion, bucket_size, keylen,
                           _ro(entries), size, nbuckets, spill, size)
        if k == _lib.FDN_EBUCKET:
            raise checks.bad_bucket(region, first, first, first + nregion, bucket_size, cap)
        return _ffi.buffer(spill, _ok(k))[:]

    @staticmethod
    def lookup(region, first, nregion, bucket_size, keylen, key, nbuckets):
        cap = checks.index_args(region, first, nregion, bucket_size, keylen, nbuckets)
        if checks.nbytes(key) != keylen:
            raise ValueError(f"key must be keylen ({keylen}) bytes")
        home = max(_lib.fdn_bucket_home(_ro(key), keylen, nbuckets), first)
        if home >= first + nregion:
            raise ValueError(f"the key's home bucket {home} is past the region")
        more = _ffi.new("int *")
        want = 16
        while True:
            out = _alloc("uint64_t[]", want)
            k = _lib.fdn_lookup(_ro(region), checks.nbytes(region), first, nregion, bucket_size,
                                keylen, _ro(key), nbuckets, out, want, more)
            if k == _lib.FDN_EBUCKET:
                raise checks.bad_bucket(region, first, home, first + nregion, bucket_size, cap)
            if _ok(k) <= want:
                return _ffi.unpack(out, k), bool(more[0])
            want = k

    class Table:
        """The index cache: a multimap key -> addrs in insertion order."""

        def __init__(self, keylen, capacity_hint=0):
            if not isinstance(keylen, int) or keylen < 1:
                raise ValueError(f"keylen must be positive, not {keylen!r}")
            checks.uint(capacity_hint, 1 << 31, "capacity_hint")
            t = _lib.fdn_table_new(keylen, capacity_hint)
            if t == _ffi.NULL:
                raise MemoryError("cannot allocate a summary table")
            self._t = _ffi.gc(t, _lib.fdn_table_free)
            self.keylen = keylen

        def add(self, keys, addrs):
            if isinstance(addrs, array.array) and addrs.itemsize == 8 and addrs.typecode in "QL":
                n, a = len(addrs), _ffi.from_buffer("uint64_t[]", addrs)
            else:
                a = checks.addr_list(addrs)
                n, a = len(a), _ffi.new("uint64_t[]", a)
            if checks.nbytes(keys) != n * self.keylen:
                raise ValueError(f"keys must be {self.keylen} bytes per addr ({n} addrs)")
            _ok(_lib.fdn_table_add(self._t, _ro(keys), n * self.keylen, a, n))

        def find(self, key):
            if checks.nbytes(key) != self.keylen:
                raise ValueError(f"key must be {self.keylen} bytes")
            want = 8
            while True:
                out = _alloc("uint64_t[]", want)
                k = _ok(_lib.fdn_table_find(self._t, _ro(key), self.keylen, out, want))
                if k <= want:
                    return _ffi.unpack(out, k)
                want = k

        def entries(self):
            es = self.keylen + 8
            while True:
                n = len(self)
                out = bytearray(n * es)
                k = _ok(_lib.fdn_table_entries(self._t, _ffi.from_buffer(out), len(out)))
                if k == n:  # (else entries were added meanwhile: again with room for them)
                    return out

        def take(self):
            es = self.keylen + 8
            p = _ffi.new("uint8_t **")
            n = _ok(_lib.fdn_table_take(self._t, p))
            if n == 0:
                return bytearray()
            # the table's own memory, freed with the last view of it
            size = n * es
            mem = _ffi.gc(p[0], lambda c: _lib.fdn_entries_free(c, size), size=size)
            return memoryview(_ffi.buffer(mem, size))

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
        n = checks.lookup_count(tables, keys, skip, keylen)
        addrs = _alloc("uint64_t[]", n)
        which = _alloc("int32_t[]", n)
        ts = _ffi.new("fdn_table *[]", [t._t for t in tables])
        _ok(_lib.fdn_tables_lookup(ts, len(tables), _ro(keys), checks.nbytes(keys), _opt(skip), n,
                                   addrs, which, n))
        return _ffi.unpack(addrs, n), _ffi.unpack(which, n)

    @staticmethod
    def bloom_add(words, nbits, seeds, keys, keylen, step=None):
        seeds, step = checks.bloom_args(words, nbits, seeds, keys, keylen, step)
        s = _ffi.new("uint32_t[]", seeds)
        _ok(_lib.fdn_bloom_add(_rw(words), checks.nbytes(words), nbits, s, len(seeds), _ro(keys),
                               checks.nbytes(keys), keylen, step))

    @staticmethod
    def bloom_test(words, nbits, seeds, keys, keylen, step=None):
        seeds, step = checks.bloom_args(words, nbits, seeds, keys, keylen, step)
        s = _ffi.new("uint32_t[]", seeds)
        n = checks.nbytes(keys) // step
        out = bytearray(n)
        _ok(_lib.fdn_bloom_test(_ro(words), checks.nbytes(words), nbits, s, len(seeds), _ro(keys),
                                checks.nbytes(keys), keylen, step, _ffi.from_buffer(out)))
        return bytes(out)

    @staticmethod
    def tables_absent(tables, keys):
        tables = list(tables)
        for t in tables:
            if not isinstance(t, _Native.Table):
                raise TypeError("tables_absent needs native Tables")
        n = checks.absent_count(tables, keys)
        out = _alloc("uint64_t[]", max(n, 1))
        ts = _ffi.new("fdn_table *[]", [t._t for t in tables])
        m = _ok(_lib.fdn_tables_absent(ts, len(tables), _ro(keys), checks.nbytes(keys), out, n))
        return _ffi.unpack(out, m)

    @staticmethod
    def equal(a, b):
        return bool(_lib.fdn_equal(_ro(a), checks.nbytes(a), _ro(b), checks.nbytes(b)))

    # ---- a restore's plan of one window (csrc/plan.c) ----

    @staticmethod
    def plan_sweep(table, akeys, aaddrs, found, done):
        if not isinstance(table, _Native.Table):
            raise TypeError("plan_sweep needs a native Table")
        n = checks.plan_sweep_args(table, akeys, aaddrs, found, done)
        return _ok(_lib.fdn_plan_sweep(table._t, _ro(akeys), checks.nbytes(akeys), _u64(aaddrs), n,
                                       _ffi.from_buffer("uint64_t[]", found, require_writable=True),
                                       _rw(done), len(found)))

    @staticmethod
    def plan_order(found, live, refs, rs):
        m = checks.plan_order_args(found, live, refs, rs)
        addrs, positions, keyed = array.array("Q", bytes(8 * m)), array.array("q", bytes(8 * m)), bytearray(m * rs)
        _ok(_lib.fdn_plan_order(_u64(found), m, _ffi.NULL if live is None else _i64(live), m if live is not None else 0,
                                _ro(refs), checks.nbytes(refs), rs, _ffi.from_buffer("uint64_t[]", addrs),
                                _ffi.from_buffer("int64_t[]", positions), _ffi.from_buffer(keyed), m * rs))
        return addrs, positions, bytes(keyed)

    @staticmethod
    def plan_cuts(addrs, gap, span, blocks, most):
        n = checks.plan_cuts_args(addrs, gap, span, blocks, most)
        out = array.array("Q", bytes(8 * n))
        k = _ok(_lib.fdn_plan_cuts(_u64(addrs), n, gap, span, blocks, most, _ffi.from_buffer("uint64_t[]", out), n))
        del out[k:]
        return out

    @staticmethod
    def plan_runs(leaf, positions):
        n = checks.plan_runs_args(leaf, positions)
        out = array.array("Q", bytes(8 * (n + 1)))
        k = _ok(_lib.fdn_plan_runs(_i64(leaf), len(leaf), _i64(positions), n,
                                   _ffi.from_buffer("uint64_t[]", out), n + 1))
        del out[k:]
        return out


if _native is not None:
    _alloc = _ffi.new_allocator(should_clear_after_alloc=False)
    _KINDS = {_lib.FDN_EMAGIC: "magic", _lib.FDN_ELENGTH: "length", _lib.FDN_ETAG: "tag",
              _lib.FDN_EDECOMPRESS: "decompress", _lib.FDN_ETRUNCATED: "truncated", _lib.FDN_ESPAN: "span"}
    _PROBLEM = {_lib.FDN_ETAG: "tag", _lib.FDN_EDECOMPRESS: "decompress",
                _lib.FDN_ESCORE: "score"}
    if (_lib.FDN_HEADER_SIZE, _lib.FDN_TAG_SIZE, _lib.FDN_KEY_SIZE, _lib.FDN_SCORE_SIZE,
            _lib.FDN_TAGS, _lib.FDN_DECODED, _lib.FDN_SCORED) != \
            (HEADER_SIZE, TAG_SIZE, KEY_SIZE, SCORE_SIZE, checks.TAGS, checks.DECODED, checks.SCORED):
        _native, _why = None, "the C core disagrees with foundation.native on record sizes"


_tls = threading.local()
SCRATCH_MIN, SCRATCH_KEEP = 1 << 16, 1 << 25
UNPACK_CHUNK = 1 << 20  # unpack_many's output per call and thread: small enough to stay in cache
CHECK_BATCH = 1 << 14   # records check_span finds per C call (a 16 MiB arena holds a few thousand)


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


def _why_bad(rc, codec, arena, iv, off, buf, base):
    """The RecordError of a record a batch found bad (its code rc), from decoding it alone: it
    names the record at fault (for a run slice, the member that failed). A run slice whose run
    the bytes do not hold ("span": a span's edge cut it, no damage) needs no decode: the batch
    says so only where the decode alone would (its own tag checked), and at that offset."""
    if rc == _lib.FDN_ESPAN:
        return RecordError("span", off)
    try:
        _Native.unpack(codec, arena, iv, off, buf, base)
    except RecordError as e:
        kind, at = e.kind, e.offset
    else:
        raise RuntimeError(f"the C core found the record at arena offset {off} bad, then good")
    # a new one: the caught one's traceback holds the frames that lent buf to C
    return RecordError(kind, at)


def _many_args(codec, arena, iv, buf, base, offsets, threads):
    """unpack_many's and unpack_blocks's arguments, checked: (codec, span size, threads, offsets)."""
    checks.where(arena, iv, base)
    c = _codec(codec, _Native)
    size = checks.span(buf, base)
    return c, size, checks.thread_count(threads), _offsets(offsets, base, size)


def _offsets(offsets, base, size):
    """offsets as a uint64_t[] for the C core (an array of 8-byte items is used in place)."""
    if isinstance(offsets, array.array) and offsets.itemsize == 8 and offsets.typecode in "QL":
        return _ffi.from_buffer("uint64_t[]", offsets)
    if not isinstance(offsets, (list, tuple)):
        offsets = list(offsets)
    try:
        return _ffi.new("uint64_t[]", offsets)
    except (TypeError, OverflowError):
        raise checks.outside(offsets, base, size) or ValueError("offsets must be integers") from None


def _u64(a):
    """An array of u64 for the C core: an array('Q') in place, else a copy."""
    if isinstance(a, array.array) and a.itemsize == 8 and a.typecode in "QL":
        return _ffi.from_buffer("uint64_t[]", a)
    return _ffi.new("uint64_t[]", checks.addr_list(a))


def _i64(a):
    """An array of i64 for the C core: an array('q') in place, else a copy."""
    if isinstance(a, array.array) and a.itemsize == 8 and a.typecode in "ql":
        return _ffi.from_buffer("int64_t[]", a)
    return _ffi.new("int64_t[]", list(a))


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


def _walked(got, end, err):
    """What a walk over records returns where it stopped (end): (got, end, None) at the span's end,
    (got, end, RecordError) at a bad record; any other error code is raised."""
    if err == _lib.FDN_OK:
        return got, end, None
    if err in _KINDS:
        return got, end, RecordError(_KINDS[err], end)
    _ok(err)


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


impl = _Native if _native is not None else None     # None: `why` says what is wrong
why = _why
