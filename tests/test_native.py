"""The C core against its reference: every test runs on both backends.

`impl` is each backend in turn; `other` is the opposite one, so records
packed by one are unpacked by the other. Known answers come from hashlib,
hmac and cryptography directly, never from either backend.
"""

import array
import hashlib
import hmac
import os
import random
import struct
import subprocess
import sys

import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.poly1305 import Poly1305
from native_support import IMPLS, _built, impl, other  # noqa: F401 (fixtures)

import foundation.native as N
from foundation.native import BucketError, RecordError, cffi_backend

H = N.HEADER_SIZE


WORDS = b"the of and backup arena block index bloom summary score venti foundation disk".split()


def text(rng, size):
    out = bytearray()
    while len(out) < size:
        out += rng.choice(WORDS) + b" "
    return bytes(out[:size])


def mixed(n, bs, seed=1):
    """n blocks: text, random, zero and half-zero in turn."""
    rng = random.Random(seed)
    out = bytearray()
    for i in range(n):
        kind = i % 4
        if kind == 0:
            out += text(rng, bs)
        elif kind == 1:
            out += rng.randbytes(bs)
        elif kind == 2:
            out += bytes(bs)
        else:
            out += rng.randbytes(bs // 2) + bytes(bs - bs // 2)
    return bytes(out)


def keys_for(n, seed=2):
    return random.Random(seed).randbytes(32 * n)


IV = bytes.fromhex("00112233445566778899aabbccddeeff")
ENC = bytes(range(32))
MAC = b"mac key"


# ---- backend choice ------------------------------------------------------------------

def test_backend_and_api():
    forced = os.environ.get("FOUNDATION_NATIVE") == "0"
    assert N.backend == ("reference" if forced else "native")
    assert N.API_VERSION == 3
    assert (N.HEADER_SIZE, N.TAG_SIZE, N.KEY_SIZE, N.RECORD_MAGIC) == (64, 16, 32, b"FDNr")
    for name in N.API:
        assert N.get(name) is getattr(N, name)
        for b in IMPLS.values():
            if b is not None:
                assert hasattr(b, name), (b.name, name)
    with pytest.raises(AttributeError):
        N.get("nonexistent")


def _python(code, **env):
    e = dict(os.environ, **env)
    return subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True)


def test_env_forces_reference():
    r = _python("import foundation.native as n; print(n.backend)", FOUNDATION_NATIVE="0")
    assert r.returncode == 0 and r.stdout.strip() == "reference", r.stderr


def test_missing_module_fails_loudly():
    code = "import sys; sys.modules['foundation._native'] = None; import foundation.native"
    r = _python(code, FOUNDATION_NATIVE="1")
    assert r.returncode != 0 and "not built" in r.stderr
    r = _python(code + "; print(foundation.native.backend)", FOUNDATION_NATIVE="0")
    assert r.returncode == 0 and r.stdout.strip() == "reference", r.stderr


def test_stale_module_fails_loudly():
    code = ("import sys, types; m = types.ModuleType('foundation._native');"
            "m.lib = types.SimpleNamespace(fdn_api_version=lambda: 999); m.ffi = None;"
            "sys.modules['foundation._native'] = m; import foundation.native")
    r = _python(code, FOUNDATION_NATIVE="1")
    assert r.returncode != 0 and "stale" in r.stderr and "999" in r.stderr
    # the right version, built before unpack_many
    r = _python(code.replace("999", "1"), FOUNDATION_NATIVE="1")
    assert r.returncode != 0 and "stale" in r.stderr and "fdn_unpack_many" in r.stderr


# ---- blocks --------------------------------------------------------------------------

def test_zero_flags(impl):
    buf = bytes(8) + b"\0\0\0\1" + bytes(4) + b"\1" + bytes(7)
    assert impl.zero_flags(buf, 4) == bytes([1, 1, 0, 1, 0, 1])
    assert impl.zero_flags(bytearray(buf), 8) == bytes([1, 0, 0])
    assert impl.zero_flags(memoryview(buf), len(buf)) == b"\0"
    assert impl.zero_flags(b"", 4) == b""
    assert impl.zero_flags(b"", 0) == b"\1"  # one empty block
    with pytest.raises(ValueError):
        impl.zero_flags(buf, 5)
    with pytest.raises(ValueError):
        impl.zero_flags(buf, 0)


@pytest.mark.parametrize("key", [None, b"", b"k", b"x" * 64, b"y" * 65, bytes(range(200))])
def test_scores_known_answers(impl, key):
    bs = 96
    buf = mixed(9, bs)
    got = impl.scores(buf, bs, 3, key=key)
    for i in range(9):
        msg = b"\3" + buf[i * bs:(i + 1) * bs]
        want = hashlib.sha256(msg).digest() if key is None else hmac.new(key, msg, "sha256").digest()
        assert got[i * 32:(i + 1) * 32] == want


def test_scores_short_skip_threads(impl):
    short = b"a short last block"
    assert impl.scores(short, len(short), 1) == hashlib.sha256(b"\1" + short).digest()
    assert impl.scores(b"", 0, 2) == hashlib.sha256(b"\2").digest()
    buf = mixed(300, 512)
    skip = bytes(i % 3 == 0 for i in range(300))
    one = impl.scores(buf, 512, 1, key=b"key", skip=skip)
    for i in range(300):
        s = one[i * 32:(i + 1) * 32]
        assert (s == bytes(32)) == bool(skip[i])
    assert impl.scores(memoryview(buf), 512, 1, key=b"key", skip=skip, threads=2) == one
    assert impl.scores(bytearray(buf), 512, 1, key=b"key", skip=skip, threads=7) == one
    with pytest.raises(ValueError):
        impl.scores(buf, 512, 256)
    with pytest.raises(ValueError):
        impl.scores(buf, 512, 1, skip=b"\0")
    with pytest.raises(ValueError):
        impl.scores(buf, 512, 1, threads=0)


# Lengths on each side of SHA-256's padding classes once the type byte is counted: the message
# inside the first block (< 63), filling it (63), and a tail that leaves room for the length (55
# bytes past a block) or does not (56), with and without the HMAC pad's 64 bytes before it.
LANE_LENGTHS = [1, 2, 54, 55, 56, 62, 63, 64, 118, 119, 120, 126, 127, 128, 129, 4096, 16384]


def cpu_has_sha():
    """Whether this CPU has the x86 SHA instructions, as the kernel lists its flags."""
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and "sha_ni" in line.split() for line in f)
    except OSError:
        return False


@pytest.mark.parametrize("bs", LANE_LENGTHS)
def test_scores_four_lanes_are_sha256(bs):
    """Where the CPU has SHA instructions (and only there) the C core scores four blocks at a
    time: every digest is hashlib's and hmac's, for every padding class, every count left over by
    the fours, with blocks skipped between them, on one thread and on several; and the same with
    the lanes off."""
    c = _built("native")
    rng = random.Random(bs)
    assert c.lanes(True) == cpu_has_sha()
    try:
        for n in (1, 3, 4, 5, 8, 11, 130):
            buf = rng.randbytes(bs * n)
            blanks = bytes(i % 5 == 2 for i in range(n))
            for key in (None, rng.randbytes(32), rng.randbytes(100)):
                for sk in (None, blanks):
                    want = b"".join(
                        bytes(32) if sk and sk[i] else
                        (hashlib.sha256(m).digest() if key is None else hmac.new(key, m, "sha256").digest())
                        for i, m in enumerate(b"\7" + buf[i * bs:(i + 1) * bs] for i in range(n)))
                    assert c.scores(buf, bs, 7, key=key, skip=sk, threads=2) == want
                    assert c.scores(buf, bs, 7, key=key, skip=sk) == want
                    assert not c.lanes(False)
                    assert c.scores(buf, bs, 7, key=key, skip=sk) == want
                    c.lanes(True)
    finally:
        c.lanes(True)


def weak_spec(block, btype, seed):
    """The weak hash exactly as the brief states it, word by word."""
    M, mask = 0x9E3779B97F4A7C15, (1 << 64) - 1
    h = seed ^ ((btype + 1) * M % (1 << 64)) ^ len(block)
    padded = block + bytes((8 - len(block) % 8) % 8)
    for i in range(0, len(padded), 8):
        w = int.from_bytes(padded[i:i + 8], "little")
        h ^= (w * 0xFF51AFD7ED558CCD) & mask
        h = (((h << 29) | (h >> 35)) & mask) * M & mask
    h ^= h >> 33
    h = h * 0xC4CEB9FE1A85EC53 & mask
    h ^= h >> 29
    return h


def test_weak_known_values(impl):
    assert impl.weak_hashes(b"", 0, 0, 0) == weak_spec(b"", 0, 0).to_bytes(8, "big")
    assert impl.weak_hashes(b"abc", 3, 1, 7).hex() == "%016x" % weak_spec(b"abc", 1, 7)
    # pinned, so that a change to the function itself is noticed
    for block, btype, seed, want in WEAK_PINNED:
        assert weak_spec(block, btype, seed) == want
        assert impl.weak_hashes(block, len(block), btype, seed) == want.to_bytes(8, "big")
    rng = random.Random(5)
    for size in list(range(0, 40)) + [63, 64, 65, 511, 4096, 4099]:
        block = rng.randbytes(size)
        seed, btype = rng.getrandbits(64), rng.randrange(256)
        assert impl.weak_hashes(block, size, btype, seed) == weak_spec(block, btype, seed).to_bytes(8, "big")


WEAK_PINNED = [
    (b"foundation", 1, 42, 0xDB0992CDA297D660),
    (b"", 0, 0, 0x877E2015A156CDA7),
    (bytes(range(13)), 255, (1 << 64) - 1, 0x12202C491A6319B0),
]


def test_weak_many(impl, other):
    rng = random.Random(6)
    for bs in (1, 7, 8, 13, 512):
        buf = rng.randbytes(bs * 20)
        skip = bytes(rng.random() < 0.3 for _ in range(20))
        a = impl.weak_hashes(buf, bs, 2, 99, skip=skip)
        assert a == other.weak_hashes(buf, bs, 2, 99, skip=skip)
        for i in range(20):
            want = 0 if skip[i] else weak_spec(buf[i * bs:(i + 1) * bs], 2, 99)
            assert a[i * 8:(i + 1) * 8] == want.to_bytes(8, "big")
    with pytest.raises(ValueError):
        impl.weak_hashes(b"x" * 8, 8, 1, 1 << 64)


