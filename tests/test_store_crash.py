"""Crashes and full disks: kill -9 anywhere keeps everything up to the last sync."""

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from foundation.errors import StoreFull
from foundation.store import Store, Tuning
from foundation.store import format as F
from foundation.store.verify import verify
from tests.conftest import BS, FIRST_PAYLOAD, arena_files, blocks, damage

WRITER = textwrap.dedent("""
    import json, os, sys
    sys.path.insert(0, {root!r})
    from foundation.store import Store, Tuning
    from tests.conftest import blocks
    path, journal, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    t = Tuning(write_buffer_bytes=32 << 10, index_cache_bytes=1 << 20, block_cache_bytes=1 << 20)
    s = Store.open(path, writable=True, tuning=t)
    seed = int(sys.argv[4])
    while True:
        n = 1 + seed % 37
        refs = s.write_blocks(blocks(n, seed=seed))
        if seed % 3 == 0:
            s.sync()
            with open(journal, "a") as f:      # only synced batches are promised
                f.write(json.dumps([seed, n, refs.hex()]) + "\\n")
                f.flush(); os.fsync(f.fileno())
        seed += 1
""")


def kill_rounds(op, tmp_path, mode, rounds, wait):
    """Run the writer on op's store `rounds` times, each killed with SIGKILL wait() seconds after its
    first sync (however slow a loaded machine makes start-up); yields the round number after each kill (the caller checks the store)."""
    script = tmp_path / "writer.py"
    script.write_text(WRITER.format(root=os.path.dirname(os.path.dirname(__file__))))
    journal = tmp_path / "journal"
    journal.touch()
    for round_ in range(rounds):
        synced = journal.stat().st_size
        p = subprocess.Popen([sys.executable, str(script), op.path, str(journal), mode, str(round_ * 100000)])
        deadline = time.monotonic() + 120
        while journal.stat().st_size == synced and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(wait())
        p.send_signal(signal.SIGKILL)
        p.wait()
        yield round_
    assert sum(1 for _ in open(journal)) > rounds


def reads_synced(s, tmp_path):
    """Every batch the writer synced reads back byte for byte."""
    for line in open(tmp_path / "journal"):
        sd, n, refs = json.loads(line)
        assert b"".join(s.read_blocks(bytes.fromhex(refs))) == blocks(n, seed=sd)


@pytest.mark.parametrize("mode", ["hash", "value"])
def test_kill_9_keeps_everything_synced(make_store, tmp_path, mode):
    op = make_store(mode)
    rnd = random.Random(1)
    for _ in kill_rounds(op, tmp_path, mode, 6, lambda: rnd.random() * 0.8):
        with op() as s:  # opens, repairs the tail, and keeps every synced batch
            reads_synced(s, tmp_path)
            found, _ = verify(s)
            assert found == []


def test_torn_tail_is_cut(make_store, mode):
    op = make_store(mode)
    with op() as s:
        refs = s.write_blocks(blocks(20, seed=1))
    last = arena_files(op.path)[-1]
    size = os.path.getsize(last)
    with open(last, "ab") as f:  # half a record after the committed end
        f.write(b"FDNr" + os.urandom(100))
    with op() as s:
        assert any("torn tail" in r for r in s.repaired)
        assert b"".join(s.read_blocks(refs)) == blocks(20, seed=1)
        more = s.write_blocks(blocks(5, seed=2))
        # sealed at its last good record: the new records go to a new arena with a fresh iv
        assert s.log.open.n == 1 and all(a >> 32 == 1 for a in s.log.open.addrs)
    assert os.path.getsize(last) == size + F.TRAILER_SIZE
    with op(writable=False) as s:
        assert b"".join(s.read_blocks(more)) == blocks(5, seed=2)
        assert verify(s)[0] == []


