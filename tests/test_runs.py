"""Record codec 2, run slices (docs/format.md §5.2): k neighbouring data blocks as one zstd frame.

The C core against its reference (the same bytes, every damaged member
failing loudly with the right error), the store's read paths that must
read a run whole (read, read_many, the log-order restore, verify), gc
compaction of runs part dead, repair, and a reader written from the
format document alone.
"""

import array
import hmac
import json
import os
import random
import struct

import pytest
import zstandard
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.poly1305 import Poly1305
from native_support import impl, other  # noqa: F401 (fixtures)
from test_image_support import BS, content, make_store, open_store, seeded

import foundation.native as N
from foundation.errors import BadInput, DataCorrupt
from foundation.native import RecordError
from foundation.store import format as F
from foundation.store import layout as L
from foundation.store.store import Store
from foundation.store.verify import verify

H = N.HEADER_SIZE
IV = bytes.fromhex("00112233445566778899aabbccddeeff")
ENC = bytes(range(32))
MAC = b"mac key"
WORDS = b"the of and backup arena block index bloom summary score venti foundation disk".split()


def text(rng, size):
    out = bytearray()
    while len(out) < size:
        out += rng.choice(WORDS) + b" %d " % rng.randrange(1000)
    return bytes(out[:size])


def batch(n, bs=4096, seed=1, kinds="tttrtzttdtttttttttttttttttttttttrtt"):
    """n blocks: text (t), random (r: flat), zero (z), a duplicate of the block before (d)."""
    rng = random.Random(seed)
    out = bytearray()
    for i in range(n):
        k = kinds[i % len(kinds)]
        if k == "r":
            out += rng.randbytes(bs)
        elif k == "z":
            out += bytes(bs)
        elif k == "d" and i:
            out += out[-bs:]
        else:
            out += text(rng, bs)
    return bytes(out)


def keys_for(n, seed=2):
    return random.Random(seed).randbytes(32 * n)


def codecs_of(recs, offs, base):
    return [recs[o - base + 5] for o in offs]


# ---- the C core and its reference ---------------------------------------------------------

@pytest.mark.parametrize("enc", [None, ENC])
@pytest.mark.parametrize("run", [2, 4, 16, 64])
def test_runs_are_the_same_bytes_from_both_backends(impl, other, enc, run):
    buf = batch(150)
    n, keys = 150, keys_for(150)
    a, b = impl.Codec(enc, MAC, 1), other.Codec(enc, MAC, 1)
    want = other.pack(b, 3, IV, 72, 1, buf, 4096, keys, run=run)
    assert 2 in codecs_of(want[0], want[1], 72)
    for threads in (1, 2, 5):
        got = impl.pack(a, 3, IV, 72, 1, buf, 4096, keys, threads, run=run)
        assert bytes(got[0]) == bytes(want[0]) and list(got[1]) == list(want[1])
        f = impl.fill(a, buf, 4096, threads, run=run)
        assert bytes(impl.seal(a, 3, IV, 72, 1, buf, 4096, keys, f, threads=threads)[0]) == bytes(want[0])
        inplace = bytearray(buf)  # the batch's own buffer takes the payloads
        f = impl.fill(a, inplace, 4096, threads, inplace, run=run)
        assert bytes(impl.seal(a, 3, IV, 72, 1, inplace, 4096, keys, f, threads=threads)[0]) == bytes(want[0])
    # run 1 is the format before runs, byte for byte
    assert bytes(impl.pack(a, 3, IV, 72, 1, buf, 4096, keys, run=1)[0]) == \
        bytes(other.pack(b, 3, IV, 72, 1, buf, 4096, keys)[0])


