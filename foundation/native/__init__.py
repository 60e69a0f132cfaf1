"""The hot paths of the store, in C, with a pure-Python reference of each.

One API, implemented twice: by foundation._native (csrc/, built by cffi)
through the thin wrappers of cffi_backend.py, and by reference.py, which
is the specification in executable form and draws every byte layout.
Both check their arguments with checks.py, which also holds the sizes and
the errors; this module only chooses between them. Python owns
files and meaning; the C core only loops over buffers handed to it.

The backend is chosen once, at import. FOUNDATION_NATIVE=0 selects the
reference; otherwise the compiled module must be present and speak this
API_VERSION, or importing fails: a backup that silently runs forty times
slower is a broken backup.

    backend                       "native" or "reference"
    native_impl, reference_impl   both backends (native_impl is None when
                                  FOUNDATION_NATIVE=0 and it is not built;
                                  reference_impl is imported at its first use)
    get(name)                     the chosen backend's function or class

The API; every buf may be bytes, bytearray or memoryview. A buffer of
blocks holds n = len(buf) // bs whole blocks, or exactly one shorter block
when bs == len(buf).

    zero_flags(buf, bs) -> bytes                          n flags, 1 = all zero
    scores(buf, bs, btype, key=None, skip=None, threads=1) -> bytes    n * 32
    weak_hashes(buf, bs, btype, seed, skip=None) -> bytes               n * 8
    Codec(enc_key, mac_key, zlevel, tag_key=None)   tag_key: Poly1305 record tags under it; None: HMAC
    pack(codec, arena, iv, offset, btype, buf, bs, keys, threads=1, out=None, scratch=None, run=1)
        -> (records, offsets)
        out: a writable buffer of >= n * (HEADER_SIZE + blen) bytes to pack into (records
        is then a memoryview of it); None: records is new bytes. scratch: a writable buffer of
        >= n * blen bytes a pack on several threads may use (its contents unspecified after),
        kept by a caller that packs often; None (or too small): the pack allocates its own
    fill(codec, buf, bs, threads=1, scratch=None, run=1) -> Filled  pack in two steps: each block
    seal(codec, arena, iv, offset, btype, buf, bs, keys, filled, first=0, room=ARENA_LIMIT, out=None,
         threads=1) -> (records, offsets, tags)   compressed (fill) before it is known where its record
        goes; seal writes the records of blocks first, ... that fit in room bytes (and out), each
        byte for byte pack's, with their tags (16 bytes each, end to end). fill's scratch (>= n * bs
        bytes, else a new one) takes the zstd payloads; it may be buf itself (writable): each
        compressed block is then replaced by its payload, and seal is handed that same buf
    unpack(codec, arena, iv, offset, rec, base=None) -> (btype, key32, data)   or RecordError
        rec holds the arena's bytes from base (None: from offset) on
    unpack_many(codec, arena, iv, buf, base, offsets, threads=1) -> [(btype, key32, data) | RecordError]
    unpack_blocks(codec, arena, iv, buf, base, offsets, bs, out=None, threads=1, slots=None)
        -> (out, keys n * 32, {i: RecordError})      slots: item i's data at out[slots[i] * bs]
    scan(codec, arena, iv, buf, base, verify=True) -> (entries, end, error)
    scan_columns(codec, arena, iv, buf, base, keylen=32, verify=True)
        -> (Scanned(offs, btypes, keys, tags), end, error)
    check_span(codec, arena, iv, buf, base, depth=DECODED, score_key=None, threads=1, start=None)
        -> (Checked(offs, btypes, raws, tags, problems), end, error)
    bucket_home(key, nbuckets) -> int
    bucket_find(bucket, keylen, key) -> [addr]
    sort_entries(entries, entsize, keylen)                in place
    merge(region, first, nregion, bucket_size, keylen, entries, nbuckets) -> spill
    lookup(region, first, nregion, bucket_size, keylen, key, nbuckets) -> ([addr], more)
    Table(keylen, capacity_hint=0): add(keys, addrs), find(key), len, clear(),
        entries() -> bytearray of every (key, u64le addr) in insertion order,
        take() -> the same entries as a writable buffer, the table left empty (native: its own
        memory, handed over without a copy)
    tables_lookup(tables, keys, skip, keylen=None) -> ([addr], [which])
    tables_absent(tables, keys) -> [position]          keys no table holds, all-zero ones left out
    bloom_add(words, nbits, seeds, keys, keylen, step=None)   set the bits of the key at the start of
        every step bytes of keys in a pybloomfiltermmap3 filter's bit array (its u32 words), as its add() does
    bloom_test(words, nbits, seeds, keys, keylen, step=None) -> bytes   1 for each such key whose bits
        are all set (its `in`), 0 for the others
    equal(a, b) -> bool
    plan_sweep(table, akeys, aaddrs, found, done) -> filled       a restore's plan of one window,
    plan_order(found, live, refs, rs) -> (addrs, positions, keyed)  in whole arrays (reference.py
    plan_cuts(addrs, gap, span, blocks, most) -> ends               says what each computes)
    plan_runs(leaf, positions) -> starts

unpack_many decodes a batch of records from one span of one arena: buf
holds arena offsets [base, base + len(buf)), and every offset (any order,
repeats allowed) must lie in that span, else ValueError. Item i is what
unpack(codec, arena, iv, offsets[i], buf, base) returns, or
the RecordError it would raise: bad records are returned, never raised, so
the caller can name the arena and decide. threads splits the work and never
changes the result.

A run slice (codec 2, docs/format.md 5.2) decodes only with its whole run
of records in the bytes given: otherwise its RecordError is "span" (no
damage: read the run, store/layout.py run_span, and decode again). pack
and fill with run > 1 make runs of neighbouring compressible blocks (fill
says how); seal places a run whole or not at all.

unpack_blocks is unpack_many for records that each hold one block of bs
bytes (an image's leaves), with no Python object per record: item i's data
goes to out[i * bs:(i + 1) * bs] (out: a writable buffer of at least n * bs
bytes, or a new bytearray), its key to keys[i * 32:(i + 1) * 32]. A record
that fails, or holds other than bs bytes, is in the dict of bad items (a
RecordError, kind "length" for a wrong size); its slot and key are
unspecified (zeros in the reference). slots, when given (n non-negative
block numbers of out, which must then be given), put item i's data at
out[slots[i] * bs] instead: records read in log order decoded straight into
a window of the image in image order.

scan_columns is scan with its records in columns: offsets (an array of
u64), types, the first keylen bytes of each key field and each tag, end to
end; the open arena's scan at every open builds no object per record.

check_span is verify's check of one span of an arena in one call: the walk
of scan(verify=False), then each record found checked on `threads` threads
as deep as `depth` says: TAGS its tag; DECODED unpacked (tag, decryption,
decoding); SCORED its data scored (key=score_key) against its key field too.
Checked holds each record's offset, type, raw length and tag in arrays, and
{index: "tag" | "decompress" | "score"} for the records that fail: each
tag is computed once, and no Python runs per record unless one is bad.
"""

