"""The reference backend: the specification of the C core, in Python.

Every function here defines what its C twin in csrc/ must compute, byte for
byte; tests/test_native.py holds the two to each other. Clarity wins over
speed here: this backend is what a reader in 2050 checks a record against.

Record, as it lies in an arena (all integers little-endian):

    off  size  field
    0    4     magic b"FDNr"
    4    1     btype                block type
    5    1     codec                0 raw, 1 zstd, 2 run slice
    6    1     run j                codec 2: the record's place in its run; else 0
    7    1     run k                codec 2: its run's length, 2..64; else 0
    8    4     S                    stored payload length
    12   4     R                    raw block length
    16   32    key                  score or weak hash; opaque here
    48   16    tag                  of M = u32le(arena) || u32le(offset) || header[0:48]
                                      || payload: Poly1305(otk, M), otk the tag key's
                                      AES-256-CTR keystream at arena positions offset ..
                                      offset + 31 (stores with a tag key, see tag());
                                      else HMAC-SHA256(mac_key, M)[:16]
    64   S     payload              the block; zstd-compressed (one frame with its
                                      content size) when that is shorter than R
                                      and the block is not flat (see flat());
                                      then AES-256-CTR encrypted when there is an enc_key

codec 0 means S == R, codec 1 means S < R. Codec 2 (a run slice, 0 < S < R,
j < k): the run's k records lie back to back from o - j * (64 + S), all with
codec 2, the same k, S and R and their own j; their payloads, decrypted
and joined, are one zstd frame declaring k * R bytes followed by fewer than
k zero bytes, and the record's block is bytes [j * R, (j + 1) * R) of it.
A writer makes runs of neighbouring compressible (not flat) blocks of one
batch (fill's run; see fill()). Arena position p (the record at
offset o has its payload at p = o + 64 + j) is XORed with keystream byte p:
counter block (iv + p // 16) mod 2**128, byte p % 16 within it. The tag
covers the stored, encrypted bytes (encrypt-then-MAC) and where they lie,
so a record moved to another arena or offset fails it.

A record is judged in this order, which the C core follows: fewer than 4
bytes -> truncated; magic -> magic; fewer than 64 bytes -> truncated; codec
or run fields -> magic; S against R, and offset + 64 + S beyond 4 GiB ->
length; fewer than 64 + S bytes -> truncated; tag -> tag; then, for a run
slice, its run not wholly in the bytes given -> span, and each member in
order as above, a member disagreeing with the record -> magic (the member
named); decoding -> decompress.

Index bucket (bucket_size bytes): u32le count, then count entries of
keylen + 8 bytes, key then u64le addr; the rest is zero. A key's home bucket
is (u64 big-endian of its first 8 bytes, zero-padded) * nbuckets >> 64.
"""

import array
import collections
import hashlib
import hmac
import struct
import sys

import zstandard
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.poly1305 import Poly1305

from foundation.native import checks
from foundation.native.checks import (ARENA_LIMIT, HEADER_SIZE, RECORD_MAGIC, SCORE_SIZE, TAG_SIZE, WEAK_SIZE,
                                      BucketError, RecordError)

name = "reference"

HEAD = struct.Struct("<4sBBHII32s")  # the header up to the tag
assert HEAD.size + TAG_SIZE == HEADER_SIZE
RAW, ZSTD, RUN = 0, 1, 2
MASK = (1 << 64) - 1


def zero_flags(buf, bs):
    n, blen = checks.blocks(buf, bs)
    data = bytes(buf)
    zero = bytes(blen)
    return bytes(data[i * blen:(i + 1) * blen] == zero for i in range(n))


def scores(buf, bs, btype, key=None, skip=None, threads=1):
    """SHA-256, or HMAC-SHA256 under key, of bytes([btype]) + block; skipped: zeros."""
    n, blen = checks.blocks(buf, bs)
    checks.byte(btype, "btype")
    checks.flags(skip, n)
    checks.thread_count(threads)
    data, skip = bytes(buf), None if skip is None else bytes(skip)
    keyed = None if key is None else hmac.new(bytes(key), digestmod=hashlib.sha256)
    out = bytearray()
    for i in range(n):
        if skip and skip[i]:
            out += bytes(SCORE_SIZE)
            continue
        h = hashlib.sha256() if keyed is None else keyed.copy()
        h.update(bytes([btype]))
        h.update(data[i * blen:(i + 1) * blen])
        out += h.digest()
    return bytes(out)


M = 0x9E3779B97F4A7C15
C1 = 0xFF51AFD7ED558CCD
C2 = 0xC4CEB9FE1A85EC53


def weak(block, btype, seed):
    """The weak hash of one block: a 64-bit mix, fast in C, not collision-resistant."""
    h = seed ^ ((btype + 1) * M & MASK) ^ len(block)
    padded = block + bytes(-len(block) % 8)
    for (w,) in struct.iter_unpack("<Q", padded):
        h ^= w * C1 & MASK
        h = ((h << 29 | h >> 35) & MASK) * M & MASK
    h ^= h >> 33
    h = h * C2 & MASK
    h ^= h >> 29
    return h