def test_what_forms_a_run(impl):
    """Only neighbouring compressible blocks; at most run of them; a lone one is no run; no zstd, no runs."""
    bs = 4096
    buf = batch(12, kinds="ttrtttttrztt")   # t t | r | t t t t t | r | z t t
    f = impl.fill(impl.Codec(None, MAC, 1), buf, bs, run=4)
    runs = [(f.codecs[i], f.runs[2 * i], f.runs[2 * i + 1]) for i in range(12)]
    assert runs == [(2, 0, 2), (2, 1, 2), (0, 0, 0), (2, 0, 4), (2, 1, 4), (2, 2, 4), (2, 3, 4),
                    (1, 0, 0), (0, 0, 0), (2, 0, 3), (2, 1, 3), (2, 2, 3)]
    assert len(set(f.sizes[3:7])) == 1 and f.sizes[3] < bs
    f0 = impl.fill(impl.Codec(None, MAC, 0), buf, bs, run=4)
    assert set(f0.codecs) == {0} and not any(f0.runs)
    one = impl.fill(impl.Codec(None, MAC, 1), buf[:bs], bs, run=4)   # a batch of one block
    assert one.codecs[0] == 1


@pytest.mark.parametrize("enc", [None, ENC])
def test_round_trip_every_path(impl, other, enc):
    buf = batch(90, kinds="ttdtrtzttttttttttttttttttttttttttttttttttt")
    keys = keys_for(90)
    c, o = impl.Codec(enc, MAC, 1), other.Codec(enc, MAC, 1)
    recs, offs = impl.pack(c, 3, IV, 500, 1, buf, 4096, keys, 2, run=16)
    recs = bytes(recs)
    blocks = [buf[i * 4096:(i + 1) * 4096] for i in range(90)]
    for u, codec in ((impl, c), (other, o)):
        got = u.unpack_many(codec, 3, IV, recs, 500, offs, 2)
        assert [g[2] for g in got] == blocks and [g[1] for g in got] == [keys[i * 32:i * 32 + 32] for i in range(90)]
        order = list(range(90))
        random.Random(5).shuffle(order)
        got = u.unpack_many(codec, 3, IV, recs, 500, [offs[i] for i in order], 3)
        assert [g[2] for g in got] == [blocks[i] for i in order]
        out, ks, bad = u.unpack_blocks(codec, 3, IV, recs, 500, offs, 4096, threads=2)
        assert not bad and bytes(out) == buf
        out = bytearray(90 * 4096)
        u.unpack_blocks(codec, 3, IV, recs, 500, offs, 4096, out, 2, array.array("q", reversed(range(90))))
        assert bytes(out) == b"".join(reversed(blocks))
        for i in (0, 17, 45, 89):
            assert u.unpack(codec, 3, IV, offs[i], recs, 500)[2] == blocks[i]
        checked, end, err = u.check_span(codec, 3, IV, recs, 500, N.SCORED, None, 2)
        assert end == 500 + len(recs) and err is None


def test_a_member_alone_asks_for_its_run(impl):
    buf, keys = batch(20), keys_for(20)
    c = impl.Codec(ENC, MAC, 1)
    recs, offs = impl.pack(c, 3, IV, 72, 1, buf, 4096, keys, run=8)
    recs = bytes(recs)
    members = [i for i, o in enumerate(offs) if recs[o - 72 + 5] == 2 and recs[o - 72 + 6] > 0]
    assert members
    for i in members:
        with pytest.raises(RecordError) as e:
            impl.unpack(c, 3, IV, offs[i], recs[offs[i] - 72:])
        assert e.value.kind == "span" and e.value.offset == offs[i]
        first, end = L.run_span(recs, offs[i] - 72)
        assert impl.unpack(c, 3, IV, offs[i], recs[first:end], first + 72)[2] == buf[i * 4096:(i + 1) * 4096]
        # a span cut before the run's end: span, never other bytes
        got = impl.unpack_many(c, 3, IV, recs[:end - 1], 72, [offs[i]])[0]
        assert isinstance(got, RecordError) and got.kind in ("span", "truncated")


