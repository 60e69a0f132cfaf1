"""A restore's window plan in the C core (csrc/plan.c) against its reference: the same sweep,
order, spans and runs on random inputs, and the store's log-order plan unchanged by it."""

import array
import random

import pytest

import foundation.native as N

NAT, REF = N.native_impl, N.reference_impl

pytestmark = pytest.mark.skipif(NAT is None, reason="foundation._native is not built")


def both(name, *args):
    """What each backend's function returns for the same arguments (Tables made per backend)."""
    return [getattr(impl, name)(*args) for impl in (NAT, REF)]


def table(impl, keys, kl):
    t = impl.Table(kl)
    t.add(keys, array.array("Q", range(len(keys) // kl)))
    return t


@pytest.mark.parametrize("seed", range(20))
def test_sweep_same(seed):
    rnd = random.Random(seed)
    kl = 32
    pool = [rnd.randbytes(kl) for _ in range(rnd.randrange(1, 300))]
    window = [rnd.choice(pool) for _ in range(rnd.randrange(1, 400))]  # repeats: a block held twice
    arena = [rnd.choice(pool) if rnd.random() < 0.7 else rnd.randbytes(kl) for _ in range(rnd.randrange(0, 500))]
    aaddrs = array.array("Q", sorted(rnd.sample(range(1 << 40), len(arena))))
    wkeys, akeys = b"".join(window), b"".join(arena)
    done0 = bytearray(rnd.getrandbits(1) for _ in range(len(window))) if seed % 2 else bytearray(len(window))
    out = []
    for impl in (NAT, REF):
        found, done = array.array("Q", [7] * len(window)), bytearray(done0)
        filled = impl.plan_sweep(table(impl, wkeys, kl), akeys, aaddrs, found, done)
        out.append((filled, found.tolist(), bytes(done)))
    assert out[0] == out[1]
    filled, found, done = out[0]
    assert filled == sum(done) - sum(done0)
    first = {}
    for k, a in zip(arena, aaddrs):
        first.setdefault(k, a)
    for j, k in enumerate(window):  # a newly done position holds its key's first address in the arena
        if done[j] and not done0[j]:
            assert found[j] == first[k]


@pytest.mark.parametrize("seed", range(20))
def test_order_same(seed):
    rnd = random.Random(seed)
    rs, n = 32, rnd.randrange(0, 2000)
    refs = rnd.randbytes(n * rs)
    live = array.array("q", sorted(rnd.sample(range(n), rnd.randrange(0, n + 1)))) if seed % 2 else None
    m = n if live is None else len(live)
    found = array.array("Q", (rnd.randrange(1 << 20) << rnd.choice((0, 12)) for _ in range(m)))  # ties too
    a, b = both("plan_order", found, live, refs, rs)
    assert a[0] == b[0] and a[1] == b[1] and a[2] == b[2]
    addrs, positions, keyed = a
    assert list(addrs) == sorted(found)
    for x, p in enumerate(positions):
        assert keyed[x * rs:(x + 1) * rs] == refs[p * rs:(p + 1) * rs]


def test_order_refuses_a_position_outside():
    for impl in (NAT, REF):
        with pytest.raises(ValueError):
            impl.plan_order(array.array("Q", [1]), array.array("q", [3]), bytes(64), 32)


@pytest.mark.parametrize("seed", range(30))
def test_cuts_same(seed):
    rnd = random.Random(seed)
    addrs, a = [], rnd.randrange(1 << 20)
    for _ in range(rnd.randrange(0, 3000)):
        r = rnd.random()
        a += 0 if r < 0.05 else (1 << 32) if r < 0.08 else rnd.choice((64, 1000, 4160, 300000, 1 << 20))
        addrs.append(a)
    addrs = array.array("Q", addrs)
    gap, span, blocks, most = rnd.choice((256 << 10, 4096)), rnd.choice((1 << 20, 4 << 20)), rnd.choice((1, 7, 1024)), 4160
    x, y = both("plan_cuts", addrs, gap, span, blocks, most)
    assert x == y
    i = 0
    for j in x:  # every span: one arena, within span bytes and blocks, no wide gap inside
        assert i < j <= i + blocks
        assert addrs[j - 1] - addrs[i] <= span - most
        assert all(addrs[k] - addrs[k - 1] <= gap for k in range(i + 1, j))
        i = j
    assert i == len(addrs)


@pytest.mark.parametrize("seed", range(20))
def test_runs_same(seed):
    rnd = random.Random(seed)
    leaf, b = array.array("q"), 0
    for _ in range(rnd.randrange(0, 1000)):
        b += 1 if rnd.random() < 0.8 else rnd.randrange(2, 100)
        leaf.append(b)
    positions = array.array("q", sorted(rnd.sample(range(len(leaf)), rnd.randrange(0, len(leaf) + 1))))
    if seed % 3 == 0:
        rnd.shuffle(positions)
    x, y = both("plan_runs", leaf, positions)
    assert x == y
    ls = [leaf[p] for p in positions]
    starts = list(x)
    assert starts[-1] == len(ls) and (not ls or starts[0] == 0)
    for i, j in zip(starts, starts[1:]):
        assert ls[i:j] == list(range(ls[i], ls[i] + j - i))


@pytest.mark.parametrize("impl", [NAT, REF], ids=["native", "reference"])
def test_empty_and_refused(impl):
    e = array.array("Q")
    assert impl.plan_order(e, None, b"", 32) == (e, array.array("q"), b"")
    assert list(impl.plan_cuts(e, 1, 8192, 4, 4160)) == []
    assert list(impl.plan_runs(array.array("q"), array.array("q"))) == [0]
    assert impl.plan_sweep(impl.Table(32), b"", e, array.array("Q"), bytearray()) == 0
    with pytest.raises(ValueError):
        impl.plan_runs(array.array("q", [1]), array.array("q", [5]))  # a position outside leaf
    with pytest.raises(ValueError):
        impl.plan_cuts(array.array("Q", [1, 2]), 1, 100, 0, 4160)  # no block a span
    t = impl.Table(32)
    t.add(bytes(32), array.array("Q", [3]))  # names a position past found
    with pytest.raises(ValueError):
        impl.plan_sweep(t, bytes(32), array.array("Q", [1]), array.array("Q", [0]), bytearray(1))