def test_equal(impl):
    assert impl.equal(b"abc", bytearray(b"abc"))
    assert impl.equal(b"", b"")
    assert not impl.equal(b"abc", b"abd")
    assert not impl.equal(b"abc", b"ab")
    big = os.urandom(1 << 16)
    assert impl.equal(big, memoryview(bytearray(big)))


# ---- records -------------------------------------------------------------------------

def codecs(impl, zlevel):
    return {"plain": impl.Codec(None, MAC, zlevel), "enc": impl.Codec(ENC, MAC, zlevel)}


@pytest.mark.parametrize("zlevel", [0, 3, -1, 19])
@pytest.mark.parametrize("enc", ["plain", "enc"])
def test_pack_unpack_round_trip(impl, other, zlevel, enc):
    bs, n = 1024, 12
    buf = mixed(n, bs)
    keys = keys_for(n)
    mine, theirs = codecs(impl, zlevel)[enc], codecs(other, zlevel)[enc]
    for offset in (0, 5, 4096 + 3):
        recs, offs = impl.pack(mine, 7, IV, offset, 1, buf, bs, keys)
        assert offs[0] == offset and len(offs) == n
        assert offset + len(recs) == offs[-1] + H + int.from_bytes(recs[offs[-1] - offset + 8:][:4], "little")
        for i, off in enumerate(offs):
            rec = recs[off - offset:]
            for c, u in ((mine, impl.unpack), (theirs, other.unpack)):
                btype, key, data = u(c, 7, IV, off, rec)
                assert (btype, key, data) == (1, keys[i * 32:(i + 1) * 32], buf[i * bs:(i + 1) * bs])
        if zlevel:
            # text and zero blocks compress; random ones stay raw
            codec_bytes = [recs[o - offset + 5] for o in offs]
            assert codec_bytes[0] == 1 and codec_bytes[1] == 0 and codec_bytes[2] == 1
        # what the other backend packs, this one unpacks
        recs2, offs2 = other.pack(theirs, 7, IV, offset, 1, buf, bs, keys)
        for i, off in enumerate(offs2):
            assert impl.unpack(mine, 7, IV, off, recs2[off - offset:])[2] == buf[i * bs:(i + 1) * bs]
        if zlevel == 0:
            assert (recs, offs) == (recs2, offs2)  # byte for byte


def test_pack_short_and_empty(impl, other):
    for enc in (None, ENC):
        c, oc = impl.Codec(enc, MAC, 3), other.Codec(enc, MAC, 3)
        for block in (b"", b"x", b"short block" * 3, b"a" * 100):
            recs, offs = impl.pack(c, 0, IV, 100, 2, block, len(block), bytes(32))
            assert offs == [100]
            assert other.unpack(oc, 0, IV, 100, recs) == (2, bytes(32), block)
            assert impl.unpack(c, 0, IV, 100, recs + b"trailing") == (2, bytes(32), block)
    recs, offs = impl.pack(c, 0, IV, 0, 2, b"", 4096, b"")
    assert (recs, offs) == (b"", [])
    for big in (text(random.Random(8), 300_000), os.urandom(100_000)):  # past the scratch buffer
        recs, offs = impl.pack(c, 0, IV, 9, 2, big, len(big), bytes(32))
        assert impl.unpack(c, 0, IV, 9, recs)[2] == big
        assert other.unpack(oc, 0, IV, 9, recs)[2] == big


def test_concurrent_use(impl):
    """One codec and one table shared by Python threads (the C core drops the GIL)."""
    import threading
    c = impl.Codec(ENC, MAC, 3)
    t = impl.Table(32)
    bs, n = 1024, 200
    buf, keys = mixed(n, bs, seed=21), keys_for(n)
    want = impl.pack(c, 3, IV, 0, 1, buf, bs, keys)
    errors = []

    def work(k):
        try:
            for r in range(5):
                got = impl.pack(c, 3, IV, 0, 1, buf, bs, keys, threads=2)
                assert got == want
                recs, offs = got
                for i in range(0, n, 17):
                    assert impl.unpack(c, 3, IV, offs[i], recs[offs[i]:])[2] == buf[i * bs:(i + 1) * bs]
                got = impl.unpack_many(c, 3, IV, recs, 0, offs, threads=2)
                assert b"".join(d for _, _, d in got) == buf
                assert len(impl.scan(c, 3, IV, recs, 0)[0]) == n
                t.add(keys, [k * 1000 + i for i in range(n)])
                assert impl.tables_lookup([t], keys, None)[1] == [0] * n
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors[0]
    assert len(t) == 4 * 5 * n
    assert sorted(t.find(keys[:32])) == sorted(k * 1000 for k in range(4) for _ in range(5))


