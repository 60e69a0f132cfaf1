"""What both backends of foundation.native share: the sizes, the errors, the argument checks.

The C core and the reference must fail alike on the same bad arguments, so
every check is written once, here, and both call it before working;
neither backend imports the other or the package that chooses between them.
"""

import array
import sys
from collections import namedtuple

API_VERSION = 3

SCORE_SIZE = 32  # SHA-256; the record's key field
WEAK_SIZE = 8  # weak hash, u64 big-endian
HEADER_SIZE = 4 + 1 + 1 + 2 + 4 + 4 + SCORE_SIZE + 16  # = 64, see reference.py
TAG_SIZE = 16  # Poly1305, or HMAC-SHA256 truncated
KEY_SIZE = 32  # AES-256
IV_SIZE = 16  # an arena's initial AES-CTR counter block
RECORD_MAGIC = b"FDNr"
ARENA_LIMIT = 1 << 32  # arena offsets are u32
ZLEVEL_MIN, ZLEVEL_MAX = -(1 << 17), 22  # zstd's own bounds; 0 = never compress
MAX_THREADS = 64
RUN_MAX = 64  # most records in a run (codec 2)
RUN_BYTES = 1 << 20  # a writer's most raw bytes in a run

API = ("zero_flags", "scores", "weak_hashes", "Codec", "pack", "fill", "seal", "unpack", "unpack_many",
       "unpack_blocks", "scan", "scan_columns", "check_span", "bucket_home", "bucket_find", "sort_entries", "merge", "lookup", "Table",
       "tables_lookup", "equal", "tables_absent", "bloom_add", "bloom_test",
       "plan_sweep", "plan_order", "plan_cuts", "plan_runs")


TAGS, DECODED, SCORED = 0, 1, 2   # how deep check_span checks: tags; and decoding; and scores


def depth(value):
    if value not in (TAGS, DECODED, SCORED):
        raise ValueError(f"depth must be TAGS, DECODED or SCORED (0, 1, 2), not {value!r}")


class Filled(namedtuple("Filled", "n blen sizes codecs payloads runs", defaults=(None,))):
    """A batch fill() decided, for seal(): n blocks of blen bytes, each one's stored length
    (sizes, an array of u32) and codec (codecs: 0 raw, 1 zstd, 2 run slice), a zstd payload at
    payloads[i * blen]; runs[2i], runs[2i + 1]: block i's place j in its run and the run's
    length k (0, 0 alone), the run's zero-padded frame at payloads[first * blen], slice j at
    payloads[first * blen + j * sizes[i]]. Made by one backend, sealed by the same one. (namedtuple,
    not typing.NamedTuple: `typing` costs a command that does not load libvirt ~2 ms.)"""

    __slots__ = ()


class Checked(namedtuple("Checked", "offs btypes raws tags problems")):
    """What check_span found: the records the walk met, each one's offset, type, raw length and tag
    (tags: 16 bytes each, end to end), and the problems of the bad ones {index: "tag" | "decompress"
    | "score"}."""

    __slots__ = ()


class Scanned(namedtuple("Scanned", "offs btypes keys tags")):
    """What scan_columns found, in columns: each record's arena offset (offs, an array of u64), type
    (btypes, one byte each), the first keylen bytes of its key field (keys) and its tag (tags, 16
    bytes each), end to end."""

    __slots__ = ()


def key_length(keylen):
    if not isinstance(keylen, int) or not 1 <= keylen <= SCORE_SIZE:
        raise ValueError(f"keylen must be 1..{SCORE_SIZE}, not {keylen!r}")


class RecordError(ValueError):
    """A record in an arena that must not be believed.

    kind says what is wrong; offset is the record's arena offset:
      magic       not a record header (magic, codec or reserved bytes)
      length      impossible stored and raw lengths
      tag         the tag does not match: damaged, misplaced or forged
      decompress  authentic, yet the payload does not decode to its raw length
      truncated   the bytes end inside the record (a torn tail when it is the last)
      span        a run slice (codec 2) whose run is not wholly in the bytes given: no damage,
                  read the run (layout.run_span) and decode again

    For a run slice, magic, length, tag and truncated name the member of the run that failed
    (its offset), decompress the record asked for.
    """

    KINDS = ("magic", "length", "tag", "decompress", "truncated", "span")

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


