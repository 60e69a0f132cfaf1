"""native.unpack_blocks: unpack_many's records placed block by block in one buffer, on both backends."""

import array

import pytest

from test_native import ENC, H, IV, MAC, arena_bytes, impl, many_order, mixed, other  # noqa: F401 (fixtures)

BASE = 300


def blocks_arena(impl, codec, bs=4096):
    """An arena span of 60 mixed blocks of bs bytes, then one short record and one of 2 * bs."""
    return arena_bytes(impl, codec, [(mixed(60, bs, seed=41), bs), (b"short", 5), (mixed(2, bs, seed=42), 2 * bs)],
                       BASE, 4)


@pytest.mark.parametrize("zlevel", [0, 3])
@pytest.mark.parametrize("enc", [None, ENC])
def test_unpack_blocks_matches_unpack_many(impl, other, enc, zlevel):
    c, oc = impl.Codec(enc, MAC, zlevel), other.Codec(enc, MAC, zlevel)
    data, offs = blocks_arena(impl, c)
    order = many_order(offs[:60])
    want = impl.unpack_many(c, 4, IV, data, BASE, order)
    for t in (1, 2, 5):
        out, keys, bad = impl.unpack_blocks(c, 4, IV, data, BASE, order, 4096, threads=t)
        assert bad == {}
        assert bytes(out) == b"".join(d for _, _, d in want)
        assert keys == b"".join(k for _, k, _ in want)
    assert other.unpack_blocks(oc, 4, IV, data, BASE, array.array("Q", order), 4096)[:2] == (out, keys)
    # into a buffer of the caller's, larger than needed: the rest is left alone
    mine = bytearray(b"\xee" * (len(order) * 4096 + 10))
    got, _, _ = impl.unpack_blocks(c, 4, IV, data, BASE, order, 4096, out=mine)
    assert got is mine and mine[:len(order) * 4096] == out and mine[-10:] == b"\xee" * 10
    assert impl.unpack_blocks(c, 4, IV, data, BASE, [], 4096) == (bytearray(), b"", {})
    with pytest.raises(ValueError, match="out holds"):
        impl.unpack_blocks(c, 4, IV, data, BASE, order, 4096, out=bytearray(4096))


@pytest.mark.parametrize("enc", [None, ENC])
def test_unpack_blocks_bad_and_odd_records(impl, other, enc):
    """A damaged record, or one of another size, is named in bad; every other block is still in its slot."""
    c = impl.Codec(enc, MAC, 3)
    data, offs = blocks_arena(impl, c)
    short, double = offs[60], offs[61]
    damaged = bytearray(data)
    damaged[offs[7] - BASE + H + 50] ^= 1
    order = [offs[3], short, offs[7], offs[9], double, offs[3], offs[59]]
    want = impl.unpack_many(c, 4, IV, data, BASE, order)
    for im in (impl, other):
        cc = im.Codec(enc, MAC, 3)
        for t in (1, 2):
            out, keys, bad = im.unpack_blocks(cc, 4, IV, bytes(damaged), BASE, order, 4096, threads=t)
            assert sorted(bad) == [1, 2, 4]
            assert (bad[1].kind, bad[1].offset) == ("length", short)
            assert (bad[2].kind, bad[2].offset) == ("tag", offs[7])
            assert (bad[4].kind, bad[4].offset) == ("length", double)
            for i in (0, 3, 5, 6):
                assert out[i * 4096:(i + 1) * 4096] == want[i][2]
                assert keys[i * 32:(i + 1) * 32] == want[i][1]


@pytest.mark.parametrize("enc", [None, ENC])
def test_unpack_blocks_into_slots(impl, other, enc):
    """slots: each block decoded straight to out[slots[i] * bs] (a window in image order), the same
    bytes on both backends and any thread count; other slots left alone; a damaged record or one of
    another size named in bad, the blocks around it in their slots; a slot outside out refused."""
    c = impl.Codec(enc, MAC, 3)
    data, offs = blocks_arena(impl, c)
    short, double = offs[60], offs[61]
    order = many_order(offs[:60])
    want = impl.unpack_many(c, 4, IV, data, BASE, order)
    m = len(order) + 5
    slots = array.array("q", [(7 * i + 3) % m for i in range(len(order))])  # distinct (7 is prime to m), out of order
    assert len(set(slots)) == len(order)
    for im in (impl, other):
        cc = im.Codec(enc, MAC, 3)
        for t in (1, 3):
            out = bytearray(b"\xee" * (m * 4096))
            got, keys, bad = im.unpack_blocks(cc, 4, IV, data, BASE, order, 4096, out=out, threads=t, slots=slots)
            assert got is out and bad == {}
            assert keys == b"".join(k for _, k, _ in want)
            for i, s in enumerate(slots):
                assert out[s * 4096:(s + 1) * 4096] == want[i][2]
            for s in set(range(m)) - set(slots):
                assert out[s * 4096:(s + 1) * 4096] == b"\xee" * 4096
    damaged = bytearray(data)
    damaged[offs[7] - BASE + H + 50] ^= 1
    odd = [offs[3], short, offs[7], double, offs[9]]
    for im in (impl, other):
        cc = im.Codec(enc, MAC, 3)
        out = bytearray(8 * 4096)
        _, keys, bad = im.unpack_blocks(cc, 4, IV, bytes(damaged), BASE, odd, 4096, out=out, slots=[5, 0, 1, 2, 7])
        assert sorted(bad) == [1, 2, 3]
        assert (bad[1].kind, bad[2].kind, bad[3].kind) == ("length", "tag", "length")
        assert out[5 * 4096:6 * 4096] == impl.unpack_many(c, 4, IV, data, BASE, [offs[3]])[0][2]
        assert out[7 * 4096:8 * 4096] == impl.unpack_many(c, 4, IV, data, BASE, [offs[9]])[0][2]
        with pytest.raises(ValueError):
            im.unpack_blocks(cc, 4, IV, data, BASE, odd[:1], 4096, out=bytearray(4096), slots=[1])
