"""Where each field of a record header and an arena header lies, written once.

Offsets are derived from field sizes, as the C core derives its FDN_H_*
(csrc/internal.h, with a _Static_assert that they add up to the header
size) and as Venti's dat.h does; tests/test_layout.py holds the two
together. Python code that looks inside a header uses these names, never
a number. docs/format.md §5 is the prose of the same tables.
"""

U8, U16, U32 = 1, 2, 4

# ---- record header (64 bytes, integers little-endian) ----------------------
MAGIC = b"FDNr"
MAGIC_SIZE = len(MAGIC)
KEY_SIZE = 32     # the key field: a score, or a weak hash and 24 zero bytes
TAG_SIZE = 16     # Poly1305 (or truncated HMAC-SHA256) over header and stored bytes

H_MAGIC = 0
H_BTYPE = H_MAGIC + MAGIC_SIZE
H_CODEC = H_BTYPE + U8
H_RESERVED = H_CODEC + U8
H_SLEN = H_RESERVED + U16      # stored (encoded) length
H_RLEN = H_SLEN + U32          # raw length
H_KEY = H_RLEN + U32
H_TAG = H_KEY + KEY_SIZE
HEADER_SIZE = H_TAG + TAG_SIZE
KEY_END = H_KEY + KEY_SIZE     # magic, type, codec, lengths and key: what names the record

# ---- arena header (72 bytes at offset 0 of every arena file) ---------------
A_MAGIC_SIZE = 8
UUID_SIZE = 16
IV_SIZE = 16
A_MAGIC = 0
A_VERSION = A_MAGIC + A_MAGIC_SIZE
A_ARENA = A_VERSION + U32
A_UUID = A_ARENA + U32
A_IV = A_UUID + UUID_SIZE
A_SIZE = A_IV + IV_SIZE
A_TAG = A_SIZE + 8             # the header's own MAC, truncated
ARENA_HEADER_SIZE = A_TAG + TAG_SIZE


CODEC_RUN = 2     # a run slice (docs/format.md §5.2): the u16 reserved field holds j, then k
H_RUNJ = H_RESERVED
H_RUNK = H_RESERVED + U8


def run_span(buf, off):
    """(first, end) offsets in buf of the run whose member's header is at buf[off] (codec 2),
    or None for a record of its own. The header's fields are believed: call it on a record
    whose tag was checked (unpack's "span" error says so)."""
    if buf[off + H_CODEC] != CODEC_RUN:
        return None
    step = HEADER_SIZE + stored(buf, off)
    first = off - buf[off + H_RUNJ] * step
    return first, first + buf[off + H_RUNK] * step


def runs_to_read(buf, base, members):
    """{(first, end) arena offsets of a run: [x, ...]} for members (x, arena offset) whose runs
    buf (buf[0] at arena offset base) did not hold: each run to be read whole, once."""
    runs = {}
    for x, off in members:
        first, end = run_span(buf, off - base)
        runs.setdefault((first + base, end + base), []).append(x)
    return runs


def whole_runs(recs, base, offs, k):
    """The most records, k at most, of packed records (recs[0] at arena offset base, record i
    at offs[i]) that end no run part way: a run is written whole or not at all."""
    while 0 < k < len(offs) and recs[offs[k] - base + H_CODEC] == CODEC_RUN and recs[offs[k] - base + H_RUNJ] > 0:
        k -= 1
    return k


def is_record(buf, off):
    return buf[off + H_MAGIC:off + H_MAGIC + MAGIC_SIZE] == MAGIC


def btype(buf, off):
    return buf[off + H_BTYPE]


def stored(buf, off):
    """Bytes after the header that the record occupies."""
    return int.from_bytes(buf[off + H_SLEN:off + H_SLEN + U32], "little")


def stored_at(buf, off, limit):
    """stored(), or -1 if the length field lies past limit (a header cut short)."""
    return stored(buf, off) if off + H_SLEN + U32 <= limit else -1


def key(buf, off):
    return bytes(buf[off + H_KEY:off + H_KEY + KEY_SIZE])


def tag(buf, off):
    return bytes(buf[off + H_TAG:off + H_TAG + TAG_SIZE])


def arena_iv(buf):
    return bytes(buf[A_IV:A_IV + IV_SIZE])


def arena_tag(buf, n=TAG_SIZE):
    """The first n bytes of an arena header's tag (replicas name an open arena by it)."""
    return bytes(buf[A_TAG:A_TAG + n])
