"""No single copy of the commit point: two head slots, a commit record at every sync, arenas taken back in."""

import json
import os
import random

import pytest
from test_image_support import content, make_store, mutate, seeded
from test_store_crash import kill_rounds, reads_synced

from foundation.cli import main
from foundation.store import format as F
from foundation.store.primary import Primary
from foundation.store.verify import Kind, verify
from tests.conftest import blocks

SLOTS = F.HEADS


def flip(path):
    b = bytearray(open(path, "rb").read())
    b[37] ^= 0x10
    open(path, "wb").write(bytes(b))


def zero(path):
    open(path, "wb").write(bytes(F.HEAD_SIZE))


def truncate(path):
    os.truncate(path, 50)


def delete(path):
    os.unlink(path)


FAULTS = {"flip": flip, "zero": zero, "truncate": truncate, "delete": delete}


def fill(op, batches=12):
    """Synced batches over several arenas -> [(seed, n, refs)]."""
    out = []
    with op() as s:
        for seed in range(batches):
            n = 20 + seed * 7
            out.append((seed, n, s.write_blocks(blocks(n, seed=seed))))
            s.sync()
        assert s.log.open.n >= (2 if batches >= 12 else 1)
    return out


def reads_all(s, saved):
    for seed, n, refs in saved:
        assert b"".join(s.read_blocks(refs)) == blocks(n, seed=seed)


@pytest.mark.parametrize("fault", sorted(FAULTS))
@pytest.mark.parametrize("which", ["head", "head.1", "both"])
def test_a_damaged_head_copy_costs_nothing_and_heals(make_store, mode, fault, which):
    op = make_store(mode)
    saved = fill(op)
    with op(writable=False) as s:
        want = s.commit()
    for name in (SLOTS if which == "both" else [which]):
        FAULTS[fault](os.path.join(op.path, name))
    with op(writable=False) as s:   # a reader: every batch, the same commit, nothing written
        assert s.commit() == want
        reads_all(s, saved)
        found, _ = verify(s)
        names = SLOTS if which == "both" else [which]
        assert sorted(str(d).split()[2] for d in found) == sorted(names)
        assert all(d.kind is Kind.HEAD_COPY for d in found)
    with Primary(op.path) as p:
        assert p.commit() == want
        assert p.read_head()[1].position == want.position
    with op() as s:                  # the next writer rewrites what is missing or damaged
        assert s.commit() == want
        assert any("head" in r for r in s.repaired), s.repaired
        reads_all(s, saved)
    for name in SLOTS:
        F.Head.unpack(open(os.path.join(op.path, name), "rb").read(), Primary(op.path).keys.mac)
    with op(writable=False) as s:
        assert verify(s)[0] == []
        reads_all(s, saved)


def test_generation_counts_commits_and_alternates_slots(make_store, mode):
    op = make_store(mode)
    with op() as s:
        g0 = s.commit().generation
        s.write_blocks(blocks(3, seed=1))
        s.sync()
        s.sync()                     # nothing new: no commit, no write
        g1 = s.commit()
        assert g1.generation == g0 + 1
        s.write_blocks(blocks(3, seed=2))
        s.sync()
        g2 = s.commit()
        assert g2.generation == g1.generation + 1 and g2.position > g1.position
    mac = Primary(op.path).keys.mac
    heads = {n: F.Head.unpack(open(os.path.join(op.path, n), "rb").read(), mac) for n in SLOTS}
    assert heads[SLOTS[g2.generation % 2]].generation == g2.generation
    assert heads[SLOTS[g1.generation % 2]].generation == g1.generation
    # The newest slot torn: the older one and the commit record in the log give the newest commit.
    zero(os.path.join(op.path, SLOTS[g2.generation % 2]))
    with op(writable=False) as s:
        assert s.commit() == g2


def test_old_head_put_back_takes_newer_arenas_in(make_store, mode):
    op = make_store(mode)
    with op() as s:
        first = [(0, 10, s.write_blocks(blocks(10, seed=0)))]
        s.sync()
    old = {n: open(os.path.join(op.path, n), "rb").read() for n in SLOTS}
    saved = first + fill(op)[1:]
    with op(writable=False) as s:
        want = s.commit()
    for n, b in old.items():            # a head from an older copy of the disk, beside the new arenas
        open(os.path.join(op.path, n), "wb").write(b)
    with op(writable=False) as s:
        assert s.commit() == want
        reads_all(s, saved)
    with op() as s:
        assert s.commit() == want
        assert any("taken in" in r for r in s.repaired)
        s.write_blocks(blocks(5, seed=99))
        s.sync()
        reads_all(s, saved)
    assert not os.path.exists(os.path.join(op.path, "orphans"))


def test_store_from_before_head_copies_opens_and_gets_its_second_copy(make_store, mode):
    op = make_store(mode)
    saved = fill(op, 4)
    with op(writable=False) as s:
        h = s.log.head
    mac = Primary(op.path).keys.mac
    # As a first-version store has it: `head` alone, generation (then `reserved`) 0.
    os.unlink(os.path.join(op.path, "head.1"))
    open(os.path.join(op.path, "head"), "wb").write(F.Head(h.arena, h.end, h.count, h.chain, 0).pack(mac))
    with op(writable=False) as s:
        assert verify(s)[0] == []
        reads_all(s, saved)
    with op() as s:
        assert any("second head copy head.1" in r for r in s.repaired), s.repaired
    assert os.path.exists(os.path.join(op.path, "head.1"))