@pytest.mark.parametrize("enc", [None, ENC])
def test_a_batch_says_span_only_where_the_member_alone_would(impl, other, enc):
    """Bytes that end inside runs (a span's edge): each member is judged in a batch as when decoded
    alone with the same bytes, its own tag first, so "span" (read the run whole, no damage) is
    never said of a damaged record; the caller takes the batch's answer without a decode alone."""
    buf, keys = batch(24, kinds="t"), keys_for(24)
    c, o = impl.Codec(enc, MAC, 1), other.Codec(enc, MAC, 1)
    recs, offs = impl.pack(c, 3, IV, 72, 1, buf, 4096, keys, run=8)
    recs = bytes(recs)
    assert codecs_of(recs, offs, 72) == [2] * 24
    lo, hi = offs[5] - 72, offs[19] - 72   # from member 5 of the first run to member 3 of the third
    for victim in (None, 6, 18):           # none damaged; a damaged member at each cut end
        bad = bytearray(recs[lo:hi])
        if victim is not None:
            bad[offs[victim] - 72 - lo + H + 1] ^= 0x10   # its payload: its own tag fails
        part = list(offs[5:19])
        want = []
        for x in part:
            try:
                want.append(other.unpack(o, 3, IV, x, bytes(bad), lo + 72))
            except RecordError as e:
                want.append(("bad", e.kind, e.offset))
        for u, codec in ((impl, c), (other, o)):
            got = u.unpack_many(codec, 3, IV, bytes(bad), lo + 72, part, 2)
            assert [("bad", g.kind, g.offset) if isinstance(g, RecordError) else g for g in got] == want
            _, _, bd = u.unpack_blocks(codec, 3, IV, bytes(bad), lo + 72, part, 4096, threads=2)
            assert {k: ("bad", e.kind, e.offset) for k, e in bd.items()} == \
                {k: w for k, w in enumerate(want) if w[0] == "bad"}
        kinds = sorted(w[1] for w in want if w[0] == "bad")
        # the first run's members 5-7 and the third's 0-2 are cut: span, or the victim's tag
        assert kinds == (["span"] * 6 if victim is None else ["span"] * 5 + ["tag"])
        if victim is not None:
            assert want[victim - 5] == ("bad", "tag", offs[victim])


