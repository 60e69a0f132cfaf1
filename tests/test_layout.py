"""store/layout.py against the C core: the record header is laid out once, and the same in both."""

import os
import re

from foundation import native
from foundation.store import format as F
from foundation.store import layout as L

CSRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "csrc")


def c_enums():
    """Every `NAME = expression` of the enums in csrc/foundation.h and csrc/internal.h, evaluated."""
    values = {}
    for name in ("foundation.h", "internal.h"):
        with open(os.path.join(CSRC, name)) as f:
            text = re.sub(r"/\*.*?\*/", "", f.read(), flags=re.S)
        for body in re.findall(r"enum\s*\w*\s*\{(.*?)\}", text, flags=re.S):
            for item in body.split(","):
                m = re.fullmatch(r"\s*(FDN_\w+)\s*=\s*(.+?)\s*", item, flags=re.S)
                if m:
                    values[m.group(1)] = eval(m.group(2), {}, dict(values))
    return values


def test_record_header_offsets_match_the_c_header():
    c = c_enums()
    assert c["FDN_H_END"] == c["FDN_HEADER_SIZE"] == L.HEADER_SIZE == native.HEADER_SIZE == 64
    for field in ("MAGIC", "BTYPE", "CODEC", "RESERVED", "SLEN", "RLEN", "KEY", "TAG"):
        assert getattr(L, "H_" + field) == c["FDN_H_" + field], field
    assert (L.KEY_SIZE, L.TAG_SIZE, L.MAGIC_SIZE) == (c["FDN_SCORE_SIZE"], c["FDN_TAG_SIZE"], c["FDN_MAGIC_SIZE"])
    assert L.MAGIC == native.RECORD_MAGIC
    assert (L.TAG_SIZE, L.KEY_SIZE, L.IV_SIZE) == (native.TAG_SIZE, native.SCORE_SIZE, native.IV_SIZE)


def test_record_fields_read_where_the_core_writes_them():
    codec = native.Codec(bytes(range(32)), bytes(range(32, 64)), 1)
    iv = bytes(range(16))
    blocks = os.urandom(2048) + bytes(2048)   # one that does not compress, one that does
    key = bytes(range(100, 132)) + bytes(range(132, 164))
    base = F.ARENA_HEADER_SIZE
    recs, offs = native.pack(codec, 3, iv, base, F.TREE, blocks, 2048, key)
    buf = bytes(base) + bytes(recs)
    entries, end, err = native.scan(codec, 3, iv, memoryview(buf)[base:], base)
    assert err is None and end == len(buf) and [e[0] for e in entries] == offs
    for i, (off, btype, k, stored, raw) in enumerate(entries):
        assert L.is_record(buf, off) and L.btype(buf, off) == btype == F.TREE
        assert L.key(buf, off) == bytes(k) == key[i * 32:(i + 1) * 32]
        assert L.stored(buf, off) == stored and L.stored_at(buf, off, off + L.H_RLEN) == stored
        assert L.stored_at(buf, off, off + L.H_RLEN - 1) == -1
        assert int.from_bytes(buf[off + L.H_RLEN:off + L.H_RLEN + L.U32], "little") == raw == 2048
        assert off + L.HEADER_SIZE + stored == (offs + [end])[i + 1]
    # The tag is what the core checks: one bit flipped there fails the tag check, nothing else.
    off = offs[0]
    bad = bytearray(buf[off:offs[1]])
    bad[L.H_TAG + L.TAG_SIZE - 1] ^= 1
    try:
        native.unpack(codec, 3, iv, off, bytes(bad))
        raise AssertionError("a flipped tag byte passed")
    except native.RecordError as e:
        assert e.kind == "tag"
    assert native.unpack(codec, 3, iv, off, buf[off:offs[1]])[2] == blocks[:2048]


def test_arena_header_offsets_match_its_packing():
    h = F.ArenaHeader(7, bytes(range(16)), bytes(range(50, 66)), 1 << 20)
    b = h.pack(bytes(32))
    assert len(b) == L.ARENA_HEADER_SIZE == F.ARENA_HEADER_SIZE
    assert L.arena_iv(b) == h.iv
    assert b[L.A_UUID:L.A_UUID + L.UUID_SIZE] == h.uuid
    assert int.from_bytes(b[L.A_ARENA:L.A_ARENA + L.U32], "little") == 7
    assert int.from_bytes(b[L.A_SIZE:L.A_SIZE + 8], "little") == 1 << 20
    assert L.arena_tag(b) == b[-L.TAG_SIZE:] and L.arena_tag(b, 8) == b[-L.TAG_SIZE:-8]