def cli(capsys, store, *args):
    capsys.readouterr()
    rc = main(["--store", str(store), *map(str, args)])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("mode", ["hash", "value"])
def test_cli_every_day_with_every_head_copy_gone_then_put_back_old(tmp_path, capsys, mode):
    store = make_store(tmp_path / "store", mode=mode)
    rng = seeded(17)
    img = bytearray(content(rng, 1 << 20))
    image = tmp_path / "disk.raw"
    days = []
    for d in range(1, 7):
        if d > 1:
            mutate(rng, img)
        image.write_bytes(img)
        assert cli(capsys, store, "import-image", "vm", image, "--at", f"2024-05-{d:02d}")[0] == 0
        days.append(bytes(img))
        if d == 2:
            old = {n: (tmp_path / "store" / n).read_bytes() for n in SLOTS}

    def every_day():
        for d, want in enumerate(days, 1):
            out = tmp_path / "out.raw"
            rc, _, err = cli(capsys, store, "restore", f"vm@2024-05-{d:02d}", out, "--force")
            assert rc == 0, err
            assert out.read_bytes() == want

    for n in SLOTS:
        flip(os.path.join(store, n))
    every_day()
    rc, out, _ = cli(capsys, store, "verify")
    assert rc == 1 and "DAMAGED head copy head is damaged" in out and "only a head copy is damaged" in out
    rc, out, _ = cli(capsys, store, "rebuild")
    assert rc == 0 and "every head copy was missing or damaged" in out
    assert cli(capsys, store, "verify")[0] == 0
    # An old head (day 2) put back: the next import takes the newer arenas back in, nothing moves aside.
    for n, b in old.items():
        (tmp_path / "store" / n).write_bytes(b)
    mutate(rng, img)
    image.write_bytes(img)
    assert cli(capsys, store, "import-image", "vm", image, "--at", "2024-05-07")[0] == 0
    days.append(bytes(img))
    assert not os.path.exists(os.path.join(store, "orphans"))
    rc, out, _ = cli(capsys, store, "list", "vm", "--json")
    assert len(json.loads(out)) == 7
    every_day()
    assert cli(capsys, store, "verify")[0] == 0


@pytest.mark.parametrize("mode", ["hash", "value"])
def test_kill_9_with_a_head_copy_lost_keeps_everything_synced(make_store, tmp_path, mode):
    op = make_store(mode)
    rnd = random.Random(7)
    for round_ in kill_rounds(op, tmp_path, mode, 6, lambda: rnd.random() * 1.2):
        # A random fault on one head copy (or both, every third round) after the crash.
        for n in SLOTS if round_ % 3 == 2 else [rnd.choice(SLOTS)]:
            if os.path.exists(os.path.join(op.path, n)):
                FAULTS[rnd.choice(sorted(FAULTS))](os.path.join(op.path, n))
        with op(writable=False) as s:      # a reader first: it writes nothing
            reads_synced(s, tmp_path)
        with op() as s:
            reads_synced(s, tmp_path)
            assert verify(s)[0] == []


def test_old_head_beside_arenas_gc_rewrote_takes_them_in(tmp_path, capsys):
    """gc (compare-by-hash) rewrote sealed arenas after the old head's: their compacted trailers
    still chain on, so they are taken in, never cut or set aside."""
    from test_gc import BIG, forget, restores

    store = make_store(tmp_path / "store", mode="hash")
    rng = seeded(7)
    img = bytearray(content(rng, 1 << 20) + bytes(BIG))
    image = tmp_path / "disk.raw"
    history = {}
    for d in range(1, 7):
        img[rng.randrange(0, 1 << 20) // 4096 * 4096:][:4096] = rng.randbytes(4096)
        img[1 << 20:] = rng.randbytes(BIG) if d % 2 == 0 else bytes(BIG)
        image.write_bytes(img)
        assert cli(capsys, store, "import-image", "vm", image, "--at", f"2024-05-{d:02d}")[0] == 0
        history[d] = bytes(img)
        if d == 1:
            old = {n: (tmp_path / "store" / n).read_bytes() for n in SLOTS}
    forget(store, {2, 4})
    rc, out, err = cli(capsys, store, "gc", "--min-garbage", "0.01")
    assert rc == 0, err
    with Primary(store) as p:
        want = p.commit()
        assert any(p.trailer(n) and p.trailer(n).generation for n in range(want.arena))  # something was compacted
    for n, b in old.items():
        (tmp_path / "store" / n).write_bytes(b)
    with Primary(store) as p:
        assert p.commit() == want
    assert restores(store, history) == [1, 3, 5, 6]
    img[:4096] = rng.randbytes(4096)
    image.write_bytes(img)
    assert cli(capsys, store, "import-image", "vm", image, "--at", "2024-05-07")[0] == 0
    history[7] = bytes(img)
    assert not os.path.exists(os.path.join(store, "orphans"))
    assert restores(store, history) == [1, 3, 5, 6, 7]
    assert cli(capsys, store, "verify")[0] == 0