def test_ctr_and_tag_follow_the_spec(impl):
    """Check the bytes with AES-ECB and hmac directly: the format, not the code."""
    c = impl.Codec(ENC, MAC, 0)
    iv = (2 ** 128 - 3).to_bytes(16, "big")  # the counter wraps inside the payload
    bs, offset, arena = 100, 21, 3
    buf = mixed(3, bs)
    recs, offs = impl.pack(c, arena, iv, offset, 5, buf, bs, keys_for(3))
    ecb = Cipher(algorithms.AES(ENC), modes.ECB()).encryptor()
    for i, off in enumerate(offs):
        rec = recs[off - offset:off - offset + H + bs]
        head, payload = rec[:H], rec[H:]
        magic, btype, codec, res, S, R = struct.unpack("<4sBBHII", head[:16])
        assert (magic, btype, codec, res, S, R) == (b"FDNr", 5, 0, 0, bs, bs)
        ks = bytearray()
        for p in range(off + H, off + H + bs):
            blk = ((int.from_bytes(iv, "big") + p // 16) % 2 ** 128).to_bytes(16, "big")
            ks.append(ecb.update(blk)[p % 16])
        assert bytes(a ^ b for a, b in zip(payload, ks)) == buf[i * bs:(i + 1) * bs]
        want = hmac.new(MAC, struct.pack("<II", arena, off) + head[:48] + payload, "sha256").digest()[:16]
        assert head[48:64] == want



TAGKEY = bytes(range(100, 132))


@pytest.mark.parametrize("enc", [None, ENC])
def test_poly1305_tag_follows_the_spec(impl, enc):
    """With a tag key, a record's tag is Poly1305 under the tag key's AES-CTR keystream at the
    record's own arena positions (format §5.2): checked with AES-ECB and Poly1305 directly."""
    c = impl.Codec(enc, MAC, 0, TAGKEY)
    iv = (2 ** 128 - 5).to_bytes(16, "big")  # the counter wraps within the records
    bs, offset, arena = 100, 21, 3
    buf = mixed(3, bs)
    recs, offs = impl.pack(c, arena, iv, offset, 5, buf, bs, keys_for(3))
    ecb = Cipher(algorithms.AES(TAGKEY), modes.ECB()).encryptor()
    for off in offs:
        rec = recs[off - offset:off - offset + H + bs]
        otk = bytes(ecb.update(((int.from_bytes(iv, "big") + p // 16) % 2 ** 128).to_bytes(16, "big"))[p % 16]
                    for p in range(off, off + 32))
        want = Poly1305.generate_tag(otk, struct.pack("<II", arena, off) + rec[:48] + rec[H:])
        assert rec[48:64] == want
        assert impl.unpack(c, arena, iv, off, recs, offset)[0] == 5


@pytest.mark.parametrize("enc", [None, ENC])
def test_poly1305_tags_agree_and_catch_damage(impl, other, enc):
    """Both backends write the same records with Poly1305 tags (runs too) and read each other's;
    a flipped bit, another arena, offset or iv, or the HMAC reading fails as "tag"."""
    bs, n = 4096, 40
    buf = mixed(n, bs, seed=5)
    keys = keys_for(n)
    c, oc = impl.Codec(enc, MAC, 1, TAGKEY), other.Codec(enc, MAC, 1, TAGKEY)
    recs, offs = impl.pack(c, 2, IV, 72, 1, buf, bs, keys, run=16)
    assert (recs, offs) == other.pack(oc, 2, IV, 72, 1, buf, bs, keys, run=16)
    assert recs != impl.pack(impl.Codec(enc, MAC, 1), 2, IV, 72, 1, buf, bs, keys, run=16)[0]
    assert any(recs[o - 72 + 5] == 2 for o in offs)  # runs were made
    for u, codec in ((impl, c), (other, oc)):
        assert [g[2] for g in u.unpack_many(codec, 2, IV, recs, 72, offs)] == \
            [buf[i * bs:(i + 1) * bs] for i in range(n)]
        entries, end, err = u.scan(codec, 2, IV, recs, 72)
        assert len(entries) == n and err is None
    bad = bytearray(recs)
    bad[offs[3] - 72 + H + 7] ^= 1
    other_iv = bytes(16)
    for u, codec in ((impl, c), (other, oc)):
        for got, at in ((u.unpack_many(codec, 2, IV, bytes(bad), 72, [offs[3]])[0], offs[3]),
                        (u.unpack_many(codec, 3, IV, recs, 72, [offs[0]])[0], offs[0]),
                        (u.unpack_many(codec, 2, other_iv, recs, 72, [offs[0]])[0], offs[0])):
            assert (got.kind, got.offset) == ("tag", at)
        moved = bytes(8) + bytes(recs)  # the same bytes 8 further on
        assert u.unpack_many(codec, 2, IV, moved, 72, [offs[0] + 8])[0].kind == "tag"
        hm = u.Codec(enc, MAC, 1)
        err = u.scan(hm, 2, IV, recs, 72)[2]
        assert (err.kind, err.offset) == ("tag", 72)

def test_pack_threads_identical(impl):
    bs, n = 4096, 300
    buf = mixed(n, bs, seed=9)
    keys = keys_for(n)
    for enc in (None, ENC):
        c = impl.Codec(enc, MAC, 3)
        one = impl.pack(c, 1, IV, 77, 1, buf, bs, keys, threads=1)
        for t in (2, 3, 8):
            assert impl.pack(c, 1, IV, 77, 1, buf, bs, keys, threads=t) == one


@pytest.mark.parametrize("enc", [None, ENC])
def test_fill_seal_is_pack(impl, enc):
    """fill then seal, in pieces cut by room (an arena's end), gives pack's records byte for byte,
    their offsets and the tags scan reads; one short block too; the other backend agrees."""
    bs, n = 4096, 300
    buf = mixed(n, bs, seed=5)
    keys = keys_for(n)
    c = impl.Codec(enc, MAC, 1)
    recs, offs = impl.pack(c, 3, IV, 4096 + 5, 1, buf, bs, keys, threads=2)
    for threads in (1, 2, 3):
        f = impl.fill(c, buf, bs, threads, scratch=bytearray(n * bs))
        assert (f.n, f.blen, len(f.sizes)) == (n, bs, n) and set(f.codecs) == {0, 1}
        got, got_offs, tags, first, off, rng = b"", [], b"", 0, 4096 + 5, random.Random(threads)
        while first < n:
            room = rng.randrange(H + 1, 200_000)
            r, o, t = impl.seal(c, 3, IV, off, 1, buf, bs, keys, f, first, room, threads=threads)
            assert len(r) <= room and len(o) * N.TAG_SIZE == len(t)
            if not o:  # the next record alone does not fit
                assert H + f.sizes[first] > room and len(r) == 0
                continue
            got, got_offs, tags, first, off = got + bytes(r), got_offs + o, tags + t, first + len(o), off + len(r)
        assert (got, got_offs) == (bytes(recs), offs)
        assert tags == impl.scan_columns(c, 3, IV, recs, 4096 + 5)[0].tags
    inplace = bytearray(buf)  # the payloads over their own blocks: the same records
    f = impl.fill(c, inplace, bs, 2, scratch=inplace)
    r, o, _ = impl.seal(c, 3, IV, 4096 + 5, 1, inplace, bs, keys, f, threads=2)
    assert (bytes(r), o) == (bytes(recs), offs)
    assert inplace != buf
    out = bytearray(len(recs) + 10)  # into the caller's buffer, limited by its size too
    r, o, t = impl.seal(c, 3, IV, 4096 + 5, 1, buf, bs, keys, impl.fill(c, buf, bs), out=out[:len(recs) - 1])
    assert len(o) == n - 1 and bytes(r) == bytes(recs[:offs[-1] - 4096 - 5])
    short = b"tiny block" * 7
    f = impl.fill(c, short, len(short))
    r, o, t = impl.seal(c, 0, IV, 0, 2, short, len(short), keys[:32], f)
    r2, o2 = impl.pack(c, 0, IV, 0, 2, short, len(short), keys[:32])
    assert (bytes(r), o) == (bytes(r2), o2)


def test_fill_seal_arguments(impl, other):
    c = impl.Codec(ENC, MAC, 1)
    bs, n = 1024, 8
    buf, keys = mixed(n, bs), keys_for(n)
    f = impl.fill(c, buf, bs)
    with pytest.raises(ValueError):  # a fill of other blocks
        impl.seal(c, 0, IV, 0, 1, buf[:bs * 4], bs, keys[:4 * 32], f)
    with pytest.raises(ValueError):
        impl.seal(c, 0, IV, 0, 1, buf, bs, keys, f, first=n + 1)
    with pytest.raises(ValueError):
        impl.seal(c, 0, IV, 0, 1, buf, bs, keys[:-1], f)
    bad = f._replace(sizes=array.array("I", [bs - 1] * n), codecs=bytearray(n))  # raw, yet shorter
    with pytest.raises(ValueError):
        impl.seal(c, 0, IV, 0, 1, buf, bs, keys, bad)
    with pytest.raises(TypeError):
        impl.fill(other.Codec(None, MAC, 0), buf, bs)


def test_pack_arguments(impl, other):
    c = impl.Codec(None, MAC, 0)
    buf = bytes(64)
    for bad in [dict(iv=b"short"), dict(offset=-1), dict(offset=1 << 32), dict(btype=256),
                dict(keys=b"x"), dict(bs=7), dict(arena=1 << 32), dict(offset=(1 << 32) - 100)]:
        args = dict(codec=c, arena=0, iv=IV, offset=0, btype=1, buf=buf, bs=32, keys=bytes(64))
        args.update(bad)
        with pytest.raises(ValueError):
            impl.pack(**args)
    with pytest.raises(TypeError):
        impl.pack(other.Codec(None, MAC, 0), 0, IV, 0, 1, buf, 32, bytes(64))
    with pytest.raises(ValueError):
        impl.Codec(b"short", MAC, 0)
    with pytest.raises(ValueError):
        impl.Codec(None, MAC, 23)


def one_record(impl, enc=ENC, zlevel=0, block=None, offset=40, arena=2):
    c = impl.Codec(enc, MAC, zlevel)
    block = block if block is not None else text(random.Random(3), 48)
    recs, _ = impl.pack(c, arena, IV, offset, 1, block, len(block), keys_for(1))
    return c, recs


@pytest.mark.parametrize("zlevel", [0, 3])
def test_every_bit_flip_is_caught(impl, other, zlevel):
    c, rec = one_record(impl, zlevel=zlevel)
    oc = other.Codec(ENC, MAC, zlevel)
    for bit in range(len(rec) * 8):
        bad = bytearray(rec)
        bad[bit // 8] ^= 1 << bit % 8
        kinds = []
        for codec, u in ((c, impl.unpack), (oc, other.unpack)):
            with pytest.raises(RecordError) as e:
                u(codec, 2, IV, 40, bytes(bad))
            assert e.value.offset == 40
            kinds.append(e.value.kind)
        assert kinds[0] == kinds[1], bit
        byte = bit // 8
        if byte < 4:
            assert kinds[0] == "magic"
        elif byte == 4 or byte >= 16:
            assert kinds[0] == "tag"  # btype, key, tag, payload
        elif byte in (6, 7):
            assert kinds[0] == "magic"  # reserved
        elif zlevel == 0:
            assert kinds[0] in {5: ("magic", "length")}.get(byte, ("length",))
        else:  # a compressed record's S may shrink (tag) or outgrow the buffer
            assert kinds[0] in ("magic", "length", "tag", "truncated")


def test_wrong_key_place_and_truncation(impl, other):
    c, rec = one_record(impl)
    assert impl.unpack(c, 2, IV, 40, rec)[0] == 1
    # (not MAC + b"\0": HMAC pads short keys with zeros, so that key is the same key)
    for codec in (impl.Codec(ENC, b"other mac", 0), impl.Codec(ENC, MAC[:-1], 0)):
        with pytest.raises(RecordError) as e:
            impl.unpack(codec, 2, IV, 40, rec)
        assert e.value.kind == "tag"
    for arena, off in ((3, 40), (2, 41)):  # a record is authentic only where it was written
        with pytest.raises(RecordError) as e:
            impl.unpack(c, arena, IV, off, rec)
        assert e.value.kind == "tag"
    # a wrong enc key decrypts to garbage the tag cannot see: raw data differs
    assert impl.unpack(impl.Codec(bytes(32), MAC, 0), 2, IV, 40, rec)[2] != impl.unpack(c, 2, IV, 40, rec)[2]
    for cut in range(len(rec)):
        for u, codec in ((impl.unpack, c), (other.unpack, other.Codec(ENC, MAC, 0))):
            with pytest.raises(RecordError) as e:
                u(codec, 2, IV, 40, rec[:cut])
            assert e.value.kind == "truncated", cut
    assert isinstance(e.value, ValueError)


def test_forged_records(impl, other):
    """Authentic (correctly tagged) records that still must not decode."""
    mac = impl.Codec(None, MAC, 0)

    def forge(codec, S, R, payload, off=0):
        head = struct.pack("<4sBBHII32s", b"FDNr", 1, codec, 0, S, R, bytes(32))
        t = hmac.new(MAC, struct.pack("<II", 0, off) + head + payload, "sha256").digest()[:16]
        return head + t + payload

    import zstandard
    frame = zstandard.ZstdCompressor(level=3).compress(b"z" * 1000)
    ok = forge(1, len(frame), 1000, frame)
    for u in (impl.unpack, other.unpack):
        codec = mac if u is impl.unpack else other.Codec(None, MAC, 0)
        assert u(codec, 0, IV, 0, ok)[2] == b"z" * 1000
        cases = {
            "decompress": [forge(1, len(frame), 999, frame),  # declared size disagrees
                           forge(1, 10, 1000, b"not zstd!!"),
                           forge(1, len(frame) + 4, 2000, frame + b"\0\0\0\0"),  # trailing bytes
                           forge(1, len(frame) - 1, 1000, frame[:-1])],
            "length": [forge(0, 5, 6, b"12345"), forge(1, 6, 6, b"123456"), forge(1, 0, 0, b"")],
            "magic": [forge(2, 5, 5, b"12345"), b"FDNx" + ok[4:], ok[:6] + b"\1\0" + ok[8:]],
        }
        for kind, recs in cases.items():
            for rec in recs:
                with pytest.raises(RecordError) as e:
                    u(codec, 0, IV, 0, rec)
                assert e.value.kind == kind


def arena_bytes(impl, codec, batches, base=0, arena=4):
    """Records of several pack calls laid end to end from base."""
    out, offs, pos = bytearray(), [], base
    for i, (buf, bs) in enumerate(batches):
        n = len(buf) // bs if bs != len(buf) else 1
        recs, o = impl.pack(codec, arena, IV, pos, i + 1, buf, bs, keys_for(n, seed=i))
        out += recs
        offs += o
        pos += len(recs)
    return bytes(out), offs


@pytest.mark.parametrize("enc", [None, ENC])
def test_scan(impl, other, enc):
    c = impl.Codec(enc, MAC, 3)
    base = 128
    data, offs = arena_bytes(impl, c, [(mixed(8, 256), 256), (b"tail", 4), (mixed(3, 64, 4), 64)], base)
    end = base + len(data)
    for scanner, codec in ((impl.scan, c), (other.scan, other.Codec(enc, MAC, 3))):
        ents, e_end, err = scanner(codec, 4, IV, data, base)
        assert [e[0] for e in ents] == offs and e_end == end and err is None
        assert ents[8][1:] == (2, keys_for(1, seed=1), 4, 4)
        # zero padding, whole or partial header, is unwritten space
        for pad in (1, 3, 63, 64, 65, 5000):
            assert scanner(codec, 4, IV, data + bytes(pad), base) == (ents, end, None)
        # a torn tail: the last record incomplete
        cut = data[:offs[-1] - base + 70]
        ents2, e_end, err = scanner(codec, 4, IV, cut, base)
        assert ents2 == ents[:-1] and e_end == offs[-1] and err.kind == "truncated" and err.offset == offs[-1]
        for n in (1, 3, 10):  # cut inside the header too
            ents2, e_end, err = scanner(codec, 4, IV, data[:offs[5] - base + n], base)
            assert (len(ents2), e_end, err.kind) == (5, offs[5], "truncated")
        # a corrupt record in the middle: complete, but its tag fails
        bad = bytearray(data)
        bad[offs[4] - base + H + 2] ^= 0x40
        ents2, e_end, err = scanner(codec, 4, IV, bytes(bad), base)
        assert ents2 == ents[:4] and e_end == offs[4] and (err.kind, err.offset) == ("tag", offs[4])
        # verify=False does not read tags...
        assert scanner(codec, 4, IV, bytes(bad), base, verify=False) == (ents, end, None)
        # ...nor does it need the mac key
        assert scanner(impl.Codec(enc, b"?", 3) if scanner is impl.scan else other.Codec(enc, b"?", 3),
                       4, IV, data, base, verify=False) == (ents, end, None)
        # garbage where a header should be
        bad = bytearray(data)
        bad[offs[2] - base:offs[2] - base + 4] = b"XXXX"
        _, e_end, err = scanner(codec, 4, IV, bytes(bad), base)
        assert (e_end, err.kind) == (offs[2], "magic")
        bad = bytearray(data)
        bad[offs[2] - base + 8] ^= 1  # S no longer fits R
        _, e_end, err = scanner(codec, 4, IV, bytes(bad), base)
        assert (e_end, err.kind) in ((offs[2], "length"), (offs[2], "tag"))
        assert scanner(codec, 4, IV, b"", base) == ([], base, None)
        assert scanner(codec, 4, IV, b"FD", base)[2].kind == "truncated"



# ---- check_span ---------------------------------------------------------------------------

SK = b"score key"


def scored_arena(impl, codec, batches, base, skey=SK):
    """Records whose key fields are their blocks' scores (keyed by skey), as a hash-mode store writes."""
    out, offs, pos = bytearray(), [], base
    for i, (buf, bs) in enumerate(batches):
        recs, o = impl.pack(codec, 4, IV, pos, i + 1, buf, bs, impl.scores(buf, bs, i + 1, key=skey))
        out += recs
        offs += o
        pos += len(recs)
    return bytes(out), offs


def checked(impl, codec, data, base, **kw):
    """check_span's answer as plain values: ([(off, btype, R, tag, problem)], end, (error kind, offset))."""
    got, end, err = impl.check_span(codec, 4, IV, data, base, **kw)
    assert isinstance(got, N.Checked) and len(got.tags) == 16 * len(got.offs) == 16 * len(got.btypes)
    recs = [(o, b, r, got.tags[16 * i:16 * i + 16], got.problems.get(i))
            for i, (o, b, r) in enumerate(zip(got.offs, got.btypes, got.raws))]
    assert set(got.problems) <= set(range(len(recs))) and None not in got.problems.values()
    return recs, end, (err.kind, err.offset) if err else None


@pytest.mark.parametrize("zlevel", [0, 3])
@pytest.mark.parametrize("enc", [None, ENC])
@pytest.mark.parametrize("skey", [None, SK])
def test_check_span(impl, other, enc, zlevel, skey):
    """check_span is scan, then unpack and a score of every record: the same answers, bad records named."""
    c, oc = impl.Codec(enc, MAC, zlevel), other.Codec(enc, MAC, zlevel)
    base = 200
    batches = [(mixed(24, 1024, seed=40), 1024), (b"a tail", 6), (b"", 0), (mixed(9, 256, seed=41), 256)]
    data, offs = scored_arena(impl, c, batches, base, skey)
    end = base + len(data)
    scanned, s_end, s_err = impl.scan(c, 4, IV, data, base)
    want = [(o, b, R, data[o - base + 48:o - base + H], None) for o, b, _, S, R in scanned]
    assert [w[0] for w in want] == offs and (s_end, s_err) == (end, None)
    for impl_, codec in ((impl, c), (other, oc)):
        for t in (1, 2, 64):
            assert checked(impl_, codec, data, base, depth=N.SCORED, score_key=skey, threads=t) == (want, end, None)
    assert checked(impl, c, memoryview(bytearray(data + bytes(100))), base) == (want, end, None)
    # a damaged payload (tag), a forged block (decompress), a block that is not its score
    bad = bytearray(data)
    bad[offs[3] - base + H + 5] ^= 1
    junk = b"not a zstd frame"
    bad += forge_at(base + len(bad), 1, len(junk), 4096, junk)
    block = b"x" * 100   # authentic, decodes, yet its key field is zeros
    bad += forge_at(base + len(bad), 0, 100, 100, block if enc is None else encrypt(enc, base + len(bad) + H, block))
    bad += data[offs[1] - base:offs[2] - base]   # a record moved to the wrong offset (tag), then a torn one
    bad += data[offs[0] - base:offs[0] - base + 70]
    bad = bytes(bad)
    problems = {offs[3]: "tag", end: "decompress", end + H + len(junk): "score",
                end + 2 * H + len(junk) + 100: "tag"}
    torn = end + 2 * H + len(junk) + 100 + offs[2] - offs[1]
    forged = end + H + len(junk)
    assert impl.unpack(c, 4, IV, forged, bad[forged - base:])[2] == block
    for impl_, codec in ((impl, c), (other, oc)):
        for t in (1, 3):
            got, g_end, g_err = checked(impl_, codec, bad, base, depth=N.SCORED, score_key=skey, threads=t)
            assert {g[0]: g[4] for g in got if g[4]} == problems
            assert [g[0] for g in got] == offs + sorted(problems)[1:]
            assert [g[3] for g in got] == [bad[o - base + 48:o - base + H] for o in offs + sorted(problems)[1:]]
            assert (g_end, g_err) == (torn, ("truncated", torn))
            # unscored, the forged block passes: only verify's tag and decoding remain
            got = checked(impl_, codec, bad, base, score_key=skey, threads=t)[0]
            assert {g[0]: g[4] for g in got if g[4]} == {k: v for k, v in problems.items() if v != "score"}
            # tags alone: every authentic record passes, written right or not
            got = checked(impl_, codec, bad, base, depth=N.TAGS, score_key=skey, threads=t)[0]
            assert {g[0]: g[4] for g in got if g[4]} == {k: v for k, v in problems.items() if v == "tag"}
    # where scan stops, check_span stops
    cut = bytearray(data)
    cut[offs[5] - base:offs[5] - base + 4] = b"XXXX"
    assert checked(impl, c, bytes(cut), base)[1:] == (offs[5], ("magic", offs[5]))
    assert checked(impl, c, b"", base) == ([], base, None)
    # the wrong mac key fails every tag, and each record is still found
    got = checked(impl, impl.Codec(enc, b"wrong", zlevel), data, base, threads=2)[0]
    assert [(g[0], g[4]) for g in got] == [(o, "tag") for o in offs]


def encrypt(enc, pos, data):
    """data encrypted as it lies at arena position pos under IV (the format's AES-CTR)."""
    block = ((int.from_bytes(IV, "big") + pos // 16) % (1 << 128)).to_bytes(16, "big")
    return Cipher(algorithms.AES(enc), modes.CTR(block)).encryptor().update(bytes(pos % 16) + data)[pos % 16:]


@pytest.mark.parametrize("enc", [None, ENC])
@pytest.mark.parametrize("skey", [None, SK])
def test_check_span_scores_in_fours(impl, enc, skey):
    """A deep check scores records four at a time where it can (one length and type, the CPU's
    lanes): a block that is not its score is named wherever it falls in a group of four, and
    beside records of another length or type; the same with the lanes off."""
    c = impl.Codec(enc, MAC, 3)
    batches = [(mixed(11, 4096, seed=50), 4096, 1), (mixed(2, 1024, seed=51), 1024, 2),
               (mixed(9, 4096, seed=52), 4096, 1), (mixed(6, 4096, seed=53), 4096, 3)]
    bad = {0, 5, 10, 12, 14, 17, 21, 24}   # first, middle and last of groups; the 1 KiB pair; the last type
    data, offs, pos, k = bytearray(), [], 64, 0
    for buf, bs, btype in batches:
        keys = bytearray(impl.scores(buf, bs, btype, key=skey))
        for i in range(len(buf) // bs):
            if k + i in bad:
                keys[32 * i] ^= 1        # authentic (tagged as written), yet not the block's score
        recs, o = impl.pack(c, 4, IV, pos, btype, buf, bs, bytes(keys))
        data += recs
        offs += o
        pos += len(recs)
        k += len(buf) // bs
    native = _built("native")
    try:
        for lanes in (True, False):
            native.lanes(lanes)
            for t in (1, 3):
                got, end, err = impl.check_span(c, 4, IV, bytes(data), 64, depth=N.SCORED, score_key=skey, threads=t)
                assert (got.offs, end, err) == (offs, 64 + len(data), None)
                assert got.problems == {i: "score" for i in bad}
    finally:
        native.lanes(True)


def test_check_span_batches(impl, monkeypatch):
    """More records than one C call returns: the native wrapper calls again from where it stopped."""
    monkeypatch.setattr(cffi_backend, "CHECK_BATCH", 7)
    c = impl.Codec(ENC, MAC, 3)
    data, offs = scored_arena(impl, c, [(mixed(50, 512, seed=42), 512)], 64)
    got, end, err = impl.check_span(c, 4, IV, data, 64, depth=N.SCORED, score_key=SK, threads=2)
    assert got.offs == offs and got.problems == {} and (end, err) == (64 + len(data), None)
    assert got.tags == b"".join(data[o - 64 + 48:o - 64 + H] for o in offs)
    bad = bytearray(data)
    for i in (3, 20, 41):
        bad[offs[i] - 64 + H] ^= 1
    got = impl.check_span(c, 4, IV, bytes(bad), 64, threads=2)[0]
    assert got.offs == offs and got.problems == {3: "tag", 20: "tag", 41: "tag"}
    with pytest.raises(ValueError):
        impl.check_span(c, 4, IV[:8], data, 64)
    with pytest.raises(ValueError, match="depth must be"):
        impl.check_span(c, 4, IV, data, 64, depth=3)
    with pytest.raises(TypeError):
        impl.check_span(object(), 4, IV, data, 64)


# ---- unpack_many ------------------------------------------------------------------------

def many_arena(impl, codec, base=300, arena=4):
    """Records of several batches (4 KiB mixed, a short tail, an empty block, 512 B blocks)."""
    batches = [(mixed(40, 4096, seed=31), 4096), (b"a short tail", 12), (b"", 0),
               (mixed(300, 512, seed=32), 512)]
    return arena_bytes(impl, codec, batches, base, arena)


def many_order(offs, seed=33):
    """offs shuffled, with repeats."""
    rng = random.Random(seed)
    order = offs[:] + rng.choices(offs, k=len(offs) // 3) + [offs[0], offs[0], offs[-1]]
    rng.shuffle(order)
    return order


@pytest.mark.parametrize("zlevel", [0, 3])
@pytest.mark.parametrize("enc", [None, ENC])
def test_unpack_many_matches_unpack(impl, other, enc, zlevel):
    c, oc = impl.Codec(enc, MAC, zlevel), other.Codec(enc, MAC, zlevel)
    base = 300
    data, offs = many_arena(impl, c, base)
    if zlevel:  # both kinds of record are in the batch
        assert {data[o - base + 5] for o in offs} == {0, 1}
    order = many_order(offs)
    want = [impl.unpack(c, 4, IV, o, data[o - base:]) for o in order]
    got = impl.unpack_many(c, 4, IV, data, base, order)
    assert got == want
    assert all(type(k) is bytes and type(d) is bytes and type(b) is int for b, k, d in got)
    assert other.unpack_many(oc, 4, IV, data, base, order) == want
    for t in (2, 3, 64, 1000):
        assert impl.unpack_many(c, 4, IV, data, base, order, threads=t) == want
    # any buffer type, any sequence of offsets
    assert impl.unpack_many(c, 4, IV, memoryview(bytearray(data)), base, tuple(order)) == want
    assert impl.unpack_many(c, 4, IV, data, base, array.array("Q", order), threads=2) == want
    assert impl.unpack_many(c, 4, IV, data, base, iter(order)) == want
    assert impl.unpack_many(c, 4, IV, data, base, []) == []
    # a sub-span holding some of the records
    lo, hi = offs[10], offs[20]
    assert impl.unpack_many(c, 4, IV, data[lo - base:hi - base], lo, offs[10:20]) == \
        [impl.unpack(c, 4, IV, o, data[o - base:]) for o in offs[10:20]]


def forge_at(off, codec, S, R, payload, arena=4):
    """A record tagged (authentic) for its place, whatever it holds."""
    head = struct.pack("<4sBBHII32s", b"FDNr", 9, codec, 0, S, R, bytes(32))
    t = hmac.new(MAC, struct.pack("<II", arena, off) + head + payload, "sha256").digest()[:16]
    return head + t + payload


@pytest.mark.parametrize("enc", [None, ENC])
def test_unpack_many_bad_records(impl, other, enc):
    """Bad records come back as RecordError items; the others still decode."""
    c, oc = impl.Codec(enc, MAC, 3), other.Codec(enc, MAC, 3)
    base = 300
    data, offs = many_arena(impl, c, base)
    good = [impl.unpack(c, 4, IV, o, data[o - base:]) for o in offs]
    bad = bytearray(data)
    damage = {5: "tag", 20: "magic", 200: "length"}
    bad[offs[5] - base + H + 100] ^= 1  # payload
    bad[offs[20] - base + 1] ^= 0x20  # magic
    bad[offs[200] - base + 5] = 0  # now raw, yet S < R
    # authentic, yet not zstd: decompress (the C core finds it in its second pass)
    junk = b"not a zstd frame"
    rec = forge_at(len(bad) + base, 1, len(junk), 4096, junk)
    bad += rec
    offs2 = offs + [len(data) + base]
    damage[len(offs)] = "decompress"
    # the last record torn: truncated
    bad += data[offs[-1] - base:][:H + 3]
    damage[len(offs2)] = "truncated"
    offs2.append(len(data) + len(rec) + base)
    good += [None, None]
    bad = bytes(bad)
    order = many_order(list(range(len(offs2))), seed=34)
    want = []
    for i in order:
        if i in damage:
            with pytest.raises(RecordError) as e:
                impl.unpack(c, 4, IV, offs2[i], bad[offs2[i] - base:])
            assert (e.value.kind, e.value.offset) == (damage[i], offs2[i])
            want.append((damage[i], offs2[i]))
        else:
            want.append(good[i])
    for u, codec in ((impl.unpack_many, c), (other.unpack_many, oc)):
        for t in (1, 2, 5):
            got = u(codec, 4, IV, bad, base, [offs2[i] for i in order], threads=t)
            assert [(g.kind, g.offset) if isinstance(g, RecordError) else g for g in got] == want
            assert sum(isinstance(g, RecordError) for g in got) == sum(i in damage for i in order)
    # every record bad: nothing to decode
    got = impl.unpack_many(impl.Codec(enc, b"wrong", 3), 4, IV, data, base, offs, threads=2)
    assert [(g.kind, g.offset) for g in got] == [("tag", o) for o in offs]
    # a record needs its place: the wrong arena fails every tag
    assert all(g.kind == "tag" for g in impl.unpack_many(c, 5, IV, data, base, offs[:50]))


def test_unpack_many_threads_many_records(impl, other):
    """Thousands of records over several threads, bad ones spread across the parts."""
    c = impl.Codec(ENC, MAC, 3)
    n, bs = 3000 if impl.name == "native" else 600, 256
    data, offs = arena_bytes(impl, c, [(mixed(n, bs, seed=35), bs)], base=0)
    data = bytearray(data)
    for i in range(7, n, n // 9):
        data[offs[i] + H] ^= 0x80
    data = bytes(data)
    one = impl.unpack_many(c, 4, IV, data, 0, offs)
    flat = [(g.kind, g.offset) if isinstance(g, RecordError) else g for g in one]
    assert [g[1] for g in flat if g[0] == "tag"] == [offs[i] for i in range(7, n, n // 9)]
    for t in (2, 4, 7):
        got = impl.unpack_many(c, 4, IV, data, 0, offs, threads=t)
        assert [(g.kind, g.offset) if isinstance(g, RecordError) else g for g in got] == flat
    oc = other.Codec(ENC, MAC, 3)
    got = other.unpack_many(oc, 4, IV, data, 0, offs[:600], threads=2)
    assert [(g.kind, g.offset) if isinstance(g, RecordError) else g for g in got] == flat[:600]


@pytest.mark.parametrize("chunk", [1, 4096, 5000, 1 << 20])
def test_unpack_many_chunks_and_big_records(impl, other, monkeypatch, chunk):
    """Batches larger than one output chunk, records larger than a chunk, lengths forged huge."""
    monkeypatch.setattr(cffi_backend, "UNPACK_CHUNK", chunk)  # the native backend's output per call
    c = impl.Codec(ENC, MAC, 3)
    big = [text(random.Random(36), 300_000), os.urandom(70_000), bytes(1 << 21)]
    batches = [(mixed(30, 4096, seed=37), 4096)] + [(b, len(b)) for b in big] + [(mixed(20, 1000), 1000)]
    data, offs = arena_bytes(impl, c, batches, base=64)
    data = bytearray(data)
    huge = offs[3]  # a compressed 4 KiB text block now claims 2 GiB
    assert data[huge - 64 + 5] == 1
    data[huge - 64 + 15] |= 0x80
    data = bytes(data)
    order = many_order(offs, seed=38)
    want = []
    for o in order:
        try:
            want.append(impl.unpack(c, 4, IV, o, data[o - 64:]))
        except RecordError as e:
            want.append((e.kind, e.offset))
    assert want.count(("tag", huge)) == order.count(huge) > 0
    for u, codec in ((impl.unpack_many, c), (other.unpack_many, other.Codec(ENC, MAC, 3))):
        for t in (1, 2):
            got = u(codec, 4, IV, data, 64, order, threads=t)
            assert [(g.kind, g.offset) if isinstance(g, RecordError) else g for g in got] == want
    got = impl.unpack_many(c, 4, IV, data, 64, array.array("Q", order), threads=3)
    assert [(g.kind, g.offset) if isinstance(g, RecordError) else g for g in got] == want


def test_unpack_many_arguments(impl, other):
    c = impl.Codec(None, MAC, 0)
    base = 1000
    recs, offs = impl.pack(c, 4, IV, base, 1, mixed(4, 64), 64, keys_for(4))
    assert len(impl.unpack_many(c, 4, IV, recs, base, offs)) == 4
    end = base + len(recs)
    for bad in ([base - 1], [end], [0], [-1], [1 << 64], [1.5], ["x"], [None], [offs[0], end + 5]):
        with pytest.raises(ValueError):
            impl.unpack_many(c, 4, IV, recs, base, bad)
    for args in [dict(iv=b"short"), dict(arena=1 << 32), dict(base=-1), dict(base=1 << 32),
                 dict(base=(1 << 32) - 10), dict(threads=0)]:
        kw = dict(codec=c, arena=4, iv=IV, buf=recs, base=base, offsets=offs)
        kw.update(args)
        with pytest.raises(ValueError):
            impl.unpack_many(**kw)
    with pytest.raises(TypeError):
        impl.unpack_many(other.Codec(None, MAC, 0), 4, IV, recs, base, offs)
    assert impl.unpack_many(c, 4, IV, b"", base, []) == []
    with pytest.raises(ValueError):
        impl.unpack_many(c, 4, IV, b"", base, [base])
    # a record near the end of buf: truncated, not an argument error
    cut = recs[:offs[3] - base + H + 10]
    got = impl.unpack_many(c, 4, IV, cut, base, [offs[3], offs[1], end - 70])
    assert [(g.kind, g.offset) for g in got[::2]] == [("truncated", offs[3]), ("magic", end - 70)]
    assert got[1] == impl.unpack(c, 4, IV, offs[1], recs[offs[1] - base:])


def test_scan_many_records(impl, other):
    c = impl.Codec(None, MAC, 0)
    n = 5128  # more than one batch of the native scan
    data, offs = arena_bytes(impl, c, [(bytes(range(256)) * 20 + b"x" * 8, 1)])
    assert len(offs) == n
    for scanner, codec in ((impl.scan, c), (other.scan, other.Codec(None, MAC, 0))):
        ents, end, err = scanner(codec, 4, IV, memoryview(data), 0)
        assert [e[0] for e in ents] == offs and end == len(data) and err is None


# ---- index buckets ---------------------------------------------------------------------

def test_bucket_home(impl):
    rng = random.Random(11)
    keys = sorted(rng.randbytes(32) for _ in range(2000))
    for nb in (1, 7, 1000, 1 << 40, (1 << 64) - 1):
        homes = [impl.bucket_home(k, nb) for k in keys]
        assert homes == sorted(homes) and all(0 <= h < nb for h in homes)
        for k, h in zip(keys[:50], homes):
            assert h == int.from_bytes(k[:8], "big") * nb >> 64
    assert impl.bucket_home(b"\xff" * 8, 10) == 9
    assert impl.bucket_home(b"\x80", 10) == 5  # short keys are zero-padded
    assert impl.bucket_home(b"\x80" + bytes(7), 10) == 5


def entries(rng, n, keylen, dup_every=0):
    out, model = bytearray(), []
    for i in range(n):
        key = model[i - 1][0] if dup_every and i % dup_every == 0 and model else rng.randbytes(keylen)
        addr = rng.getrandbits(64)
        out += key + addr.to_bytes(8, "little")
        model.append((key, addr))
    return out, model


@pytest.mark.parametrize("n", [0, 1, 100, 5000, 70000])
@pytest.mark.parametrize("keylen", [1, 8, 32])
def test_sort_entries(impl, n, keylen):
    rng = random.Random(n + keylen)
    ents, model = entries(rng, n, keylen, dup_every=7)
    ents = bytearray(ents)
    impl.sort_entries(ents, keylen + 8, keylen)
    want = b"".join(k + a.to_bytes(8, "little") for k, a in sorted(model))
    assert bytes(ents) == want
    # extra bytes after the addr order ties
    ents = bytearray(b"k" * keylen + bytes(8) + b"\2" + b"k" * keylen + bytes(8) + b"\1")
    impl.sort_entries(memoryview(ents), keylen + 9, keylen)
    assert ents[keylen + 8] == 1
    with pytest.raises((TypeError, ValueError)):
        impl.sort_entries(bytes(24), 24, 16)
    with pytest.raises(ValueError):
        impl.sort_entries(bytearray(25), 24, 16)


def make_bucket(keylen, items, bucket_size):
    es = keylen + 8
    b = len(items).to_bytes(4, "little") + b"".join(k + a.to_bytes(8, "little") for k, a in items)
    assert len(b) <= bucket_size
    return b + bytes(bucket_size - len(b)), es


def test_bucket_find(impl):
    k1, k2 = b"A" * 16, b"B" * 16
    b, _ = make_bucket(16, [(k1, 1), (k2, 2), (k1, 3)], 100)
    assert impl.bucket_find(b, 16, k1) == [1, 3]
    assert impl.bucket_find(bytearray(b), 16, k2) == [2]
    assert impl.bucket_find(b, 16, b"C" * 16) == []
    bad = (5).to_bytes(4, "little") + b[4:]  # cap is 4
    with pytest.raises(BucketError):
        impl.bucket_find(bad, 16, k1)
    with pytest.raises(ValueError):
        impl.bucket_find(b, 16, b"short")


def index_merge(impl, nbuckets, bucket_size, keylen, sorted_entries, region_size, index=None):
    """Flush sorted entries into an index region by region, as the store does."""
    es = keylen + 8
    index = bytearray(nbuckets * bucket_size) if index is None else index
    spill, pos = b"", 0
    data = bytes(sorted_entries)
    for first in range(0, nbuckets, region_size):
        nregion = min(region_size, nbuckets - first)
        end = first + nregion
        batch = bytearray(spill)
        while pos < len(data) and impl.bucket_home(data[pos:pos + keylen], nbuckets) < end:
            batch += data[pos:pos + es]
            pos += es
        region = bytearray(index[first * bucket_size:end * bucket_size])
        spill = impl.merge(region, first, nregion, bucket_size, keylen, batch, nbuckets)
        index[first * bucket_size:end * bucket_size] = region
    return index, spill


def index_lookup(impl, index, nbuckets, bucket_size, keylen, key, region_size):
    home = impl.bucket_home(key, nbuckets)
    first, found = home, []
    while True:
        nregion = min(region_size, nbuckets - first)
        region = index[first * bucket_size:(first + nregion) * bucket_size]
        addrs, more = impl.lookup(region, first, nregion, bucket_size, keylen, key, nbuckets)
        found += addrs
        if not more:
            return found
        first += nregion


@pytest.mark.parametrize("keylen,bucket_size,n,nbuckets", [
    (8, 4 + 3 * 16, 200, 100),  # cap 3: long overflow chains
    (32, 4 + 5 * 40 + 7, 400, 97),
    (8, 4 + 2 * 16, 150, 80),  # nearly full
])
def test_merge_lookup_model(impl, other, keylen, bucket_size, n, nbuckets):
    rng = random.Random(n)
    ents, model = entries(rng, n, keylen, dup_every=9)
    # clustered keys make chains cross region boundaries
    for i in range(0, n, 5):
        k, a = model[i]
        k = b"\x40" + k[1:]
        model[i] = (k, a)
    ents = b"".join(k + a.to_bytes(8, "little") for k, a in model)
    sorted_ents = bytearray(ents)
    impl.sort_entries(sorted_ents, keylen + 8, keylen)
    for region_size in (1, 7, nbuckets):
        index, spill = index_merge(impl, nbuckets, bucket_size, keylen, sorted_ents, region_size)
        index2, spill2 = index_merge(other, nbuckets, bucket_size, keylen, sorted_ents, region_size)
        assert (index, spill) == (index2, spill2)  # byte for byte
        cap = (bucket_size - 4) // (keylen + 8)
        stored = n - len(spill) // (keylen + 8)
        assert stored == sum(int.from_bytes(index[b * bucket_size:][:4], "little") for b in range(nbuckets))
        assert all(int.from_bytes(index[b * bucket_size:][:4], "little") <= cap for b in range(nbuckets))
        spilled = {(bytes(spill[i:i + keylen]), int.from_bytes(spill[i + keylen:i + keylen + 8], "little"))
                   for i in range(0, len(spill), keylen + 8)}
        want = {}
        for k, a in model:
            if (k, a) not in spilled:
                want.setdefault(k, []).append(a)
        for k in list(want)[:80] + [rng.randbytes(keylen)]:
            got = index_lookup(impl, index, nbuckets, bucket_size, keylen, k, region_size)
            assert sorted(got) == sorted(want.get(k, [])), k.hex()
            assert got == index_lookup(other, index, nbuckets, bucket_size, keylen, k, region_size)
        # merging the same entries again changes nothing
        again = bytearray(index)
        for flush in (impl, other):
            assert index_merge(flush, nbuckets, bucket_size, keylen, sorted_ents, region_size,
                               again) == (index, spill)


def test_merge_repeats_unsorted_and_half_flushed(impl, other):
    """The merge looks only at a bucket's earlier entries for sorted input: exact repeats (next to
    their twin), unsorted input and an index already holding part of the entries give the bytes
    of the reference, which looks at every entry."""
    keylen, bucket_size, nbuckets = 8, 4 + 6 * 16, 40
    rng = random.Random(7)
    model = [(rng.randbytes(keylen), rng.randrange(1 << 40)) for _ in range(150)]
    model += model[10:20] + [(model[3][0], model[3][1] + 1)]  # exact repeats, a key twice
    ents = bytearray(b"".join(k + a.to_bytes(8, "little") for k, a in model))
    impl.sort_entries(ents, keylen + 8, keylen)
    shuffled = [bytes(ents[i:i + 16]) for i in range(0, len(ents), 16)]
    rng.shuffle(shuffled)
    half = bytes(ents[:len(ents) // 32 * 16])
    for region_size in (1, 5, nbuckets):
        for batch in (bytes(ents), b"".join(shuffled)):
            got = index_merge(impl, nbuckets, bucket_size, keylen, batch, region_size)
            assert got == index_merge(other, nbuckets, bucket_size, keylen, batch, region_size)
        # a flush cut short, then every entry merged again: each lands once
        for flush in (impl, other):
            index, _ = index_merge(flush, nbuckets, bucket_size, keylen, half, region_size)
            again = index_merge(flush, nbuckets, bucket_size, keylen, bytes(ents), region_size, index)
            if flush is impl:
                first = again
        assert first == again
        index, spill = first
        stored = sum(int.from_bytes(index[b * bucket_size:][:4], "little") for b in range(nbuckets))
        assert stored + len(spill) // 16 == len(set(shuffled))  # every distinct entry, once


def test_merge_spill_and_errors(impl):
    keylen, bs, nb = 8, 4 + 2 * 16, 10
    key = b"\xf0" + bytes(7)  # home 9 of 10: the last bucket
    ents = b"".join(key + a.to_bytes(8, "little") for a in range(4))
    region = bytearray(2 * bs)
    spill = impl.merge(region, 8, 2, bs, keylen, ents, nb)
    assert spill == ents[32:]  # two fit in bucket 9, two spill: the index is full there
    assert impl.lookup(region, 8, 2, bs, keylen, key, nb) == ([0, 1], False)  # last bucket: no more
    # entries homed past the region come back untouched
    region = bytearray(2 * bs)
    assert impl.merge(region, 0, 2, bs, keylen, ents, nb) == ents and region == bytearray(2 * bs)
    with pytest.raises(ValueError):
        impl.lookup(region, 0, 2, bs, keylen, key, nb)
    # a full bucket at the region's end: the search goes on
    region = bytearray(2 * bs)
    k0 = bytes(8)
    impl.merge(region, 0, 2, bs, keylen, b"".join(k0 + a.to_bytes(8, "little") for a in range(4)), nb)
    assert impl.lookup(region, 0, 2, bs, keylen, k0, nb) == ([0, 1, 2, 3], True)
    # a damaged bucket is refused before anything changes
    bad = bytearray(region)
    bad[bs:bs + 4] = (3).to_bytes(4, "little")
    before = bytes(bad)
    with pytest.raises(BucketError) as e:
        impl.merge(bad, 0, 2, bs, keylen, ents, nb)
    assert (e.value.bucket, e.value.count, e.value.cap) == (1, 3, 2) and bytes(bad) == before
    with pytest.raises(BucketError) as e:
        impl.lookup(bad, 0, 2, bs, keylen, k0, nb)
    assert e.value.bucket == 1
    for args in [(region, 0, 3, bs, keylen, b"", nb),  # region too small
                 (region, 9, 2, bs, keylen, b"", nb),  # past the index
                 (region, 0, 2, 10, keylen, b"", nb),  # bucket holds nothing
                 (region, 0, 2, bs, keylen, b"x", nb)]:  # not whole entries
        with pytest.raises(ValueError):
            impl.merge(*args)
    with pytest.raises(TypeError):
        impl.merge(bytes(region), 0, 2, bs, keylen, b"", nb)


# ---- summary tables ---------------------------------------------------------------------

def test_table_multimap(impl):
    t = impl.Table(4, 0)
    assert len(t) == 0 and t.find(b"aaaa") == []
    t.add(b"aaaabbbbaaaa", [1, 2, 3])
    t.add(b"aaaa", array.array("Q", [4]))
    t.add(bytearray(b"cccc"), (5,))
    assert t.find(b"aaaa") == [1, 3, 4] and t.find(memoryview(b"bbbb")) == [2] and len(t) == 5
    t.add(b"", [])
    t.clear()
    assert len(t) == 0 and t.find(b"aaaa") == []
    t.add(b"aaaa", [9])
    assert t.find(b"aaaa") == [9]
    with pytest.raises(ValueError):
        t.add(b"aaa", [1])
    with pytest.raises(ValueError):
        t.add(b"aaaa", [-1])
    with pytest.raises(ValueError):
        t.add(b"aaaa", [1 << 64])
    with pytest.raises(ValueError):
        t.find(b"aa")


def test_table_entries(impl, other):
    """entries(): every (key, u64le addr) in insertion order, repeated keys too; the same in both backends."""
    rng = random.Random(21)
    for kl in (4, 32):
        t, u = impl.Table(kl, 0), other.Table(kl, 0)
        assert t.entries() == bytearray()
        keys = [rng.randbytes(kl) for _ in range(300)]
        want = []
        for _ in range(4):
            chunk = [rng.choice(keys) for _ in range(500)]
            addrs = [rng.getrandbits(64) for _ in chunk]
            t.add(b"".join(chunk), array.array("Q", addrs))
            u.add(b"".join(chunk), addrs)
            want += [k + a.to_bytes(8, "little") for k, a in zip(chunk, addrs)]
        got = t.entries()
        assert isinstance(got, bytearray) and got == b"".join(want) and u.entries() == got
        t.clear()
        t.add(keys[0], [7])
        assert t.entries() == keys[0] + (7).to_bytes(8, "little")


def test_table_take(impl, other):
    """take(): what entries() gives, as a writable buffer a flush sorts in place; the table is left
    empty and still usable. Repeated keys keep their insertion order through growth."""
    rng = random.Random(22)
    for kl in (8, 32):
        t, u = impl.Table(kl, 0), other.Table(kl, 0)
        assert len(t.take()) == 0 and len(u.take()) == 0
        keys = [rng.randbytes(kl) for _ in range(20000)]
        chunk = keys + [rng.choice(keys[:50]) for _ in range(3000)]
        addrs = [rng.getrandbits(64) for _ in chunk]
        t.add(b"".join(chunk), array.array("Q", addrs))
        u.add(b"".join(chunk), addrs)
        assert t.find(keys[3]) == u.find(keys[3]) and len(t.find(keys[3])) > 1
        want = t.entries()
        got = t.take()
        assert bytes(got) == want == u.take() and len(t) == 0 and t.find(keys[0]) == []
        impl.sort_entries(got, kl + 8, kl)
        es = kl + 8
        ents = [bytes(want[i:i + es]) for i in range(0, len(want), es)]
        assert bytes(got) == b"".join(sorted(ents, key=lambda e: (e[:kl], int.from_bytes(e[kl:], "little"))))
        t.add(keys[1] + keys[1], [5, 6])
        assert t.find(keys[1]) == [5, 6] and len(t) == 2 and t.entries() == keys[1] + bytes([5]) + bytes(7) + keys[1] + bytes([6]) + bytes(7)


def test_table_growth_vs_dict(impl):
    rng = random.Random(13)
    t = impl.Table(32, 10)
    model = {}
    keys = [rng.randbytes(32) for _ in range(3000)]
    for r in range(5):
        chunk = [rng.choice(keys) for _ in range(2000)]
        addrs = [rng.getrandbits(64) for _ in chunk]
        t.add(b"".join(chunk), addrs)
        for k, a in zip(chunk, addrs):
            model.setdefault(k, []).append(a)
    assert len(t) == 10000
    for k in keys[:500] + [rng.randbytes(32) for _ in range(50)]:
        assert t.find(k) == model.get(k, [])


def test_tables_lookup(impl, other):
    a, b, c = impl.Table(8), impl.Table(8), impl.Table(8)
    a.add(b"K1______", [1])
    b.add(b"K1______K2______K2______", [10, 20, 21])
    c.add(b"K3______", [30])
    keys = b"K1______K2______K3______K4______K1______"
    assert impl.tables_lookup([a, b, c], keys, None) == ([1, 20, 30, 0, 1], [0, 1, 2, -1, 0])
    assert impl.tables_lookup([c, b, a], keys, None) == ([10, 20, 30, 0, 10], [1, 1, 0, -1, 1])
    assert impl.tables_lookup([a, b, c], keys, b"\1\0\0\0\1") == ([0, 20, 30, 0, 0], [-1, 1, 2, -1, -1])
    assert impl.tables_lookup([b, b], keys, None)[1] == [0, 0, -1, -1, 0]
    assert impl.tables_lookup([], keys, None, keylen=8) == ([0] * 5, [-1] * 5)
    with pytest.raises(ValueError):
        impl.tables_lookup([], keys, None)
    with pytest.raises(ValueError):
        impl.tables_lookup([a], keys + b"x", None)
    with pytest.raises(ValueError):
        impl.tables_lookup([a, impl.Table(4)], keys, None)
    with pytest.raises(ValueError):
        impl.tables_lookup([a], keys, b"\0")
    with pytest.raises(TypeError):
        impl.tables_lookup([other.Table(8)], keys, None)


def test_tables_absent(impl, other):
    a, b = impl.Table(8), impl.Table(8)
    a.add(b"K1______", [1])
    b.add(b"K2______K2______", [10, 11])
    keys = b"K1______" + bytes(8) + b"K3______K2______K4______" + bytes(8) + b"K3______"
    assert impl.tables_absent([a, b], keys) == [2, 4, 6]     # the all-zero keys (null refs) are not asked
    assert impl.tables_absent([b, a, b], keys) == [2, 4, 6]
    assert impl.tables_absent([a], keys) == [2, 3, 4, 6]
    assert impl.tables_absent([a], b"") == []
    rng = random.Random(9)
    many = [rng.randbytes(8) for _ in range(2000)]
    big = impl.Table(8)
    big.add(b"".join(many[::2]), list(range(1000)))
    assert impl.tables_absent([big], b"".join(many)) == list(range(1, 2000, 2))
    with pytest.raises(ValueError):
        impl.tables_absent([], keys)
    with pytest.raises(ValueError):
        impl.tables_absent([a], keys + b"x")
    with pytest.raises(ValueError):
        impl.tables_absent([a, impl.Table(4)], keys)
    with pytest.raises(TypeError):
        impl.tables_absent([other.Table(8)], keys)


def test_tables_lookup_random(impl, other):
    rng = random.Random(17)
    keys = [rng.randbytes(32) for _ in range(400)]
    mine, theirs = [impl.Table(32) for _ in range(3)], [other.Table(32) for _ in range(3)]
    for i, k in enumerate(keys[:300]):
        j = rng.randrange(3)
        mine[j].add(k, [i])
        theirs[j].add(k, [i])
    q = b"".join(rng.choice(keys) for _ in range(1000))
    skip = bytes(rng.random() < 0.1 for _ in range(1000))
    assert impl.tables_lookup(mine, q, skip) == other.tables_lookup(theirs, q, skip)


def runs_with_collisions(n, target):
    """n bytes in sorted runs (zstd shrinks them to almost nothing) whose byte counts have
    sum of squares `target` (even, at least n * n / 256): flatness by the histogram alone."""
    counts = [n // 256] * 256
    sq = sum(c * c for c in counts)
    while sq < target:
        a = max(range(256), key=counts.__getitem__)
        b = min((v for v in range(256) if v != a), key=lambda v: counts[v] or n)
        step = 2 * (counts[a] - counts[b] + 1)
        if step > target - sq:  # finish with steps of 2 between equal counts
            a, b = next((v, w) for v in range(256) for w in range(v + 1, 256) if counts[v] == counts[w] > 0)
            step = 2
        counts[a] += 1
        counts[b] -= 1
        sq += step
    assert sq == target and sum(counts) == n
    return b"".join(bytes([v]) * c for v, c in enumerate(counts))


def test_flat_blocks_stay_raw(impl, other):
    """Both backends skip zstd on the same blocks: flat ones (every third byte judged),
    even when zstd would shrink them; 256 bytes to 1 MiB only."""
    n = 4096 * 3  # 4096 sampled bytes
    limit = 4096 * 4096 // 181  # 92691: flat at or below
    cases = {
        "random": (os.urandom(4096), 0),
        "random quarter four times": (os.urandom(1024) * 4, 0),
        "text": (text(random.Random(3), 4096), 1),
        "runs at the limit": (bytes(x for b in runs_with_collisions(4096, limit - limit % 2) for x in (b, 0, 0)), 0),
        "runs past the limit": (bytes(x for b in runs_with_collisions(4096, limit - limit % 2 + 2)
                                      for x in (b, 0, 0)), 1),
        "random but a zero tail": (os.urandom(3000) + bytes(1096), 1),
        "a zero head, judged on its first third": (bytes(1400) + os.urandom(2696), 1),
        "random, a short zero head": (bytes(24) + os.urandom(4072), 0),
        "random, 255 bytes (too short to judge)": (os.urandom(200) + bytes(55), 1),
    }
    assert len(cases["runs at the limit"][0]) == n
    for enc in (None, ENC):
        c, oc = impl.Codec(enc, MAC, 1), other.Codec(enc, MAC, 1)
        for name, (block, want) in cases.items():
            for codec, pack in ((c, impl.pack), (oc, other.pack)):
                recs, _ = pack(codec, 0, IV, 0, 1, block, len(block), bytes(32))
                assert recs[5] == want, (name, pack)
            assert impl.unpack(c, 0, IV, 0, recs)[2] == block


@pytest.mark.parametrize("enc", [None, ENC])
def test_scan_same_on_both_backends(impl, other, enc):
    """The batch read of the C core's entries gives the reference's records, end and error
    on intact, torn, tag-damaged and magic-damaged spans (records, keys, lengths alike)."""
    c, o = impl.Codec(enc, MAC, 3), other.Codec(enc, MAC, 3)
    base = 128
    data, offs = arena_bytes(impl, c, [(mixed(8, 256), 256), (b"tail", 4), (mixed(3, 64, 4), 64)], base)
    tag, magic = bytearray(data), bytearray(data)
    tag[offs[4] - base + H + 2] ^= 0x40
    magic[offs[2] - base:offs[2] - base + 4] = b"XXXX"
    for buf in (data, data + bytes(70), data[:offs[-1] - base + 70], data[:offs[5] - base + 3], bytes(tag),
                bytes(magic)):
        for verify in (True, False):
            a, b = impl.scan(c, 4, IV, buf, base, verify), other.scan(o, 4, IV, buf, base, verify)
            assert a[:2] == b[:2] and (a[2] and (a[2].kind, a[2].offset)) == (b[2] and (b[2].kind, b[2].offset))
            assert a[0] and all(isinstance(e[2], bytes) and len(e[2]) == 32 for e in a[0])


def test_pack_into_caller_buffer(impl):
    """pack(out=...) writes the same records into the caller's buffer and returns a view of them."""
    bs, n = 4096, 200
    buf = mixed(n, bs, seed=5)
    keys = keys_for(n)
    for enc in (None, ENC):
        c = impl.Codec(enc, MAC, 1)
        want, woffs = impl.pack(c, 3, IV, 100, 1, buf, bs, keys, threads=2)
        out = bytearray(n * (64 + bs))
        got, offs = impl.pack(c, 3, IV, 100, 1, buf, bs, keys, threads=2, out=out)
        assert bytes(got) == want and offs == woffs
        assert bytes(out[:len(want)]) == want
    with pytest.raises(ValueError):
        impl.pack(c, 3, IV, 100, 1, buf, bs, keys, out=bytearray(n * (64 + bs) - 1))
    with pytest.raises(ValueError):
        impl.pack(c, 3, IV, 100, 1, buf, bs, keys, out=bytes(n * (64 + bs)))


@pytest.mark.parametrize("enc", [None, ENC])
def test_scan_columns_is_scan_in_columns(impl, other, enc):
    """scan_columns gives scan's records as columns (offsets, types, key prefixes, tags read from
    the records themselves), its end and error, on intact, torn and damaged spans, on both
    backends, across more records than one batch of the C core holds."""
    c, o = impl.Codec(enc, MAC, 3), other.Codec(enc, MAC, 3)
    base = 128
    data, offs = arena_bytes(impl, c, [(mixed(8, 256), 256), (b"tail", 4), (mixed(3, 64, 4), 64)], base)
    tag = bytearray(data)
    tag[offs[4] - base + H + 2] ^= 0x40
    many, _ = arena_bytes(impl, c, [(bytes(range(256)) * 20 + b"x" * 8, 1)], base)
    for buf in (data, data + bytes(70), data[:offs[-1] - base + 70], bytes(tag), many):
        for verify in (True, False):
            ents, end, err = impl.scan(c, 4, IV, buf, base, verify)
            for keylen in (32, 8):
                for fn, codec in ((impl.scan_columns, c), (other.scan_columns, o)):
                    got, e2, err2 = fn(codec, 4, IV, buf, base, keylen, verify)
                    assert list(got.offs) == [e[0] for e in ents]
                    assert got.btypes == bytes(e[1] for e in ents)
                    assert got.keys == b"".join(e[2][:keylen] for e in ents)
                    assert got.tags == b"".join(bytes(buf[e[0] - base + H - 16:e[0] - base + H]) for e in ents)
                    assert e2 == end and (err2 and (err2.kind, err2.offset)) == (err and (err.kind, err.offset))
    assert len(impl.scan_columns(c, 4, IV, many, base)[0].offs) > 4096
    for bad in (0, 33, "8"):
        with pytest.raises(ValueError):
            impl.scan_columns(c, 4, IV, data, base, bad)


@pytest.mark.parametrize("error, capacity", [(0.01, 3000), (1e-12, 500)])  # 7 seeds; 39, past the look-ahead
def test_bloom_test_answers_as_the_filters_own_in(impl, tmp_path, error, capacity):
    """bloom_test gives, for every key, what pybloomfiltermmap3's `in` gives: True for every key
    added, and for keys never added the same answers, its false positives included."""
    import mmap as _mmap

    import pybloomfilter

    rng = random.Random(6)
    bf = pybloomfilter.BloomFilter(capacity, error, str(tmp_path / "f"))
    added = [rng.randbytes(32) for _ in range(2500)] + [rng.randbytes(n) for n in range(1, 40)]
    bf.update(added)  # past its capacity: more bits set, more false positives to agree on
    bf.sync()
    others = [rng.randbytes(32) for _ in range(20000)]
    with open(tmp_path / "f", "r+b") as f:
        m = _mmap.mmap(f.fileno(), 0)
    hl = struct.unpack_from("=i", m, 17)[0]
    words = memoryview(m)[-(-(21 + hl) // 256) * 256:]
    try:
        want = bytes(k in bf for k in others)
        assert 0 < want.count(1) < len(others)
        assert impl.bloom_test(words, bf.num_bits, bf.hash_seeds, b"".join(others), 32) == want
        assert impl.bloom_test(words, bf.num_bits, bf.hash_seeds, b"".join(added[:2500]), 32) == b"\1" * 2500
        entries = b"".join(k + struct.pack("<Q", i) for i, k in enumerate(others[:500]))
        assert impl.bloom_test(words, bf.num_bits, bf.hash_seeds, entries, 32, 40) == want[:500]
        assert all(impl.bloom_test(words, bf.num_bits, bf.hash_seeds, k, len(k)) == b"\1" for k in added[2500:])
        assert impl.bloom_test(words, bf.num_bits, bf.hash_seeds, b"", 32) == b""
        _refuses_bad_bloom_arguments(impl.bloom_test)
    finally:
        del words
        m.close()


@pytest.mark.parametrize("error", [0.001, 1e-12])  # 10 seeds; 40, past the look-ahead
def test_bloom_add_sets_the_bits_the_filters_own_add_sets(impl, tmp_path, error):
    """bloom_add on the filter's bit array gives the file pybloomfiltermmap3's add() gives, for keys
    of every tail length and for keys taken from index entries (a step past each key)."""
    import mmap as _mmap
    import shutil

    import pybloomfilter

    rng = random.Random(5)
    ours, theirs = str(tmp_path / "ours"), str(tmp_path / "theirs")
    bf = pybloomfilter.BloomFilter(20000, error, ours)
    bf.sync()
    shutil.copy(ours, theirs)
    ref = pybloomfilter.BloomFilter.open(theirs)
    keys = [rng.randbytes(32) for _ in range(500)]
    odd = [rng.randbytes(n) for n in range(1, 40)]
    ref.update(keys + odd)
    ref.sync()
    with open(ours, "r+b") as f:
        m = _mmap.mmap(f.fileno(), 0)
    hl = struct.unpack_from("=i", m, 17)[0]
    words = memoryview(m)[-(-(21 + hl) // 256) * 256:]
    entries = b"".join(k + struct.pack("<Q", i) for i, k in enumerate(keys[200:]))
    impl.bloom_add(words, bf.num_bits, bf.hash_seeds, b"".join(keys[:200]), 32)
    impl.bloom_add(words, bf.num_bits, bf.hash_seeds, entries, 32, 40)
    for k in odd:
        impl.bloom_add(words, bf.num_bits, bf.hash_seeds, k, len(k))
    del words
    m.close()
    bf.sync()
    with open(ours, "rb") as a, open(theirs, "rb") as b:
        assert a.read() == b.read()
    assert all(k in bf for k in keys + odd)
    _refuses_bad_bloom_arguments(impl.bloom_add)


def _refuses_bad_bloom_arguments(fn):
    """fn (bloom_add or bloom_test) raises ValueError for each argument out of its range."""
    for bad in [dict(nbits=0), dict(nbits=1 << 40), dict(seeds=[]), dict(keylen=0), dict(step=31),
                dict(keys=bytes(33))]:
        args = dict(words=bytearray(64), nbits=512, seeds=[1, 2], keys=bytes(64), keylen=32, step=None)
        args.update(bad)
        with pytest.raises(ValueError):
            fn(**args)