def weak_hashes(buf, bs, btype, seed, skip=None):
    n, blen = checks.blocks(buf, bs)
    checks.byte(btype, "btype")
    checks.uint(seed, 1 << 64, "seed")
    checks.flags(skip, n)
    data, skip = bytes(buf), None if skip is None else bytes(skip)
    return b"".join(bytes(WEAK_SIZE) if skip and skip[i] else
                    weak(data[i * blen:(i + 1) * blen], btype, seed).to_bytes(8, "big")
                    for i in range(n))


class Codec:
    """Keys and compression level for records."""

    def __init__(self, enc_key, mac_key, zlevel, tag_key=None):
        checks.codec_args(enc_key, mac_key, zlevel, tag_key)
        self.enc_key = None if enc_key is None else bytes(enc_key)
        self.mac = hmac.new(bytes(mac_key), digestmod=hashlib.sha256)  # keyed once, copied per record
        self.tag_key = None if tag_key is None else bytes(tag_key)
        self.encrypted = enc_key is not None
        self.zlevel = zlevel
        self.tag = "hmac" if tag_key is None else "poly1305"

    def __repr__(self):
        return f"<reference Codec encrypted={self.encrypted} zlevel={self.zlevel} tag={self.tag}>"


def _codec(codec):
    if not isinstance(codec, Codec):
        raise TypeError(f"expected a reference Codec, not {type(codec).__name__}")
    return codec


def ctr(key, iv, pos, data):
    """XOR data with the arena keystream starting at arena position pos."""
    block, skip = divmod(pos, 16)
    counter = ((int.from_bytes(iv, "big") + block) % (1 << 128)).to_bytes(16, "big")
    enc = Cipher(algorithms.AES(key), modes.CTR(counter)).encryptor()
    return (enc.update(bytes(skip) + data) + enc.finalize())[skip:]


def tag(codec, arena, iv, offset, head, payload):
    """The record's tag (16 bytes). With a tag key: Poly1305 under a one-time key that is the tag
    key's keystream at the record's own arena positions offset .. offset + 31, so each record of an
    arena file has its own; else HMAC-SHA256 under the mac key (stores made before tag keys)."""
    msg = struct.pack("<II", arena, offset) + bytes(head[:HEAD.size]) + bytes(payload)
    if codec.tag_key is not None:
        return Poly1305.generate_tag(ctr(codec.tag_key, iv, offset, bytes(32)), msg)
    m = codec.mac.copy()
    m.update(msg)
    return m.digest()[:TAG_SIZE]


FLAT_MIN, FLAT_MAX, FLAT_STRIDE, FLAT_RATIO = 256, 1 << 20, 3, 181


def flat(block):
    """Whether the writer stores block raw without trying zstd: FLAT_MIN to
    FLAT_MAX bytes whose every FLAT_STRIDE-th byte (from the first; m bytes)
    has a collision entropy of at least log2(FLAT_RATIO), about 7.5 bits a
    byte: FLAT_RATIO * (sum of squared byte counts) <= m**2.
    Media, archives and ciphertext are flat; zstd would spend as long on them
    as the hash does and save nothing. A writer's choice, not the format's:
    any record may hold either codec."""
    if not FLAT_MIN <= len(block) <= FLAT_MAX:
        return False
    sample = block[::FLAT_STRIDE]
    return FLAT_RATIO * sum(c * c for c in collections.Counter(sample).values()) <= len(sample) ** 2


def pack(codec, arena, iv, offset, btype, buf, bs, keys, threads=1, out=None, scratch=None, run=1):
    n, blen = checks.pack_args(arena, iv, offset, btype, buf, bs, keys)
    checks.thread_count(threads)
    checks.run_arg(run)
    if out is not None:  # the records written into the caller's buffer, a view of them returned
        checks.pack_out(out, n * (HEADER_SIZE + blen))
        recs, offsets = pack(codec, arena, iv, offset, btype, buf, bs, keys, threads, run=run)
        memoryview(out)[:len(recs)] = recs
        return memoryview(out)[:len(recs)], offsets
    if run > 1:  # fill then seal: the same bytes as the loop below when no run forms
        recs, offsets, _ = seal(codec, arena, iv, offset, btype, buf, bs, keys, fill(codec, buf, bs, run=run))
        return recs, offsets
    codec, data, keys, iv = _codec(codec), bytes(buf), bytes(keys), bytes(iv)
    z = zstandard.ZstdCompressor(level=codec.zlevel, write_content_size=True) if codec.zlevel else None
    out, offsets, pos = bytearray(), [], offset
    for i in range(n):
        block = data[i * blen:(i + 1) * blen]
        payload, kind = block, RAW
        if z is not None and blen > 1 and not flat(block):
            small = z.compress(block)
            if len(small) < blen:
                payload, kind = small, ZSTD
        if codec.enc_key is not None:
            payload = ctr(codec.enc_key, iv, pos + HEADER_SIZE, payload)
        head = HEAD.pack(RECORD_MAGIC, btype, kind, 0, len(payload), blen,
                         keys[i * SCORE_SIZE:(i + 1) * SCORE_SIZE])
        out += head + tag(codec, arena, iv, pos, head, payload) + payload
        offsets.append(pos)
        pos += HEADER_SIZE + len(payload)
    return bytes(out), offsets