def test_a_run_is_sealed_whole_at_an_arena_end(impl, other):
    buf, keys = batch(40, kinds="t"), keys_for(40)
    c, o = impl.Codec(None, MAC, 1), other.Codec(None, MAC, 1)
    f = impl.fill(c, buf, 4096, run=16)
    assert list(f.runs[1::2]) == [16] * 32 + [8] * 8
    rec = H + f.sizes[0]
    for room in (16 * rec - 1, 16 * rec, 16 * rec + 5 * rec, 32 * rec - 1):
        recs, offs, tags = impl.seal(c, 3, IV, 72, 1, buf, 4096, keys, f, room=room)
        assert len(offs) == 16 * (room // (16 * rec)) and len(recs) <= room
        assert bytes(recs) == bytes(other.seal(o, 3, IV, 72, 1, buf, 4096, keys, other.fill(o, buf, 4096, run=16),
                                               room=room)[0])
    recs, offs, _ = impl.seal(c, 3, IV, 72, 1, buf, 4096, keys, f, first=16)
    assert len(offs) == 24
    with pytest.raises(ValueError):
        impl.seal(c, 3, IV, 72, 1, buf, 4096, keys, f, first=5)   # inside a run


def forge_run(blocks, k_frame=None, pad=b"", R=None, enc=None, base=72, arena=3, tweak=None):
    """A run of records made by hand from the format's words (not by either backend)."""
    k = len(blocks)
    R = R or len(blocks[0])
    frame = zstandard.ZstdCompressor(level=1, write_content_size=True).compress(b"".join(blocks)) \
        if k_frame is None else k_frame
    s = -(-len(frame + pad) // k)
    body = frame + pad + bytes(k * s - len(frame + pad))
    out, pos = bytearray(), base
    for j in range(k):
        payload = body[j * s:(j + 1) * s]
        if enc:
            payload = ctr(enc, pos + H, payload)
        fields = dict(codec=2, j=j, k=k, S=s, R=R)
        if tweak:
            tweak(j, fields)
        head = struct.pack("<4sBBBBII32s", b"FDNr", 1, fields["codec"], fields["j"], fields["k"], fields["S"],
                           fields["R"], bytes([j]) * 32)
        t = hmac.new(MAC, struct.pack("<II", arena, pos) + head + payload, "sha256").digest()[:16]
        out += head + t + payload
        pos += H + len(payload)
    return bytes(out), [base + j * (H + s) for j in range(k)]


def ctr(enc, pos, data):
    block = ((int.from_bytes(IV, "big") + pos // 16) % (1 << 128)).to_bytes(16, "big")
    return Cipher(algorithms.AES(enc), modes.CTR(block)).encryptor().update(bytes(pos % 16) + data)[pos % 16:]


def test_forged_runs(impl, other):
    """Authentic records (good tags) that still must not decode, and one that must."""
    rng = random.Random(3)
    blocks = [text(rng, 1000) for _ in range(4)]
    for u in (impl, other):
        c = u.Codec(None, MAC, 0)
        recs, offs = forge_run(blocks)
        assert [u.unpack(c, 3, IV, o, recs, 72)[2] for o in offs] == blocks
        frame = zstandard.ZstdCompressor(level=1).compress(b"".join(blocks))
        cases = {
            "decompress": [forge_run(blocks, pad=b"\1"),                       # padding not zero
                           forge_run(blocks, pad=bytes(4)),                    # k bytes of padding or more
                           forge_run(blocks, k_frame=frame[:-1]),              # frame cut
                           forge_run(blocks, R=999),                           # declares other than k R
                           forge_run(blocks, k_frame=frame + frame)],          # two frames
            "magic": [forge_run(blocks, tweak=lambda j, f: f.update(k=3) if j == 2 else None),
                      forge_run(blocks, tweak=lambda j, f: f.update(j=1) if j == 2 else None),
                      forge_run(blocks, tweak=lambda j, f: f.update(codec=1, j=0, k=0) if j == 2 else None)],
            "length": [forge_run(blocks, tweak=lambda j, f: f.update(S=f["R"]) if j == 2 else None)],
        }
        for kind, forged in cases.items():
            for recs, offs in forged:
                for m, o in enumerate(offs):
                    with pytest.raises(RecordError) as e:
                        u.unpack(c, 3, IV, o, recs, 72)
                    if kind == "decompress":
                        assert e.value.kind == "decompress" and e.value.offset == o
                    elif m in (0, 1):   # read through the forged member 2: it is named
                        assert (e.value.kind, e.value.offset) == (kind, offs[2]) or \
                            e.value.kind == "magic" and kind == "length"


@pytest.mark.parametrize("enc", [None, ENC])
def test_every_damaged_member_fails_its_whole_run(impl, other, enc):
    """A flipped bit anywhere in a run: every member fails (naming the damaged record where it
    is a check of that record), never returns bytes."""
    buf, keys = batch(8, kinds="t"), keys_for(8)
    c, o = impl.Codec(enc, MAC, 1), other.Codec(enc, MAC, 1)
    recs, offs = impl.pack(c, 3, IV, 72, 1, buf, 4096, keys, run=8)
    recs = bytes(recs)
    assert codecs_of(recs, offs, 72) == [2] * 8
    rng = random.Random(9)
    for m in range(8):
        at = offs[m] - 72
        spots = {"magic": [at, at + 5, at + 6, at + 7], "tag": [at + 8, at + 20, at + 50, at + H + 1,
                                                                  at + H + rng.randrange(recs[at + 8])]}
        for kind, where in spots.items():
            for x in where:
                bad = bytearray(recs)
                bad[x] ^= 0x10 if x != at + 7 else 0x01
                for u, codec in ((impl, c), (other, o)):
                    got = u.unpack_many(codec, 3, IV, bytes(bad), 72, offs)
                    assert all(isinstance(g, RecordError) for g in got), (m, x)
                    for i, g in enumerate(got):
                        assert g.kind in ("magic", "length", "tag", "span", "truncated", "decompress"), g
                    # a member read through the damaged one names it
                    other_member = (m + 3) % 8
                    err = got[other_member]
                    if kind == "tag" and x >= at + 8 and x < at + H:  # header bytes under the tag
                        assert err.offset == offs[m] and err.kind in ("tag", "length")
                    out, ks, bd = u.unpack_blocks(codec, 3, IV, bytes(bad), 72, offs, 4096)
                    assert sorted(bd) == list(range(8))
                    checked, end, e = u.check_span(codec, 3, IV, bytes(bad), 72)
                    if e is None:   # the walk went through: every record has a problem, the
                        assert sorted(checked.problems) == list(range(8))  # damaged one its tag
                        assert checked.problems[m] == "tag" and \
                            set(checked.problems.values()) <= {"tag", "decompress"}


# ---- the store ---------------------------------------------------------------------------

def image(rng, n):
    return content(rng, n)


@pytest.mark.parametrize("mode", ["hash", "value"])
@pytest.mark.parametrize("encrypt", [False, True])
def test_store_reads_runs_every_way(tmp_path, mode, encrypt):
    path = make_store(tmp_path / "s", mode=mode, encrypt=encrypt, run=16,
                      key_file=str(tmp_path / "key") if encrypt else None)
    kw = dict(key_file=str(tmp_path / "key")) if encrypt else {}
    rng = seeded(4)
    data = image(rng, 3 << 20)
    data += data[:BS * 5]   # duplicates
    with open_store(path, **kw) as s:
        refs = s.write_blocks(data)
    with open_store(path, writable=False, **kw) as s:
        assert F.store_run(s.conf) == 16
        counts = {}
        for n in range(s.log.open.n + 1):
            with open(os.path.join(path, "arenas", f"{n:08d}.arena"), "rb") as f:
                buf = f.read()
            entries, _, _ = s.log.scan(n, s.log.iv(n), memoryview(buf)[F.ARENA_HEADER_SIZE:], F.ARENA_HEADER_SIZE)
            for e in entries:
                counts[buf[e[0] + 5]] = counts.get(buf[e[0] + 5], 0) + 1
        assert counts.get(2, 0) > 100 and counts.get(0, 0) > 10
        rs = s.ref_size
        blocks = [data[i:i + BS] for i in range(0, len(data), BS)]
        # read_blocks in log order, read_many of one member, read of each alone
        assert b"".join(s.read_blocks(refs)) == data
        got = {}
        for pos, d in s.read_blocks_in_log_order(refs):
            for k, p in enumerate(pos):
                got[p] = bytes(d[k * BS:(k + 1) * BS])
        assert all(got.get(i, bytes(BS)) == blocks[i] for i in range(len(blocks)))
        for i in range(0, len(blocks), 37):
            s.blocks.clear() if hasattr(s.blocks, "clear") else None
            assert s.read(refs[i * rs:(i + 1) * rs]) == blocks[i]
        damage, checked = verify(s)
        assert not damage and checked >= len(set(blocks)) - 1


def test_verify_and_restore_of_a_store_with_runs(tmp_path, capsys):
    from test_cli_images import cli, day, write
    store = make_store(tmp_path / "s", run=16)
    rng = seeded(11)
    img = content(rng, 4 << 20)
    image_path = tmp_path / "disk.raw"
    write(image_path, img)
    assert cli(capsys, store, "import-image", "vm", image_path, "--at", day(1))[0] == 0
    assert cli(capsys, store, "verify")[0] == 0
    out = tmp_path / "out.raw"
    assert cli(capsys, store, "restore", "vm", out)[0] == 0
    assert out.read_bytes() == img


@pytest.mark.parametrize("margin", [None, 0])
def test_a_restore_whose_spans_cut_runs_reads_each_run_whole(tmp_path, capsys, monkeypatch, margin):
    """Spans far shorter than a run, nearly every end inside one: each read reaches a run's length
    beyond its ends, so every block decodes from its span's own read; with no margin (a run longer
    than it) the runs the ends cut are read again whole and decoded where their blocks belong."""
    from test_cli_images import cli, day, write
    from foundation.store import read as R
    store = make_store(tmp_path / "s", run=16)
    img = b"".join(text(random.Random(i), BS) for i in range(256))
    image_path = tmp_path / "disk.raw"
    write(image_path, img)
    assert cli(capsys, store, "import-image", "vm", image_path, "--at", day(1))[0] == 0
    mended, mend = [], R.Reads._mend_runs
    monkeypatch.setattr(R.Reads, "_mend_runs", lambda self, *a: mended.append(1) or mend(self, *a))
    spans, plan = [], R.Reads._log_spans

    def planned(self, addrs):
        got = plan(self, addrs)
        spans.extend(got)
        return got

    monkeypatch.setattr(R.Reads, "_log_spans", planned)
    monkeypatch.setattr(R, "SPAN_BLOCKS", 5)
    if margin is not None:
        monkeypatch.setattr(R, "RUN_MARGIN", margin)
    out = tmp_path / "out.raw"
    assert cli(capsys, store, "restore", "vm", out)[0] == 0
    assert out.read_bytes() == img
    assert len(spans) > 20 and bool(mended) == (margin == 0)


def test_a_damaged_member_fails_its_run_loudly_in_the_store(tmp_path):
    path = make_store(tmp_path / "s", run=16)
    data = b"".join(text(random.Random(i), BS) for i in range(64))
    with open_store(path) as s:
        refs = s.write_blocks(data)
    arena = os.path.join(path, "arenas", "00000000.arena")
    with open(arena, "rb") as f:
        buf = bytearray(f.read())
    off = F.ARENA_HEADER_SIZE
    assert buf[off + 5] == 2 and buf[off + 7] == 16
    step = H + L.stored(buf, off)
    victim = off + 3 * step   # member 3 of the first run
    buf[victim + H + 7] ^= 0x01
    with open(arena, "wb") as f:
        f.write(buf)
    with open_store(path, writable=False) as s:
        for i in range(16):
            with pytest.raises(DataCorrupt, match=f"arena 0 offset {victim}: "):  # the damaged member
                s.read(refs[i * 32:(i + 1) * 32])
        assert b"".join(s.read_blocks(refs[16 * 32:])) == data[16 * BS:]   # the other runs read
        damage, _ = verify(s)
    # the damaged member by its tag, the other fifteen because their run does not decode
    assert sorted(d.offset for d in damage) == [off + m * step for m in range(16)]
    assert [d.what for d in damage if d.offset == victim][0].endswith("(tag)")


def test_gc_compacts_runs_part_dead(tmp_path, capsys):
    from test_gc import forget, restores, unreachable

    from foundation.gc import collect
    from test_cli_images import cli, day, write
    store = make_store(tmp_path / "s", run=16)
    rng = seeded(21)
    base = content(rng, 1 << 20)
    image_path = tmp_path / "disk.raw"
    history = {}
    for d in range(1, 5):
        img = bytearray(base)
        # a text region that changes every other block each day: its runs die part by part
        for b in range(0, 128, 2):
            at = (1 << 20) - 128 * BS + b * BS
            img[at:at + BS] = text(random.Random(d * 1000 + b), BS)
        write(image_path, bytes(img))
        assert cli(capsys, store, "import-image", "vm", image_path, "--at", day(d))[0] == 0
        history[d] = bytes(img)
    forget(store, {1, 2})
    before = unreachable(store)
    assert before > 0
    with open_store(store) as s:
        collect(s)
    assert restores(store, history) == [3, 4]
    assert unreachable(store) < before
    with open_store(store, writable=False) as s:
        assert not verify(s)[0]


# ---- an independent reader, from docs/format.md §5.2 alone ----------------------------

def doc_read(buf, o, arena, mac, enc=None, iv=None, poly=False):
    """The block of the record at offset o of an arena's bytes, as docs/format.md §2 and §5.2 say."""
    def keystream(key, p, data):  # AES-256-CTR from arena position p
        block = ((int.from_bytes(iv, "big") + p // 16) % (1 << 128)).to_bytes(16, "big")
        return Cipher(algorithms.AES(key), modes.CTR(block)).encryptor().update(bytes(p % 16) + data)[p % 16:]

    def rec(at):
        magic, btype, codec, j, k, S, R, key, tag = struct.unpack_from("<4sBBBBII32s16s", buf, at)
        assert magic == b"FDNr"
        payload = bytes(buf[at + 64:at + 64 + S])
        m = struct.pack("<II", arena, at) + bytes(buf[at:at + 48]) + payload
        if poly:
            otk = keystream(hmac.new(mac, b"foundation record tag", "sha256").digest(), at, bytes(32))
            want = Poly1305.generate_tag(otk, m)
        else:
            want = hmac.new(mac, m, "sha256").digest()[:16]
        assert want == tag, f"tag at {at}"
        if enc:
            payload = keystream(enc, at + 64, payload)
        return codec, j, k, S, R, payload

    codec, j, k, S, R, payload = rec(o)
    if codec == 0:
        return payload
    if codec == 1:
        return zstandard.ZstdDecompressor().decompress(payload)
    assert codec == 2 and 2 <= k <= 64 and j < k and 0 < S < R
    first = o - j * (64 + S)
    joined = b""
    for m in range(k):
        c2, j2, k2, S2, R2, p2 = rec(first + m * (64 + S))
        assert (c2, j2, k2, S2, R2) == (2, m, k, S, R)
        joined += p2
    d = zstandard.ZstdDecompressor().decompressobj()
    frame = d.decompress(joined)
    assert zstandard.frame_content_size(joined) == k * R and len(frame) == k * R
    assert len(d.unused_data) < k and not any(d.unused_data)
    return frame[j * R:(j + 1) * R]


@pytest.mark.parametrize("encrypt,tag", [(False, None), (True, None), (True, "hmac")])
def test_the_format_document_reads_a_store_with_runs(tmp_path, encrypt, tag):
    kf = str(tmp_path / "key") if encrypt else None
    path = make_store(tmp_path / "s", encrypt=encrypt, run=16, key_file=kf, tag=tag)
    with open(os.path.join(path, "foundation.json")) as f:
        poly = json.load(f).get("tag", "hmac") == "poly1305"
    assert poly == (tag is None)  # new stores: Poly1305 tags
    data = content(seeded(8), 2 << 20)
    with open_store(path, key_file=kf) as s:
        s.write_blocks(data)
        s.sync()
        keys = s.keys
        arenas = s.log.open.n + 1
    blocks = {data[i:i + BS] for i in range(0, len(data), BS)}
    seen, runs = 0, 0
    for n in range(arenas):
        with open(os.path.join(path, "arenas", f"{n:08d}.arena"), "rb") as f:
            buf = f.read()
        iv = buf[32:48]
        with open_store(path, writable=False, key_file=kf) as s:
            entries, _, _ = s.log.scan(n, iv, memoryview(buf)[F.ARENA_HEADER_SIZE:], F.ARENA_HEADER_SIZE)
        for e in entries:
            if e[1] != F.DATA:
                continue
            block = doc_read(buf, e[0], n, keys.mac, keys.enc, iv, poly)
            assert block in blocks
            seen += 1
            runs += buf[e[0] + 5] == 2
    assert seen > 100 and runs > 50


def test_init_writes_the_default_and_old_configs_write_no_runs(tmp_path):
    path = make_store(tmp_path / "a")
    with open_store(path) as s:
        assert s.conf["run"] == F.RUN_DEFAULT and s.log.run == F.RUN_DEFAULT
    path = make_store(tmp_path / "b", run=1)
    with open_store(path) as s:
        assert s.log.run == 1
        s.write_blocks(b"".join(text(random.Random(i), BS) for i in range(32)))
    with open(os.path.join(path, "arenas", "00000000.arena"), "rb") as f:
        buf = f.read()
    assert buf[F.ARENA_HEADER_SIZE + 5] == 1
    assert F.store_run({"arena_size": 256 << 10, "block_size": 4096}) == 1
    assert F.store_run({"arena_size": 64 * 4096, "block_size": 4096, "run": 64}) == 31   # half an arena
    with pytest.raises(ValueError, match="not an integer from 1 .no runs. to 64"):
        F.store_run({"arena_size": 1 << 24, "block_size": 4096, "run": 65})
    for bad in (0, 65, "16"):
        (tmp_path / f"bad{bad}").mkdir()
        with pytest.raises(BadInput, match=f"run = {bad!r}, which is not an integer from 1"):
            Store.create(str(tmp_path / f"bad{bad}"), run=bad)
        assert os.listdir(tmp_path / f"bad{bad}") == []   # nothing written


def test_read_and_read_many_of_one_member(tmp_path):
    """A member alone, by read (its window) and read_many (a span of one record): the run is read whole."""
    path = make_store(tmp_path / "s", run=16)
    data = b"".join(text(random.Random(i), BS) for i in range(48))
    with open_store(path) as s:
        s.write_blocks(data)
        s.sync()
    with open_store(path, writable=False) as s:
        oa = s.log.open
        addrs = list(oa.addrs)[:48]
        with open(os.path.join(path, "arenas", "00000000.arena"), "rb") as f:
            buf = f.read()
        assert {buf[(a & 0xFFFFFFFF) + 5] for a in addrs} == {2}
        for i in (0, 1, 15, 16, 30, 47):
            s.log.window = None
            assert s.log.read(addrs[i])[2] == data[i * BS:(i + 1) * BS]
            got = s.log.read_many([addrs[i]])
            assert got[addrs[i]][2] == data[i * BS:(i + 1) * BS]
        got = s.log.read_many(addrs[5:37:3])   # spans that cut runs at both ends
        assert all(got[a][2] == data[i * BS:(i + 1) * BS] for i, a in zip(range(5, 37, 3), addrs[5:37:3]))


def test_a_run_torn_by_a_crash_is_dropped_and_its_blocks_stored_again(tmp_path):
    """A crash mid-write leaves a run's first records whole past the commit point: each verifies alone,
    none decodes. The writer drops them (the arena is sealed before them), so the blocks are stored
    again, never found there by dedup."""
    import shutil
    path = make_store(tmp_path / "s", run=16)
    a = b"".join(text(random.Random(i), BS) for i in range(16))
    b = b"".join(text(random.Random(100 + i), BS) for i in range(32))
    with open_store(path) as s:
        s.write_blocks(a)
        s.sync()
    heads = {x: open(os.path.join(path, x), "rb").read() for x in F.HEADS if os.path.exists(os.path.join(path, x))}
    with open_store(path) as s:
        refs = s.write_blocks(b)
        s.sync()
    arena = os.path.join(path, "arenas", "00000000.arena")
    buf = open(arena, "rb").read()
    off, starts = F.ARENA_HEADER_SIZE, []
    while buf[off:off + 4] == b"FDNr":
        if buf[off + 5] == 2 and buf[off + 6] == 0:
            starts.append(off)
        off += H + L.stored(buf, off)
    assert len(starts) >= 3
    third = starts[2]          # b's second run: cut after its fifth record
    step = H + L.stored(buf, third)
    with open(arena, "r+b") as f:
        f.truncate(third + 5 * step)
    for x, data in heads.items():   # the commit of b never reached the head
        with open(os.path.join(path, x), "wb") as f:
            f.write(data)
    shutil.rmtree(os.path.join(path, "summaries"), ignore_errors=True)
    os.makedirs(os.path.join(path, "summaries"), exist_ok=True)
    with open_store(path) as s:
        assert s.log.open.end == third and all((x & 0xFFFFFFFF) < third for x in s.log.open.addrs)
        refs2 = s.write_blocks(b)
        s.sync()
        assert refs2 == refs
    with open_store(path, writable=False) as s:
        assert b"".join(s.read_blocks(refs)) == b
        assert not verify(s)[0]


def test_the_store_made_for_system_disks_keeps_every_day(tmp_path, capsys):
    """docs/sizing.md's store for system disks (16 KiB blocks, runs of 64, zstd:6), made by `init` as
    the docs say: two days of an image restore exactly, verify passes, and the config keeps the three."""
    import json
    from foundation.cli import main
    from test_cli_images import cli, day, write
    store, key = tmp_path / "s", tmp_path / "k"
    assert main(["--key-file", str(key), "init", str(store), "--arena-size", "4M", "--max-log-size", "64M",
                 "--block-size", "16384", "--run", "64", "--compression", "zstd:6"]) == 0
    config = json.loads((store / "foundation.json").read_text())
    assert (config["block_size"], config["run"], config["compression"]) == (16384, 64, "zstd:6")
    rng = random.Random(5)
    img = bytearray(b"".join(text(random.Random(i), BS) for i in range(1024)) + content(rng, 4 << 20))
    image = tmp_path / "disk.raw"
    write(image, bytes(img))
    assert cli(capsys, store, "--key-file", key, "import-image", "vm", image, "--at", day(1))[0] == 0
    first = bytes(img)
    img[100_000:140_000] = text(rng, 40_000)
    write(image, bytes(img))
    assert cli(capsys, store, "--key-file", key, "import-image", "vm", image, "--at", day(2))[0] == 0
    assert cli(capsys, store, "--key-file", key, "verify")[0] == 0
    for when, want in ((day(1), first), (day(2), bytes(img))):
        out = tmp_path / "out.raw"
        assert cli(capsys, store, "--key-file", key, "restore", f"vm@{when}", out, "--force")[0] == 0
        assert out.read_bytes() == want