import os

from foundation.native import cffi_backend
from foundation.native.checks import (  # the API's sizes and errors, one definition for both backends
    API, API_VERSION, ARENA_LIMIT, HEADER_SIZE, IV_SIZE, KEY_SIZE, MAX_THREADS, RECORD_MAGIC, SCORE_SIZE,
    DECODED, SCORED, TAG_SIZE, TAGS, WEAK_SIZE, ZLEVEL_MAX, ZLEVEL_MIN, BucketError, Checked, Filled, RecordError,
    Scanned)

__all__ = ["API", "API_VERSION", "ARENA_LIMIT", "HEADER_SIZE", "IV_SIZE", "KEY_SIZE", "MAX_THREADS", "RECORD_MAGIC",
           "SCORE_SIZE", "TAG_SIZE", "WEAK_SIZE", "ZLEVEL_MAX", "ZLEVEL_MIN", "BucketError", "Checked", "Filled",
           "RecordError",
           "Scanned",
           "TAGS", "DECODED", "SCORED", "backend", "get", "native_impl", "reference_impl", *API]


# ---- the choice --------------------------------------------------------------------

native_impl = cffi_backend.impl


def __getattr__(name):
    # The reference (zstandard, cryptography's ciphers) is loaded only when asked for: a command
    # on the C core would pay ~15 ms of imports at every start for a backend it never calls.
    if name == "reference_impl":
        from foundation.native import reference
        globals()["reference_impl"] = reference
        return reference
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if os.environ.get("FOUNDATION_NATIVE", "1") == "0":
    from foundation.native import reference as reference_impl
    _impl = reference_impl
elif native_impl is None:
    raise ImportError(cffi_backend.why)
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
fill = _impl.fill
seal = _impl.seal
unpack = _impl.unpack
unpack_many = _impl.unpack_many
unpack_blocks = _impl.unpack_blocks
scan = _impl.scan
scan_columns = _impl.scan_columns
check_span = _impl.check_span
bucket_home = _impl.bucket_home
bucket_find = _impl.bucket_find
sort_entries = _impl.sort_entries
merge = _impl.merge
lookup = _impl.lookup
Table = _impl.Table
tables_lookup = _impl.tables_lookup
tables_absent = _impl.tables_absent
bloom_add = _impl.bloom_add
bloom_test = _impl.bloom_test
equal = _impl.equal
plan_sweep = _impl.plan_sweep
plan_order = _impl.plan_order
plan_cuts = _impl.plan_cuts
plan_runs = _impl.plan_runs