def test_damaged_committed_record_heals_by_writing_again(make_store):
    op = make_store("hash")
    data = blocks(3, seed=3, compressible=0)
    with op() as s:
        refs = s.write_blocks(data)
    last = arena_files(op.path)[-1]
    damage(last, FIRST_PAYLOAD + 10, b"\xff\xfe")
    from foundation.errors import DataCorrupt
    with op() as s:  # archiving goes on; the damage is named
        assert any("arena 0 offset 72" in r for r in s.repaired)
        with pytest.raises(DataCorrupt, match="arena 0 offset 72"):
            s.read(refs[:32])
        assert s.write_blocks(data) == refs  # the damaged block is stored again
    with op(writable=False) as s:
        assert b"".join(s.read_blocks(refs)) == data
        found, _ = verify(s)
        assert [(d.arena, d.offset) for d in found] == [(0, 72)]
    # a header damaged so that the record's length is lost: the next record is found by its header
    with open(last, "r+b") as f:
        f.seek(72)
        f.write(b"XXXX")
    with op() as s:
        assert any("arena 0 offset 72: stepped over damaged committed bytes" in r for r in s.repaired)
        assert b"".join(s.read_blocks(refs)) == data  # the copies written again are served


@pytest.fixture
def tiny_fs(tmp_path):
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True)
    if r.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)])


def test_full_disk(tiny_fs, tmp_path):
    path = tiny_fs / "store"
    path.mkdir()
    Store.create(str(path), arena_size=256 << 10, max_log_size=1 << 20, encrypt=False)
    t = Tuning(write_buffer_bytes=16 << 10)
    saved = []
    with pytest.raises(StoreFull):
        s = Store.open(str(path), writable=True, tuning=t)
        try:
            for seed in range(10000):
                refs = s.write_blocks(blocks(8, seed=seed, compressible=0))
                s.sync()
                saved.append((seed, refs))
        finally:
            try:
                s.close(clean=False)
            except StoreFull:
                pass
    assert saved
    # Free some room, as the user would, and find every synced block intact.
    for f in os.listdir(path / "summaries"):
        os.unlink(path / "summaries" / f)
    with Store.open(str(path), writable=False) as s:
        for seed, refs in saved:
            assert b"".join(s.read_blocks(refs)) == blocks(8, seed=seed, compressible=0)
        assert verify(s)[0] == []