def nbytes(buf):
    return memoryview(buf).nbytes


def blocks(buf, bs):
    """(n, block length) of a buffer of blocks; see the module docstring."""
    size = nbytes(buf)
    if isinstance(bs, int) and bs == size:
        return 1, size
    if not isinstance(bs, int) or bs <= 0 or size % bs:
        raise ValueError(f"a buffer of {size} bytes is not whole blocks of {bs} bytes")
    return size // bs, bs


def byte(value, what):
    if not isinstance(value, int) or not 0 <= value <= 255:
        raise ValueError(f"{what} must be 0..255, not {value!r}")


def uint(value, limit, what):
    if not isinstance(value, int) or not 0 <= value < limit:
        raise ValueError(f"{what} must be an integer in 0..{limit - 1}, not {value!r}")


def flags(skip, n):
    if skip is not None and nbytes(skip) != n:
        raise ValueError(f"skip must hold one flag per block ({n}), not {nbytes(skip)}")


def thread_count(threads):
    if not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be a positive integer, not {threads!r}")
    return min(threads, MAX_THREADS)


def codec_args(enc_key, mac_key, zlevel, tag_key=None):
    if enc_key is not None and nbytes(enc_key) != KEY_SIZE:
        raise ValueError(f"enc_key must be {KEY_SIZE} bytes or None")
    if tag_key is not None and nbytes(tag_key) != KEY_SIZE:
        raise ValueError(f"tag_key must be {KEY_SIZE} bytes or None (HMAC tags)")
    nbytes(mac_key)
    if not isinstance(zlevel, int) or not ZLEVEL_MIN <= zlevel <= ZLEVEL_MAX:
        raise ValueError(f"zlevel must be 0 (never compress) or a zstd level, not {zlevel!r}")


def run_arg(run):
    """The most blocks a writer puts in a run: 1 (no runs) .. RUN_MAX."""
    if not isinstance(run, int) or not 1 <= run <= RUN_MAX:
        raise ValueError(f"run must be 1..{RUN_MAX}, not {run!r}")
    return run