def fill(codec, buf, bs, threads=1, scratch=None, run=1):
    """pack's first half: each block's codec and stored length decided as pack decides them, a
    zstd payload put at payloads[i * blen] -> checks.Filled, for seal().

    run > 1: each stretch of neighbouring blocks that are compressible (zstd is tried: a level,
    blen > 1, not flat) is cut, from its first block on, into runs of kmax = min(run, 64,
    2**20 // blen) blocks (the last run of a stretch shorter; a run of one block is no run).
    A run's blocks, joined, are compressed as one frame of F bytes; with s = ceil(F / k) < blen
    the frame, zero-padded to k * s bytes, goes to payloads[first * blen], and each block is a
    run slice (codec 2) of s bytes; otherwise each block of the run is filled alone."""
    n, blen = checks.blocks(buf, bs)
    checks.thread_count(threads)
    checks.run_arg(run)
    codec, data = _codec(codec), bytes(buf)
    payloads = checks.fill_scratch(scratch, n, blen)
    z = zstandard.ZstdCompressor(level=codec.zlevel, write_content_size=True) if codec.zlevel else None
    sizes, codecs, runs = array.array("I", [blen] * n), bytearray(n), bytearray(2 * n)
    view = memoryview(payloads)

    def alone(i):
        block = data[i * blen:(i + 1) * blen]
        if z is not None and blen > 1 and not flat(block):
            small = z.compress(block)
            if len(small) < blen:
                view[i * blen:i * blen + len(small)] = small
                sizes[i], codecs[i] = len(small), ZSTD

    kmax = checks.run_max(codec.zlevel, blen, run) if n >= 2 else 0
    if kmax < 2:
        for i in range(n):
            alone(i)
        return checks.Filled(n, blen, sizes, codecs, payloads, runs)
    tryz = [not flat(data[i * blen:(i + 1) * blen]) for i in range(n)]
    i = 0
    while i < n:
        m = i
        while m < n and tryz[m] and m - i < kmax:
            m += 1
        k = m - i
        if k < 2:
            if k == 0:
                alone(i)  # flat: raw
                i += 1
            else:
                alone(i)
                i = m
            continue
        frame = z.compress(data[i * blen:m * blen])
        s = -(-len(frame) // k)
        if s >= blen:  # the run does not pay: each block alone
            for t in range(i, m):
                alone(t)
        else:
            view[i * blen:i * blen + k * s] = frame + bytes(k * s - len(frame))
            for t in range(i, m):
                sizes[t], codecs[t], runs[2 * t], runs[2 * t + 1] = s, RUN, t - i, k
        i = m
    return checks.Filled(n, blen, sizes, codecs, payloads, runs)


def seal(codec, arena, iv, offset, btype, buf, bs, keys, filled, first=0, room=ARENA_LIMIT, out=None, threads=1):
    """pack's second half: the records of blocks first, first + 1, ... that fit in room bytes (and
    in out, if given) at arena offset `offset` -> (records, offsets, tags): the bytes pack writes."""
    n, blen = checks.seal_args(arena, iv, offset, btype, buf, bs, keys, filled, first, room)
    checks.thread_count(threads)
    if out is not None:
        checks.pack_out(out, 0)
        room = min(room, checks.nbytes(out))
    room = min(room, ARENA_LIMIT - offset)
    codec, data, keys, iv = _codec(codec), bytes(buf), bytes(keys), bytes(iv)
    runs = filled.runs if filled.runs is not None else bytes(2 * n)
    recs, offsets, tags, pos = bytearray(), [], bytearray(), offset
    if first < n and filled.codecs[first] == RUN and runs[2 * first] != 0:
        raise ValueError("a run is sealed whole: first is inside one")
    for i in range(first, n):
        size, kind = filled.sizes[i], filled.codecs[i]
        j, k = runs[2 * i], runs[2 * i + 1]
        if kind == RUN:
            if not (0 < size < blen and 2 <= k <= checks.RUN_MAX and j < k and i - j + k <= n) or any(
                    filled.codecs[i - j + m] != RUN or runs[2 * (i - j + m)] != m or runs[2 * (i - j + m) + 1] != k
                    or filled.sizes[i - j + m] != size for m in range(k)):
                raise ValueError("filled is not what fill() leaves")
        elif (size != blen) if kind == RAW else (kind != ZSTD or size >= blen):
            raise ValueError("filled is not what fill() leaves")
        if j == 0 and len(recs) + (k if kind == RUN else 1) * (HEADER_SIZE + size) > room:
            break  # a run whole or not at all
        if kind == RUN:
            at = (i - j) * blen + j * size
            payload = bytes(memoryview(filled.payloads)[at:at + size])
        else:
            payload = (data[i * blen:(i + 1) * blen] if kind == RAW else
                       bytes(memoryview(filled.payloads)[i * blen:i * blen + size]))
        if codec.enc_key is not None:
            payload = ctr(codec.enc_key, iv, pos + HEADER_SIZE, payload)
        reserved = j | k << 8 if kind == RUN else 0
        head = HEAD.pack(RECORD_MAGIC, btype, kind, reserved, size, blen, keys[i * SCORE_SIZE:(i + 1) * SCORE_SIZE])
        t = tag(codec, arena, iv, pos, head, payload)
        recs += head + t + payload
        tags += t
        offsets.append(pos)
        pos += HEADER_SIZE + size
    if out is not None:
        memoryview(out)[:len(recs)] = recs
        return memoryview(out)[:len(recs)], offsets, bytes(tags)
    return bytes(recs), offsets, bytes(tags)


def _check(codec, arena, iv, offset, rec, verify):
    """The header fields of the record at offset whose bytes rec begins with."""
    if len(rec) < 4:
        raise RecordError("truncated", offset)
    if rec[:4] != RECORD_MAGIC:
        raise RecordError("magic", offset)
    if len(rec) < HEADER_SIZE:
        raise RecordError("truncated", offset)
    magic, btype, kind, reserved, S, R, key = HEAD.unpack_from(rec)
    j, k = reserved & 0xFF, reserved >> 8
    if kind not in (RAW, ZSTD, RUN) or (not (2 <= k <= checks.RUN_MAX and j < k) if kind == RUN else reserved):
        raise RecordError("magic", offset)
    if (S != R if kind == RAW else S >= R or (kind == RUN and S == 0)) or offset + HEADER_SIZE + S > ARENA_LIMIT:
        raise RecordError("length", offset)
    if len(rec) - HEADER_SIZE < S:
        raise RecordError("truncated", offset)
    payload = rec[HEADER_SIZE:HEADER_SIZE + S]
    if verify and not hmac.compare_digest(tag(codec, arena, iv, offset, rec, payload),
                                          bytes(rec[HEAD.size:HEADER_SIZE])):
        raise RecordError("tag", offset)
    return btype, kind, S, R, key, bytes(payload)


def unpack(codec, arena, iv, offset, rec, base=None):
    """The record at offset of rec, whose first byte is at arena offset base (None: offset)."""
    checks.where(arena, iv, offset)
    base = checks.rec_base(rec, offset, base)
    return _unpack(_codec(codec), arena, bytes(iv), offset, memoryview(bytes(rec)), base)


def _unpack(codec, arena, iv, offset, data, base):
    btype, kind, S, R, key, payload = _check(codec, arena, iv, offset, data[offset - base:], True)
    if kind == RUN:
        at = offset - base
        return btype, key, _run(codec, arena, iv, offset, data, base, S, R, data[at + 6], data[at + 7])
    if codec.enc_key is not None:
        payload = ctr(codec.enc_key, iv, offset + HEADER_SIZE, payload)
    if kind == ZSTD:
        payload = _decompress(payload, R, offset)
    return btype, key, payload


def _run(codec, arena, iv, offset, data, base, S, R, j, k):
    """Block j of the run of k records whose member at offset is slice j (data[0] at base)."""
    step = HEADER_SIZE + S
    first = offset - j * step
    if first < base or first - base + k * step > len(data):
        raise RecordError("span", offset)
    joined = bytearray()
    for m in range(k):
        at = first + m * step
        rec = data[at - base:]
        _, kind, S2, R2, _, payload = _check(codec, arena, iv, at, rec, True)
        if kind != RUN or (rec[6], rec[7], S2, R2) != (m, k, S, R):
            raise RecordError("magic", at)
        joined += ctr(codec.enc_key, iv, at + HEADER_SIZE, payload) if codec.enc_key is not None else payload
    try:
        if zstandard.frame_content_size(bytes(joined)) != k * R:
            raise RecordError("decompress", offset)
        d = zstandard.ZstdDecompressor().decompressobj()
        block = d.decompress(bytes(joined))
    except zstandard.ZstdError:
        raise RecordError("decompress", offset) from None
    pad = d.unused_data
    if not d.eof or len(block) != k * R or len(pad) >= k or any(pad):
        raise RecordError("decompress", offset)
    return block[j * R:(j + 1) * R]


def unpack_many(codec, arena, iv, buf, base, offsets, threads=1):
    """unpack of each record of buf named by its arena offset; a bad one's RecordError."""
    checks.where(arena, iv, base)
    codec = _codec(codec)
    size = checks.span(buf, base)
    checks.thread_count(threads)
    offsets = list(offsets)
    bad = checks.outside(offsets, base, size)
    if bad:
        raise bad
    data, iv, out = memoryview(bytes(buf)), bytes(iv), []
    for off in offsets:
        try:
            out.append(_unpack(codec, arena, iv, off, data, base))
        except RecordError as e:
            out.append(e)
    return out


def unpack_blocks(codec, arena, iv, buf, base, offsets, bs, out=None, threads=1, slots=None):
    """unpack_many of records that each hold one block of bs bytes, the data of item i at out[i * bs]
    (slots given: at out[slots[i] * bs])."""
    offsets = list(offsets)
    if slots is not None:
        at = checks.blocks_at(out, slots, len(offsets), bs)
    got = unpack_many(codec, arena, iv, buf, base, offsets, threads)
    if slots is None:
        out = checks.blocks_out(out, len(offsets), bs)
        at = range(len(offsets))
    keys, bad = [], {}
    view = memoryview(out).cast("B")
    for i, item in enumerate(got):
        if isinstance(item, RecordError) or len(item[2]) != bs:
            bad[i] = item if isinstance(item, RecordError) else RecordError("length", offsets[i])
            keys.append(bytes(SCORE_SIZE))
            continue
        view[at[i] * bs:(at[i] + 1) * bs] = item[2]
        keys.append(item[1])
    return out, b"".join(keys), bad


def _decompress(payload, R, offset):
    """Exactly one zstd frame, declaring exactly R bytes, decoding to them."""
    try:
        if zstandard.frame_content_size(payload) != R:
            raise RecordError("decompress", offset)
        d = zstandard.ZstdDecompressor().decompressobj()
        data = d.decompress(payload)
    except zstandard.ZstdError:
        raise RecordError("decompress", offset) from None
    if not d.eof or d.unused_data or len(data) != R:
        raise RecordError("decompress", offset)
    return data


def scan(codec, arena, iv, buf, base, verify=True):
    """Records from buf (buf[0] at arena offset base) until its end, zeros or a bad one.

    iv is not used: scanning checks tags, which cover the encrypted bytes.
    """
    checks.where(arena, iv, base)
    codec = _codec(codec)
    checks.span(buf, base)
    data = memoryview(bytes(buf))
    entries, pos = [], 0
    while pos < len(data):
        if not any(data[pos:pos + HEADER_SIZE]):
            break  # unwritten space
        try:
            btype, _, S, R, key, _ = _check(codec, arena, iv, base + pos, data[pos:], verify)
        except RecordError as e:
            return entries, base + pos, e
        entries.append((base + pos, btype, key, S, R))
        pos += HEADER_SIZE + S
    return entries, base + pos, None


def scan_columns(codec, arena, iv, buf, base, keylen=SCORE_SIZE, verify=True):
    """scan's records in columns -> (checks.Scanned(offs, btypes, keys, tags), end, error): each
    record's offset (an array of u64), type, first keylen bytes of its key field, and tag."""
    checks.key_length(keylen)
    entries, end, err = scan(codec, arena, iv, buf, base, verify)
    data = bytes(buf)
    tag = HEADER_SIZE - TAG_SIZE
    got = checks.Scanned(array.array("Q", [e[0] for e in entries]), bytes(e[1] for e in entries),
                         b"".join(e[2][:keylen] for e in entries),
                         b"".join(data[e[0] - base + tag:e[0] - base + HEADER_SIZE] for e in entries))
    return got, end, err


def check_span(codec, arena, iv, buf, base, depth=checks.DECODED, score_key=None, threads=1, start=None):
    """Every record of buf from arena offset start (None: base) checked -> (checks.Checked, end, error).

    The walk is scan's without verifying, and stops where it stops (end,
    error); each record found then has its tag checked (depth TAGS), is
    unpacked (DECODED: tag, decryption, decoding), and its data scored
    (SCORED: scores, keyed by score_key) against its key field. A record
    that fails is named in Checked.problems by its index: "tag",
    "decompress" or "score". A run slice whose own tag is good but whose run
    does not decode (another member bad, or the run not wholly in buf) is
    "decompress": "tag" is only ever a record's own.
    """
    checks.where(arena, iv, base)
    checks.depth(depth)
    checks.thread_count(threads)
    size = checks.span(buf, base)
    start = checks.walk_start(base, size, start)
    entries, end, err = scan(codec, arena, iv, memoryview(buf)[start - base:], start, verify=False)
    codec, data, iv = _codec(codec), memoryview(bytes(buf)), bytes(iv)
    tags, problems = bytearray(), {}
    for i, (off, btype, key, S, R) in enumerate(entries):
        rec = data[off - base:off - base + HEADER_SIZE + S]
        tags += rec[HEAD.size:HEADER_SIZE]
        try:
            _check(codec, arena, iv, off, rec, True)
        except RecordError as e:
            problems[i] = e.kind
            continue
        if depth == checks.TAGS:
            continue
        try:
            _, _, block = _unpack(codec, arena, iv, off, data, base)
            if depth == checks.SCORED and block and scores(block, len(block), btype, key=score_key) != key:
                problems[i] = "score"
        except RecordError as e:
            problems[i] = "decompress" if rec[5] == RUN else e.kind
    return checks.Checked([e[0] for e in entries], bytes(e[1] for e in entries), [e[4] for e in entries],
                          bytes(tags), problems), end, err


def bucket_home(key, nbuckets):
    checks.uint(nbuckets, 1 << 64, "nbuckets")
    top = bytes(key)[:8].ljust(8, b"\0")
    return int.from_bytes(top, "big") * nbuckets >> 64


def _entries(bucket, keylen):
    """The (key, addr) entries of one bucket, as bytes."""
    count = int.from_bytes(bucket[:4], "little")
    es = keylen + 8
    return [bucket[4 + i * es:4 + (i + 1) * es] for i in range(count)]


def bucket_find(bucket, keylen, key):
    bucket, key = bytes(bucket), bytes(key)
    if not isinstance(keylen, int) or keylen < 1 or len(key) != keylen or len(bucket) < 4:
        raise ValueError("bucket_find needs a bucket of at least 4 bytes and a key of keylen bytes")
    cap = (len(bucket) - 4) // (keylen + 8)
    count = int.from_bytes(bucket[:4], "little")
    if count > cap:
        raise BucketError(None, count, cap)
    return [int.from_bytes(e[keylen:], "little") for e in _entries(bucket, keylen) if e[:keylen] == key]


def sort_entries(entries, entsize, keylen):
    """Sort in place by key bytes, then addr as a number, then any bytes after it."""
    if not isinstance(keylen, int) or keylen < 1 or not isinstance(entsize, int) \
            or entsize < keylen + 8 or checks.nbytes(entries) % entsize:
        raise ValueError("sort_entries needs whole entries of entsize >= keylen + 8 bytes")
    mv = memoryview(entries).cast("B")
    if mv.readonly:
        raise TypeError("sort_entries needs a writable buffer")
    data = bytes(mv)
    ents = [data[i:i + entsize] for i in range(0, len(data), entsize)]
    ents.sort(key=lambda e: (e[:keylen], int.from_bytes(e[keylen:keylen + 8], "little"), e[keylen + 8:]))
    mv[:] = b"".join(ents)


def merge(region, first, nregion, bucket_size, keylen, entries, nbuckets):
    """Insert sorted entries into the region's buckets; return those that did not fit."""
    cap = checks.index_args(region, first, nregion, bucket_size, keylen, nbuckets)
    es = keylen + 8
    if checks.nbytes(entries) % es:
        raise ValueError(f"entries must be whole entries of {es} bytes")
    mv = memoryview(region).cast("B")
    if mv.readonly:
        raise TypeError("merge needs a writable region")
    bad = checks.bad_bucket(region, first, first, first + nregion, bucket_size, cap)
    if bad:
        raise bad
    data, end, spill = bytes(entries), first + nregion, bytearray()
    for i in range(0, len(data), es):
        e = data[i:i + es]
        b = max(bucket_home(e[:keylen], nbuckets), first)  # below first: a carried spill
        while b < end:
            at = (b - first) * bucket_size
            bucket = bytes(mv[at:at + bucket_size])
            count = int.from_bytes(bucket[:4], "little")
            if e in _entries(bucket, keylen):
                break  # already there: merging twice changes nothing
            if count < cap:
                mv[at + 4 + count * es:at + 4 + (count + 1) * es] = e
                mv[at:at + 4] = (count + 1).to_bytes(4, "little")
                break
            b += 1  # full: probe the next bucket
        if b >= end:
            spill += e
    return bytes(spill)


def lookup(region, first, nregion, bucket_size, keylen, key, nbuckets):
    """Addrs for key from its home bucket through the full buckets after it."""
    cap = checks.index_args(region, first, nregion, bucket_size, keylen, nbuckets)
    key = bytes(key)
    if len(key) != keylen:
        raise ValueError(f"key must be keylen ({keylen}) bytes")
    home = max(bucket_home(key, nbuckets), first)  # below first: continuing a search
    if home >= first + nregion:
        raise ValueError(f"the key's home bucket {home} is past the region")
    mv, found = memoryview(region).cast("B"), []
    for b in range(home, first + nregion):
        at = (b - first) * bucket_size
        bucket = bytes(mv[at:at + bucket_size])
        if int.from_bytes(bucket[:4], "little") > cap:
            raise checks.bad_bucket(region, first, home, first + nregion, bucket_size, cap)
        found += bucket_find(bucket, keylen, key)
        if len(_entries(bucket, keylen)) < cap:
            return found, False
    return found, first + nregion < nbuckets


class Table:
    """The index cache: a multimap key -> addrs in insertion order."""

    def __init__(self, keylen, capacity_hint=0):
        if not isinstance(keylen, int) or keylen < 1:
            raise ValueError(f"keylen must be positive, not {keylen!r}")
        checks.uint(capacity_hint, 1 << 31, "capacity_hint")
        self.keylen = keylen
        self._map = {}
        self._n = 0
        self._order = []  # (key, addr) in insertion order

    def add(self, keys, addrs):
        addrs = checks.addr_list(addrs)
        keys = bytes(keys)
        if len(keys) != len(addrs) * self.keylen:
            raise ValueError(f"keys must be {self.keylen} bytes per addr ({len(addrs)} addrs)")
        for i, a in enumerate(addrs):
            k = keys[i * self.keylen:(i + 1) * self.keylen]
            self._map.setdefault(k, []).append(a)
            self._order.append((k, a))
        self._n += len(addrs)

    def entries(self):
        """Every entry in insertion order as index entries: key, then the addr as u64 little-endian."""
        return bytearray(b"".join(k + a.to_bytes(8, "little") for k, a in self._order))

    def take(self):
        """entries(), the table left empty: the native table hands over its own memory."""
        out = self.entries()
        self.clear()
        return out

    def find(self, key):
        if checks.nbytes(key) != self.keylen:
            raise ValueError(f"key must be {self.keylen} bytes")
        return list(self._map.get(bytes(key), ()))

    def __len__(self):
        return self._n

    def clear(self):
        self._map.clear()
        self._order.clear()
        self._n = 0


def tables_lookup(tables, keys, skip, keylen=None):
    """For each key not skipped, its first addr in the first table that has it."""
    tables = list(tables)
    for t in tables:
        if not isinstance(t, Table):
            raise TypeError("tables_lookup needs reference Tables")
    n = checks.lookup_count(tables, keys, skip, keylen)
    keys = bytes(keys)
    kl = len(keys) // n if n else 0
    addrs, which = [0] * n, [-1] * n
    for i in range(n):
        if skip is not None and skip[i]:
            continue
        key = keys[i * kl:(i + 1) * kl]
        for k, t in enumerate(tables):
            hit = t._map.get(key)
            if hit:
                addrs[i], which[i] = hit[0], k
                break
    return addrs, which


def tables_absent(tables, keys):
    """Positions of the keys, all-zero ones left out, that no table holds."""
    tables = list(tables)
    for t in tables:
        if not isinstance(t, Table):
            raise TypeError("tables_absent needs reference Tables")
    n = checks.absent_count(tables, keys)
    keys, kl = bytes(keys), tables[0].keylen
    zero = bytes(kl)
    return [i for i in range(n) if (k := keys[i * kl:(i + 1) * kl]) != zero and not any(k in t._map for t in tables)]


def bloom_add(words, nbits, seeds, keys, keylen, step=None):
    """Set the bits of the keylen-byte key at the start of every `step` bytes of keys (default
    keylen) in the bit array of a pybloomfiltermmap3 filter (host-order u32 words) as its add()
    does: for each seed s, bit (h[0] ^ h[1]) mod nbits, h = MurmurHash3_x64_128(key, s)."""
    seeds, step = checks.bloom_args(words, nbits, seeds, keys, keylen, step)
    view = memoryview(words).cast("B")
    keys = bytes(keys)
    for i in range(0, len(keys), step):
        for s in reversed(seeds):
            bit = _murmur3_x64_128_xor(keys[i:i + keylen], s) % nbits
            view[_bloom_byte(bit)] |= 1 << bit % 8


def bloom_test(words, nbits, seeds, keys, keylen, step=None):
    """Whether the filter may hold the keylen-byte key at the start of every `step` bytes of keys:
    bytes of 1 where every bit bloom_add would set is set (its `in`), 0 elsewhere."""
    seeds, step = checks.bloom_args(words, nbits, seeds, keys, keylen, step)
    view = memoryview(words).cast("B")
    keys = bytes(keys)
    out = bytearray(len(keys) // step)
    for i in range(0, len(keys), step):
        out[i // step] = all(view[_bloom_byte(b)] >> b % 8 & 1
                             for b in (_murmur3_x64_128_xor(keys[i:i + keylen], s) % nbits for s in seeds))
    return bytes(out)


def _bloom_byte(bit):
    """The byte of a pybloomfiltermmap3 bit array (host-order u32 words) that holds bit."""
    return bit // 32 * 4 + (bit % 32 // 8 if sys.byteorder == "little" else 3 - bit % 32 // 8)


_M64 = (1 << 64) - 1


def _rotl64(x, r):
    return (x << r | x >> (64 - r)) & _M64


def _fmix64(k):
    k ^= k >> 33
    k = k * 0xff51afd7ed558ccd & _M64
    k ^= k >> 33
    k = k * 0xc4ceb9fe1a85ec53 & _M64
    return k ^ k >> 33


def _murmur3_x64_128_xor(key, seed):
    """Austin Appleby's MurmurHash3_x64_128 (public domain) of key with seed: its halves XORed."""
    c1, c2 = 0x87c37b91114253d5, 0x4cf5ad432745937f
    h1 = h2 = seed
    n = len(key)
    order = sys.byteorder
    for b in range(0, n - n % 16, 16):
        k1 = int.from_bytes(key[b:b + 8], order)
        k2 = int.from_bytes(key[b + 8:b + 16], order)
        h1 ^= _rotl64(k1 * c1 & _M64, 31) * c2 & _M64
        h1 = (_rotl64(h1, 27) + h2) * 5 + 0x52dce729 & _M64
        h2 ^= _rotl64(k2 * c2 & _M64, 33) * c1 & _M64
        h2 = (_rotl64(h2, 31) + h1) * 5 + 0x38495ab5 & _M64
    tail = key[n - n % 16:]
    if len(tail) > 8:
        k2 = int.from_bytes(tail[8:], "little")
        h2 ^= _rotl64(k2 * c2 & _M64, 33) * c1 & _M64
    if tail:
        k1 = int.from_bytes(tail[:8], "little")
        h1 ^= _rotl64(k1 * c1 & _M64, 31) * c2 & _M64
    h1 ^= n
    h2 ^= n
    h1 = h1 + h2 & _M64
    h2 = h2 + h1 & _M64
    h1, h2 = _fmix64(h1), _fmix64(h2)
    h1 = h1 + h2 & _M64
    h2 = h2 + h1 & _M64
    return h1 ^ h2


def equal(a, b):
    return bytes(a) == bytes(b)


# ---- a restore's plan of one window: Python sees a window, never a block ----

def plan_sweep(table, akeys, aaddrs, found, done):
    """Take from one arena's summary (akeys, aaddrs: its records' keys and addresses, in order)
    the address of every key of table not done yet: table maps a window's keys to their
    positions; for each record whose key the table holds, its first position j gets
    found[j] = the record's address and done[j] = 1 unless done[j] already (the first record
    wins). -> how many positions were filled."""
    if not isinstance(table, Table):
        raise TypeError("plan_sweep needs a reference Table")
    n = checks.plan_sweep_args(table, akeys, aaddrs, found, done)
    akeys, kl, filled = bytes(akeys), table.keylen, 0
    for i in range(n):
        hit = table._map.get(akeys[i * kl:(i + 1) * kl])
        if not hit:
            continue
        j = hit[0]
        if j >= len(found):
            raise ValueError("the table names a position past found")
        if not done[j]:
            found[j], done[j] = aaddrs[i], 1
            filled += 1
    return filled


def plan_order(found, live, refs, rs):
    """A window's located blocks sorted by log address -> (addresses array('Q'), positions
    array('q'), their refs joined, in that order). found[x] is the address of the block at
    position live[x] of refs (live None: position x); equal addresses keep the order of x."""
    m = checks.plan_order_args(found, live, refs, rs)
    refs, n = bytes(refs), checks.nbytes(refs) // rs
    pos = list(range(m)) if live is None else list(live)
    if any(not 0 <= p < n for p in pos):
        raise ValueError("a position lies outside refs")
    order = sorted(range(m), key=lambda x: found[x])
    positions = array.array("q", (pos[x] for x in order))
    return (array.array("Q", (found[x] for x in order)), positions,
            b"".join(refs[p * rs:(p + 1) * rs] for p in positions))


def plan_cuts(addrs, gap, span, blocks, most):
    """Sorted log addresses -> array('Q') of where each span ends (its first index is where the
    one before ended, 0 first). A span starting at index i ends at the first of: the first
    address after a gap wider than gap, the first address above addrs[i] + span - most (a
    record's largest size is most, so the span's bytes stay within span; a later arena's
    addresses are above it too), index i + blocks, the end; and it holds one address at least."""
    n = checks.plan_cuts_args(addrs, gap, span, blocks, most)
    out, i = array.array("Q"), 0
    while i < n:
        hi = min(n, i + blocks)
        j = i + 1
        while j < hi and addrs[j] <= addrs[i] + span - most and addrs[j] - addrs[j - 1] <= gap:
            j += 1
        out.append(j)
        i = j
    return out


def plan_runs(leaf, positions):
    """Where each run of consecutive leaves starts in the blocks at positions (leaf[positions[k]]
    one more than the one before: the same run), and len(positions) last -> array('Q')."""
    n = checks.plan_runs_args(leaf, positions)
    out, prev = array.array("Q"), None
    for k in range(n):
        p = positions[k]
        if not 0 <= p < len(leaf):
            raise ValueError("a position lies outside leaf")
        if prev is None or leaf[p] != prev + 1:
            out.append(k)
        prev = leaf[p]
    out.append(n)
    return out