def test_lock_heals_after_kill(make_store, tmp_path):
    op = make_store("hash")
    p = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time; sys.path.insert(0, {os.path.dirname(os.path.dirname(__file__))!r})
        from foundation.store import Store
        s = Store.open({op.path!r}, writable=True); print("locked", flush=True); time.sleep(60)
    """)], stdout=subprocess.PIPE)
    assert p.stdout.readline().strip() == b"locked"
    from foundation.errors import StoreLocked
    with pytest.raises(StoreLocked):
        op()
    p.kill()
    p.wait()
    with op() as s:
        assert s.write(b"after the crash")


def test_reader_steps_over_a_damaged_record_in_the_open_arena(make_store):
    op = make_store("value")
    data = blocks(3, seed=3, compressible=0)
    with op() as s:
        refs = s.write_blocks(data)
    last = arena_files(op.path)[-1]
    damage(last, FIRST_PAYLOAD + 10, b"\xff\xfe")
    from foundation.errors import DataCorrupt
    with op(writable=False) as s:  # the mount must still start
        assert s.log.damaged == [(0, 72)]
        with pytest.raises(DataCorrupt, match="arena 0 offset 72"):
            s.read(refs[:8])
        assert b"".join(s.read_blocks(refs[8:])) == data[BS:]


def test_unsynced_arenas_behind_a_torn_tail_are_set_aside(make_store):
    op = make_store("hash")
    s = op()
    kept = s.write_blocks(blocks(20, seed=20, compressible=0))
    s.sync()
    first = s.log.open.n
    s.write_blocks(blocks(200, seed=21, compressible=0))  # several arenas, never synced
    last = s.log.open.n
    s.close(clean=False)  # as if killed: no sync, no flush
    assert last >= first + 2
    # the page cache lost the end of the first unsynced arena (trailer included)
    path = arena_files(op.path)[first]
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 3000)
    with op() as s:
        assert any("orphans" in r for r in s.repaired)
        assert s.log.open.n == first
        assert b"".join(s.read_blocks(kept)) == blocks(20, seed=20, compressible=0)
        assert verify(s)[0] == []
        again = s.write_blocks(blocks(200, seed=21, compressible=0))
    with op(writable=False) as s:
        assert b"".join(s.read_blocks(again)) == blocks(200, seed=21, compressible=0)
    assert sorted(os.listdir(os.path.join(op.path, "orphans")))


def _lines(path):
    try:
        with open(path) as f:
            return sum(1 for _ in f)
    except FileNotFoundError:
        return 0


def _arenas(path):
    """{file name: bytes} of every arena file."""
    return {os.path.basename(p): open(p, "rb").read() for p in arena_files(path)}


def _rewritten(before, after):
    """Places where an arena file kept its header (so its iv) but an encrypted byte changed: the same
    counter block used for two plaintexts. A trailer is plaintext and may cover a cut tail."""
    out = []
    for name, old in before.items():
        new = after.get(name)
        if new is None or new[:F.ARENA_HEADER_SIZE] != old[:F.ARENA_HEADER_SIZE]:
            continue
        try:
            records_end = F.Trailer.from_tail(new[-F.MAX_TRAILER:], None, int(name[:8])).end
        except ValueError:
            records_end = len(new)
        k = min(len(old), len(new), records_end)
        if old[:k] != new[:k]:
            first = next(i for i in range(k) if old[i] != new[i])
            out.append((name, first))
    return out


@pytest.mark.parametrize("mode", ["hash", "value"])
def test_no_counter_block_is_used_twice_after_a_crash(make_store, tmp_path, mode):
    """Killed at many points, then recovered and written on: no encrypted byte of an arena is ever
    replaced by another under the same iv (issue 22, docs/format.md §5.2)."""
    op = make_store(mode, encrypt=True)
    script = tmp_path / "writer.py"
    script.write_text(WRITER.replace("s = Store.open(path, writable=True, tuning=t)",
                                     "s = Store.open(path, key_file=sys.argv[5], writable=True, tuning=t)")
                      .format(root=os.path.dirname(os.path.dirname(__file__))))
    journal = tmp_path / "journal"
    rnd = random.Random(7)
    seed, torn = 0, 0
    for round_ in range(8):
        p = subprocess.Popen([sys.executable, str(script), op.path, str(journal), mode, str(seed), op.key_file])
        synced = _lines(journal)
        while _lines(journal) < synced + 1 + rnd.randrange(6) and p.poll() is None:
            time.sleep(0.01)   # killed after a few syncs, wherever the writer then is
        time.sleep(rnd.random() * 0.05)
        p.send_signal(signal.SIGKILL)
        p.wait()
        seed += 100000
        last = arena_files(op.path)[-1]
        if round_ % 2:   # the disk kept the start of a write the head never committed
            with open(last, "ab") as f:
                f.write(os.urandom(rnd.randrange(1, 3000)))
        before = _arenas(op.path)
        with op() as s:
            torn += any("torn tail" in r or "orphans" in r for r in s.repaired)
            s.write_blocks(blocks(30, seed=seed + 1))
            s.sync()
        assert _rewritten(before, _arenas(op.path)) == []
    # Most garbage-appended rounds must have met a torn tail (seen 3 or 4 of 4 under load: a kill at
    # some points leaves the garbage where the open names it otherwise).
    assert torn >= 2
    with op(writable=False) as s:
        for line in open(journal):
            sd, n, refs = json.loads(line)
            assert b"".join(s.read_blocks(bytes.fromhex(refs))) == blocks(n, seed=sd)