def run_max(zlevel, blen, run):
    """The longest run a writer makes of blocks of blen bytes (< 2: none); csrc/record.c run_max."""
    k = min(run, RUN_MAX, RUN_BYTES // max(blen, 1))
    return k if zlevel != 0 and blen > 1 else 0


def where(arena, iv, offset):
    uint(arena, ARENA_LIMIT, "arena")
    if nbytes(iv) != IV_SIZE:
        raise ValueError(f"iv must be {IV_SIZE} bytes")
    uint(offset, ARENA_LIMIT, "offset")


def rec_base(rec, offset, base):
    """unpack's base (None: rec begins at the record), checked: the record lies inside rec."""
    if base is None:
        return offset
    uint(base, ARENA_LIMIT, "base")
    if not base <= offset <= base + nbytes(rec):  # (at the end: truncated)
        raise ValueError(f"offset {offset} is not inside the buffer (arena offsets {base}..{base + nbytes(rec) - 1})")
    return base


def walk_start(base, size, start):
    """check_span's start (None: base), checked: inside the span or at its end."""
    if start is None:
        return base
    if not isinstance(start, int) or not base <= start <= base + size:
        raise ValueError(f"start {start!r} is not inside the buffer (arena offsets {base}..{base + size})")
    return start


def pack_args(arena, iv, offset, btype, buf, bs, keys):
    where(arena, iv, offset)
    byte(btype, "btype")
    n, blen = blocks(buf, bs)
    if nbytes(keys) != n * SCORE_SIZE:
        raise ValueError(f"keys must be {SCORE_SIZE} bytes per block ({n} blocks)")
    if offset + n * (HEADER_SIZE + blen) > ARENA_LIMIT:
        raise ValueError("the records could run past the 4 GiB arena limit")
    return n, blen


def fill_scratch(scratch, n, blen):
    """fill's payload buffer: the caller's (writable, at least n * blen bytes), or a new one."""
    if scratch is None or nbytes(scratch) < n * blen:
        return bytearray(n * blen)
    if memoryview(scratch).readonly:
        raise TypeError("fill's scratch must be a writable buffer")
    return scratch


def seal_args(arena, iv, offset, btype, buf, bs, keys, filled, first, room):
    """seal's arguments, checked -> (n, blen)."""
    where(arena, iv, offset)
    byte(btype, "btype")
    n, blen = blocks(buf, bs)
    if not isinstance(filled, Filled) or (filled.n, filled.blen) != (n, blen):
        raise ValueError(f"filled is not fill()'s of these {n} blocks of {blen} bytes")
    if nbytes(keys) != n * SCORE_SIZE:
        raise ValueError(f"keys must be {SCORE_SIZE} bytes per block ({n} blocks)")
    uint(first, n + 1, "first")
    uint(room, 1 << 64, "room")
    return n, blen


def pack_out(out, cap):
    """pack's optional output buffer: writable, with room for the worst case (every block raw)."""
    try:
        m = memoryview(out)
    except TypeError:
        raise TypeError(f"pack's out must be a writable buffer, not {type(out).__name__}") from None
    if m.readonly or m.nbytes < cap:
        raise ValueError(f"pack's out must be a writable buffer of at least {cap} bytes")


def span(buf, base):
    """The size of buf, a span of an arena from base."""
    size = nbytes(buf)
    if base + size > ARENA_LIMIT:
        raise ValueError("the buffer runs past the 4 GiB arena limit")
    return size


def outside(offsets, base, size):
    """ValueError for the first offset that is no record start inside buf, or None."""
    for off in offsets:
        if not isinstance(off, int) or not base <= off < base + size:
            return ValueError(f"offset {off!r} is not inside the buffer "
                              f"(arena offsets {base}..{base + size - 1})")
    return None


def blocks_out(out, n, bs):
    """The buffer unpack_blocks writes n blocks of bs bytes into: out, checked, or a new bytearray."""
    uint(bs, 1 << 32, "bs")
    if bs == 0:
        raise ValueError("bs must be at least 1")
    if out is None:
        return bytearray(n * bs)
    if nbytes(out) < n * bs:
        raise ValueError(f"out holds {nbytes(out)} bytes, not the {n * bs} of {n} blocks")
    return out


def blocks_at(out, slots, n, bs):
    """unpack_blocks's slots, checked against out: n of them, each a block of out -> [slot]."""
    uint(bs, 1 << 32, "bs")
    if bs == 0:
        raise ValueError("bs must be at least 1")
    slots = list(slots)
    if len(slots) != n:
        raise ValueError(f"{len(slots)} slots for {n} offsets")
    if out is None:
        raise ValueError("slots need out, the buffer they name blocks of")
    for x in slots:
        if not isinstance(x, int) or x < 0 or (x + 1) * bs > nbytes(out):
            raise ValueError(f"slot {x!r} is not a block of out ({nbytes(out)} bytes)")
    return slots


def index_args(region, first, nregion, bucket_size, keylen, nbuckets):
    uint(nbuckets, 1 << 64, "nbuckets")
    if nbuckets == 0:
        raise ValueError("nbuckets must be positive")
    uint(first, nbuckets + 1, "first")
    uint(nregion, nbuckets - first + 1, "nregion")
    if not isinstance(keylen, int) or keylen < 1:
        raise ValueError(f"keylen must be positive, not {keylen!r}")
    if not isinstance(bucket_size, int) or bucket_size < 4 + keylen + 8:
        raise ValueError(f"a bucket of {bucket_size} bytes cannot hold one entry")
    if nbytes(region) < nregion * bucket_size:
        raise ValueError(f"region holds {nbytes(region)} bytes, not {nregion} buckets")
    return (bucket_size - 4) // (keylen + 8)


def bad_bucket(region, first, start, stop, bucket_size, cap):
    """BucketError for the first bucket in [start, stop) whose count exceeds cap."""
    mv = memoryview(region).cast("B")
    for b in range(start, stop):
        at = (b - first) * bucket_size
        count = int.from_bytes(mv[at:at + 4], "little")
        if count > cap:
            return BucketError(b, count, cap)
    return None


def addr_list(addrs):
    """addrs as a list of u64, or ValueError."""
    out = list(addrs)
    for a in out:
        if not isinstance(a, int) or not 0 <= a < 1 << 64:
            raise ValueError(f"an addr must be a u64, not {a!r}")
    return out


def bloom_bytes(nbits):
    """The bytes of a pybloomfiltermmap3 bit array (host-order u32 words) that hold bits 0..nbits-1:
    its file ends there, not at a whole word."""
    return -(-nbits // 8) if sys.byteorder == "little" else -(-nbits // 32) * 4


def bloom_args(words, nbits, seeds, keys, keylen, step):
    """Check bloom_add's and bloom_test's arguments -> (the seeds as a list of ints, step)."""
    uint(nbits, 1 << 63, "nbits")
    if not nbits or bloom_bytes(nbits) > nbytes(words):
        raise ValueError(f"a bit array of {nbytes(words)} bytes cannot hold {nbits} bits")
    seeds = [int(s) for s in seeds]
    if not seeds or any(not 0 <= s < 1 << 32 for s in seeds):
        raise ValueError("a Bloom filter needs one or more u32 hash seeds")
    step = keylen if step is None else step
    if not isinstance(keylen, int) or not isinstance(step, int) or not 1 <= keylen <= step or nbytes(keys) % step:
        raise ValueError(f"keys must be whole entries of {step} bytes, each starting with a key of {keylen}")
    return seeds, step


def absent_count(tables, keys):
    """How many keys tables_absent was given: whole keys of the tables' one length."""
    if not tables or any(t.keylen != tables[0].keylen for t in tables):
        raise ValueError("tables_absent needs one or more tables of one key length")
    n, rest = divmod(nbytes(keys), tables[0].keylen)
    if rest:
        raise ValueError(f"keys must be whole keys of {tables[0].keylen} bytes")
    return n


def lookup_count(tables, keys, skip, keylen):
    """How many keys tables_lookup was given (shared by both backends)."""
    if keylen is None:
        if not tables:
            raise ValueError("tables_lookup takes keylen from the tables: pass keylen= with none")
        keylen = tables[0].keylen
    if any(t.keylen != keylen for t in tables):
        raise ValueError("tables_lookup needs tables of one key length")
    if nbytes(keys) % keylen:
        raise ValueError(f"keys must be whole keys of {keylen} bytes")
    n = nbytes(keys) // keylen
    flags(skip, n)
    return n


# ---- a restore's plan of one window (plan_sweep, plan_order, plan_cuts, plan_runs) ----

def _count(a, what):
    try:
        return len(a)
    except TypeError:
        raise TypeError(f"{what} must be a sequence") from None


def plan_sweep_args(table, akeys, aaddrs, found, done):
    """plan_sweep's arguments checked -> how many summary records."""
    n = _count(aaddrs, "aaddrs")
    if nbytes(akeys) != n * table.keylen:
        raise ValueError(f"akeys must be {table.keylen} bytes per addr ({n} addrs)")
    if not (isinstance(found, array.array) and found.typecode in "QL" and found.itemsize == 8):
        raise TypeError("found must be an array('Q')")
    if not isinstance(done, bytearray) or len(done) != len(found):
        raise ValueError("done must be a bytearray as long as found")
    return n


def plan_order_args(found, live, refs, rs):
    """plan_order's arguments checked -> how many located blocks."""
    m = _count(found, "found")
    if not isinstance(rs, int) or rs < 1:
        raise ValueError(f"rs must be positive, not {rs!r}")
    if nbytes(refs) % rs:
        raise ValueError(f"refs must be whole refs of {rs} bytes")
    if live is not None and len(live) != m:
        raise ValueError("live must hold one position a located block")
    if live is None and m > nbytes(refs) // rs:
        raise ValueError("more located blocks than refs")
    return m  # a position outside refs: the C core refuses it (ValueError), as the reference does


def plan_cuts_args(addrs, gap, span, blocks, most):
    """plan_cuts's arguments checked -> how many addresses."""
    for v, what in ((gap, "gap"), (span, "span"), (most, "most")):
        uint(v, 1 << 63, what)
    uint(blocks, 1 << 63, "blocks")
    if blocks < 1 or span < most:
        raise ValueError("plan_cuts needs blocks >= 1 and span >= most")
    return _count(addrs, "addrs")


def plan_runs_args(leaf, positions):
    """plan_runs's arguments checked -> how many positions."""
    _count(leaf, "leaf")
    return _count(positions, "positions")  # a position outside leaf: ValueError from either backend
