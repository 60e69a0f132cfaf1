"""The store: round trips in both modes, dedup, derived structures, bad input."""

import os
import random
import shutil
import threading

import pytest

from foundation.errors import (BadInput, DataCorrupt, KeyMissing, StoreLocked, StoreMissing,
                               StoreNotEmpty, WrongKey)
from foundation.store import BlockType, Store, Tuning
from foundation.store.verify import verify
from tests.conftest import BS, FIRST_PAYLOAD, arena_files, blocks, damage


@pytest.mark.parametrize("encrypt", [False, True])
def test_round_trip_and_dedup(make_store, mode, encrypt):
    op = make_store(mode, encrypt=encrypt)
    data = blocks(300, seed=1) + bytes(BS * 3) + blocks(5, seed=1)  # zeros, and 5 repeats
    with op() as s:
        refs = s.write_blocks(data)
        assert len(refs) == 308 * s.ref_size
        assert refs[300 * s.ref_size:303 * s.ref_size] == s.null_ref * 3
        # the repeated blocks get the same names as the first copies
        assert refs[303 * s.ref_size:] == refs[:5 * s.ref_size]
        got = s.read_blocks(refs)
        assert b"".join(got) == data
        records = s.counters["records"]
        assert records == 300
    with op() as s:
        assert b"".join(s.read_blocks(refs)) == data
        again = s.write_blocks(data)  # everything is a duplicate now
        assert again == refs
        assert s.counters["records"] == 300
        assert s.log.open.n >= 2  # spans several 256 KiB arenas
        damage, checked = verify(s)
        assert damage == [] and checked == 300


def test_short_blocks_and_types(make_store, mode):
    op = make_store(mode)
    with op() as s:
        a = s.write(b"tree node", BlockType.TREE)
        b = s.write(b"tree node", BlockType.DATA)
        c = s.write(b"catalog", BlockType.CATALOG)
        assert a != b  # the type is part of a block's identity
        assert s.read(a) == b"tree node" and s.read(b) == b"tree node"
        assert s.latest(BlockType.CATALOG) == c
        assert s.latest(BlockType.TREE) == a
        with pytest.raises(BadInput):
            s.write(b"")
        with pytest.raises(BadInput):
            s.write(bytes(BS + 1))
    with op(writable=False) as s:
        assert s.latest(BlockType.CATALOG) == c
        assert s.read(c) == b"catalog"


def test_dedup_across_sessions_after_index_flush(make_store, mode):
    op = make_store(mode)
    data = blocks(600, seed=2)
    with op() as s:
        refs = s.write_blocks(data)
        s.flush()
    with op() as s:
        assert s.index.h.entries == 600
        assert s.write_blocks(data[: 200 * BS]) == refs[: 200 * s.ref_size]
        assert s.counters["records"] == 600
        # sequential duplicates are found through loaded summaries, not per-block index reads
        assert s.disk.io["index"].reads < 20


def test_value_mode_collisions_cost_time_not_correctness(make_store, monkeypatch):
    from foundation import native
    op = make_store("value")
    real = native.weak_hashes

    def weak(buf, bs, btype, seed, skip=None):  # every block collides with every other
        h = real(buf, bs, btype, seed, skip)
        return bytes(8) * (len(h) // 8)

    monkeypatch.setattr(native, "weak_hashes", weak)
    data = blocks(50, seed=3, compressible=0)
    with op() as s:
        refs = s.write_blocks(data)
        assert len(set(refs[i:i + 8] for i in range(0, len(refs), 8))) == 50
        assert s.write_blocks(data) == refs
        assert b"".join(s.read_blocks(refs)) == data
        assert s.counters["records"] == 50


def test_missing_derived_structures_are_rebuilt(make_store, mode):
    op = make_store(mode)
    data = blocks(400, seed=4)
    with op() as s:
        refs = s.write_blocks(data)
    for name in ("index", "bloom", "bloom.json"):
        os.unlink(os.path.join(op.path, name))
    shutil.rmtree(os.path.join(op.path, "summaries"))
    os.mkdir(os.path.join(op.path, "summaries"))
    with op() as s:
        assert any("index" in r for r in s.repaired)
        assert b"".join(s.read_blocks(refs)) == data
        assert s.write_blocks(data) == refs
        assert s.counters["records"] == 400


def test_stale_bloom_is_rebuilt(make_store):
    op = make_store("hash")
    with op() as s:
        refs = s.write_blocks(blocks(100, seed=5))
    # A Bloom filter that claims more than the log holds cannot be trusted;
    # an empty one trusted as current would make every block look fresh.
    import pybloomfilter
    os.unlink(os.path.join(op.path, "bloom"))
    pybloomfilter.BloomFilter(1024, 0.001, os.path.join(op.path, "bloom")).close()
    with open(os.path.join(op.path, "bloom.json"), "w") as f:
        f.write('{"covered": %d}' % (1 << 62))
    with op() as s:
        assert "rebuilt the Bloom filter" in s.repaired
        assert s.write_blocks(blocks(100, seed=5)) == refs
        assert s.counters["records"] == 100


def test_flipped_bit_is_named_and_never_returned(make_store, mode):
    op = make_store(mode)
    data = blocks(200, seed=6, compressible=0)
    with op() as s:
        refs = s.write_blocks(data)
    first = arena_files(op.path)[0]
    with open(first, "r+b") as f:
        f.seek(72 + 64 + 100)  # inside the first record's payload
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 1]))
    with op(writable=False) as s:
        with pytest.raises(DataCorrupt, match=r"arena 0 offset 72"):
            s.read(refs[:s.ref_size])
        assert s.read(refs[s.ref_size:2 * s.ref_size]) == data[BS:2 * BS]
        damage, _ = verify(s)
        assert [(d.arena, d.offset) for d in damage] == [(0, 72)]


def test_dropped_and_reordered_arenas_are_detected(make_store):
    op = make_store("hash")
    with op() as s:
        s.write_blocks(blocks(400, seed=7, compressible=0))
    files = arena_files(op.path)
    assert len(files) >= 4
    # reorder: swap arenas 1 and 2
    os.rename(files[1], files[1] + ".x")
    os.rename(files[2], files[1])
    os.rename(files[1] + ".x", files[2])
    with op(writable=False) as s:
        damage, _ = verify(s)
        assert {d.arena for d in damage} >= {1, 2}
        assert "another log" in str(damage[0]) or "holds arena" in str(damage[0])
    os.rename(files[2], files[1] + ".x")
    os.rename(files[1], files[2])
    os.rename(files[1] + ".x", files[1])
    # truncate a sealed arena
    with open(files[1], "r+b") as f:
        f.truncate(os.path.getsize(files[1]) - 100)
    with op(writable=False) as s:
        damage, _ = verify(s)
        assert any(d.arena == 1 for d in damage)


def test_rolled_back_arena_is_detected(make_store, tmp_path):
    op = make_store("hash")
    with op() as s:
        s.write_blocks(blocks(40, seed=8, compressible=0))
    old = tmp_path / "old"
    shutil.copytree(op.path, old)
    with op() as s:
        s.write_blocks(blocks(400, seed=9, compressible=0))
    # put back the old, partly written copy of arena 0 ... sealed since
    a0 = arena_files(op.path)[0]
    shutil.copy(arena_files(str(old))[0], a0)
    with op(writable=False) as s:
        damage, _ = verify(s)
        assert any(d.arena == 0 for d in damage)


def test_wrong_and_missing_keys(make_store, tmp_path):
    op = make_store("hash", encrypt=True)
    with op() as s:
        s.write_blocks(blocks(10))
    with pytest.raises(KeyMissing, match="encrypted"):
        Store.open(op.path, key_file=None)
    other = make_store("hash", encrypt=True)
    with pytest.raises(WrongKey, match="belongs to store"):
        Store.open(op.path, key_file=other.key_file)
    # A key file for this store but with another key inside
    import json
    doc = json.load(open(op.key_file))
    doc["key"] = json.load(open(other.key_file))["key"]
    bad = tmp_path / "bad.key"
    bad.write_text(json.dumps(doc))
    with pytest.raises(WrongKey, match="wrong key"):
        Store.open(op.path, key_file=str(bad))


def wrapped_store(tmp_path):
    """(store path, key file) of a new store whose key file is wrapped by the passphrase "correct horse"."""
    p = tmp_path / "s"
    p.mkdir()
    kf = str(tmp_path / "k")
    Store.create(str(p), arena_size=256 << 10, max_log_size=16 << 20, key_file=kf, passphrase="correct horse")
    return p, kf


def test_passphrase_key_file(tmp_path):
    p, kf = wrapped_store(tmp_path)
    assert os.stat(kf).st_mode & 0o777 == 0o600
    assert "correct horse" not in open(kf).read()
    with Store.open(str(p), key_file=kf, passphrase="correct horse", writable=True) as s:
        ref = s.write(b"secret block")
    with pytest.raises(WrongKey, match="passphrase"):
        Store.open(str(p), key_file=kf, passphrase="wrong")
    with Store.open(str(p), key_file=kf, passphrase="correct horse") as s:
        assert s.read(ref) == b"secret block"
    # the plaintext never reaches the store disk
    for f in arena_files(str(p)):
        assert b"secret block" not in open(f, "rb").read()
    # The store never prompts: the passphrase comes as a string or from a callback the caller
    # gives (the CLI's prompt), asked only for a wrapped key file.
    asked = []
    with Store.open(str(p), key_file=kf, passphrase=lambda: asked.append(1) or "correct horse") as s:
        assert s.read(ref) == b"secret block" and asked == [1]
    with pytest.raises(KeyMissing, match="protected by a passphrase"):
        Store.open(str(p), key_file=kf)
    with pytest.raises(KeyMissing, match="protected by a passphrase"):
        Store.open(str(p), key_file=kf, passphrase=lambda: None)


def test_passphrase_from_the_cli_environment(tmp_path, monkeypatch):
    """foundation verify on a passphrase-wrapped key: FOUNDATION_PASSPHRASE, as before the prompt moved to the CLI."""
    from foundation.cli import main

    p, kf = wrapped_store(tmp_path)
    monkeypatch.setattr("sys.stdin.isatty", lambda: False)
    monkeypatch.delenv("FOUNDATION_PASSPHRASE", raising=False)
    assert main(["--store", str(p), "--key-file", kf, "verify"]) == KeyMissing.code
    monkeypatch.setenv("FOUNDATION_PASSPHRASE", "correct horse")
    assert main(["--store", str(p), "--key-file", kf, "verify"]) == 0
    monkeypatch.setenv("FOUNDATION_PASSPHRASE", "wrong")
    assert main(["--store", str(p), "--key-file", kf, "verify"]) == WrongKey.code


@pytest.mark.parametrize("how", ["short writes", "no space"])
def test_atomic_write_loops_and_leaves_nothing_on_failure(tmp_path, monkeypatch, how):
    from foundation.errors import StoreFull
    from foundation.store.disk import atomic_write

    path = str(tmp_path / "f")
    atomic_write(path, b"old")
    real = os.write
    calls = []

    def write(fd, data):
        calls.append(len(data))
        if how == "no space" and len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real(fd, bytes(data[:3]))    # the kernel may write less than asked

    monkeypatch.setattr(os, "write", write)
    if how == "short writes":
        atomic_write(path, b"0123456789")
        assert open(path, "rb").read() == b"0123456789" and len(calls) == 4
    else:
        with pytest.raises(StoreFull):
            atomic_write(path, b"0123456789")
        with pytest.raises(OSError, match="No space"):
            calls.clear()
            atomic_write(path, b"0123456789", full=None)
        assert open(path, "rb").read() == b"old"
    assert os.listdir(tmp_path) == ["f"]


def test_one_lock_helper_for_every_lock(tmp_path):
    """The store's writer lock, the readers' lock and a VM's lock are one flock helper: the second
    holder is refused with the first one's pid, and a closed fd lets go."""
    import fcntl

    from foundation.store.disk import flock
    from foundation.vm.journal import Lock, VMBusy

    path = str(tmp_path / "lock")
    fd = flock(path, fcntl.LOCK_EX, lambda pid: StoreLocked(path, pid), write_pid=True)
    with pytest.raises(StoreLocked, match=str(os.getpid())):
        flock(path, fcntl.LOCK_EX, lambda pid: StoreLocked(path, pid), write_pid=True)
    os.close(fd)
    fd = flock(path, fcntl.LOCK_SH, lambda _: AssertionError("shared locks share"))
    shared = flock(path, fcntl.LOCK_SH, lambda _: AssertionError("shared locks share"))
    os.close(fd)
    os.close(shared)
    with Lock(str(tmp_path), "u1", "vm1"):
        assert open(tmp_path / "vm" / "u1.lock").read() == f"{os.getpid()}\n"
        with pytest.raises(VMBusy, match="vm1"):
            with Lock(str(tmp_path), "u1", "vm1"):
                pass
    with Lock(str(tmp_path), "u1", "vm1"):
        pass


def test_bad_directories(tmp_path):
    with pytest.raises(StoreMissing):
        Store.create(str(tmp_path / "nope"))
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(StoreNotEmpty):
        Store.create(str(tmp_path / "full"), encrypt=False)
    with pytest.raises(StoreMissing, match="not mounted"):
        Store.open(str(tmp_path / "full"))
    with pytest.raises(StoreMissing):
        Store.open(str(tmp_path / "nope"))


def test_second_writer_is_refused(make_store):
    op = make_store("hash")
    with op() as s:
        with pytest.raises(StoreLocked, match=str(os.getpid())):
            op()
        with op(writable=False) as r:  # readers are welcome
            assert r.mode == "hash"


def test_venti_policy_round_trip(make_store, mode):
    op = make_store(mode)
    data = blocks(300, seed=10)
    with op(tuning=Tuning(policy="venti")) as s:
        refs = s.write_blocks(data)
        assert s.bloom is None
        assert s.write_blocks(data) == refs
    with op(tuning=Tuning(policy="venti")) as s:
        assert b"".join(s.read_blocks(refs)) == data
        assert s.counters["records"] == 300


def test_reader_sees_new_commits(make_store, mode):
    op = make_store(mode)
    with op() as w:
        r1 = w.write_blocks(blocks(10, seed=11))
        w.sync()
        with op(writable=False) as r:
            assert b"".join(r.read_blocks(r1)) == blocks(10, seed=11)
            r2 = w.write_blocks(blocks(300, seed=12))
            w.sync()
            assert r.refresh()
            assert b"".join(r.read_blocks(r2)) == blocks(300, seed=12)


def test_failed_flush_keeps_the_write_buffer(make_store, mode, monkeypatch):
    """A flush lets the write buffer's table go while it writes the index; one that fails gives
    every entry back, so the session still deduplicates against them and a later flush merges them."""
    op = make_store(mode)
    data = blocks(40, seed=14)
    with op() as s:
        refs = s.write_blocks(data)
        before = sorted(s.wbuf.entries()[i:i + s.keylen + 8]
                        for i in range(0, len(s.wbuf) * (s.keylen + 8), s.keylen + 8))
        real = s.index.flush

        def fail(entries, covered):
            raise OSError(5, "injected")
        monkeypatch.setattr(s.index, "flush", fail)
        with pytest.raises(OSError):
            s.flush()
        after = s.wbuf.entries()
        assert sorted(after[i:i + s.keylen + 8] for i in range(0, len(after), s.keylen + 8)) == before
        assert s.write_blocks(data) == refs and s.counters["records"] == 40
        monkeypatch.setattr(s.index, "flush", real)
        s.flush()
        assert len(s.wbuf) == 0 and s.index.h.entries == len(before)
    with op(writable=False) as r:
        assert b"".join(r.read_blocks(refs)) == data


def test_small_write_buffer_survives_close_without_a_flush(make_store, mode):
    op = make_store(mode)
    with op() as s:
        refs = s.write_blocks(blocks(30, seed=13))
    with op() as s:
        assert s.index.h.entries == 0  # too few entries to be worth an index pass
        assert len(s.wbuf) == 31  # found again from the log at open, with the commit record
        assert s.write_blocks(blocks(30, seed=13)) == refs
        assert s.counters["records"] == 30
    with op(writable=False) as s:
        assert b"".join(s.read_blocks(refs)) == blocks(30, seed=13)


def test_verify_marks_damage_and_archiving_heals_it(make_store, mode):
    op = make_store(mode)
    data = blocks(300, seed=14, compressible=0)
    with op() as s:
        refs = s.write_blocks(data)
    first = arena_files(op.path)[0]  # sealed
    with open(first, "r+b") as f:
        f.seek(72 + 64 + 100)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0x40]))
    rs = len(refs) // 300
    with op(writable=False) as s:
        assert [(d.arena, d.offset) for d in verify(s)[0]] == [(0, 72)]
    with op() as s:
        again = s.write_blocks(data)  # the damaged block is written again, not deduplicated
        assert s.counters["records"] == 301
        if mode == "hash":
            assert again == refs  # same name, now readable again
        else:
            assert again[rs:] == refs[rs:] and again[:rs] != refs[:rs]
    with op(writable=False) as s:
        assert b"".join(s.read_blocks(again)) == data
        if mode == "value":  # the old address still names the damaged record
            with pytest.raises(DataCorrupt, match="arena 0 offset 72"):
                s.read(refs[:rs])


def test_a_marked_damaged_block_still_fails_loudly(make_store):
    op = make_store("hash")
    data = blocks(300, seed=15, compressible=0)
    with op() as s:
        refs = s.write_blocks(data)
    damage(arena_files(op.path)[0], FIRST_PAYLOAD + 100, b"\x00\x11\x22")
    with op(writable=False) as s:
        verify(s)
    with op(writable=False) as s:
        with pytest.raises(DataCorrupt, match="arena 0 offset 72: the only copy"):
            s.read(refs[:32])
        assert b"".join(s.read_blocks(refs[32:])) == data[BS:]


def test_a_lost_summary_is_rebuilt_around_a_damaged_record(make_store, mode):
    """`rebuild` (or a summary lost in a crash) over an arena with a damaged record: the store opens,
    every other block reads, the damaged one fails loudly."""
    op = make_store(mode)
    data = blocks(300, seed=16, compressible=0)
    with op() as s:
        refs = s.write_blocks(data)
    rs = len(refs) // 300
    damage(arena_files(op.path)[0], FIRST_PAYLOAD + 100, b"\x00\x11\x22")
    shutil.rmtree(os.path.join(op.path, "summaries"))
    os.mkdir(os.path.join(op.path, "summaries"))
    os.unlink(os.path.join(op.path, "index"))
    with op() as s:                             # a writer rebuilds summaries and index
        with pytest.raises(DataCorrupt, match="arena 0 offset 72"):
            s.read(refs[:rs])
    with op(writable=False) as s:
        assert [(d.arena, d.offset) for d in verify(s)[0]] == [(0, 72)]   # and records it
    with op(writable=False) as s:
        with pytest.raises(DataCorrupt, match="arena 0 offset 72"):
            s.read(refs[:rs])
        assert b"".join(s.read_blocks(refs[rs:])) == data[BS:]


def test_pipelined_writes_name_and_store_what_plain_writes_do(make_store, monkeypatch):
    """Appends in a thread and writes behind them give the same refs, blocks and verify clean;
    a write that fails there fails the scope and every later sync, so nothing past it is committed."""
    import errno

    from foundation.errors import StoreDiskFailed
    op = make_store("hash", encrypt=True)
    batches = [blocks(200, seed=s) + blocks(20, seed=1) for s in (1, 2, 3)] + [bytes(BS * 4) + blocks(50, seed=2)]
    with op() as s:
        plain = [s.write_blocks(b) for b in batches[:1]]
    with op() as s:
        with s.pipelined():
            refs = [s.write_blocks(b) for b in batches]
        assert refs[0] == plain[0] and s.counters["records"] == 600
        assert [b"".join(s.read_blocks(r)) for r in refs] == batches
        s.sync()
        assert s.log.open.n >= 2 and verify(s) == ([], 600)
        committed = s.commit()
        real = os.pwrite
        monkeypatch.setattr(os, "pwrite", lambda *a: (_ for _ in ()).throw(OSError(errno.EIO, "EIO")))
        with pytest.raises(StoreDiskFailed):
            with s.pipelined():
                for seed in (7, 8, 9):
                    s.write_blocks(blocks(100, seed=seed))
        monkeypatch.setattr(os, "pwrite", real)
        with pytest.raises(StoreDiskFailed):
            s.sync()
        assert s.commit() == committed
        s.close(clean=False)  # as a process that fails leaves it
    with op() as s:
        assert s.commit() == committed
        assert [b"".join(s.read_blocks(r)) for r in refs] == batches


@pytest.mark.parametrize("direct", [True, False])
def test_pipelined_arena_writes_around_the_page_cache(make_store, monkeypatch, direct):
    """Inside pipelined(), arena writes go out in whole pages (O_DIRECT) with the partial page
    carried in memory; a read, a sync (a flush of the write buffer mid-scope), a seal and a
    reopen each see every byte appended, and the files end exactly where the records do. Where
    the file system refuses O_DIRECT, the same writes go through the page cache."""
    from foundation.store import format as F
    if not direct:
        real_open = os.open
        monkeypatch.setattr(os, "open", lambda path, flags, *a: (_ for _ in ()).throw(
            OSError(22, "Invalid argument")) if flags & os.O_DIRECT else real_open(path, flags, *a))
    op = make_store("hash", encrypt=True, arena_size=256 << 10)
    batches = [blocks(90, seed=s) for s in range(1, 7)]
    with op() as s:
        s.write_blocks(blocks(3, seed=99))  # the open arena holds records before the scope
        s.sync()
        with s.pipelined():
            refs = [s.write_blocks(batches[0]), s.write_blocks(batches[1])]
            s.settle()
            assert b"".join(s.read_blocks(refs[1])) == batches[1]  # read mid-scope: the carry is in the file
            assert s.log.direct_ok is direct and (s.log.direct is not None) is direct
            s.flush()  # a sync mid-scope: its commit record is written before the fsync
            refs += [s.write_blocks(b) for b in batches[2:]]
        assert s.log.open.n >= 3 and s.log.direct is None
        end = s.log.open.end
        assert [b"".join(s.read_blocks(r)) for r in refs] == batches
        s.sync()
    sizes = [os.path.getsize(f) for f in arena_files(op.path)]
    assert sizes[-1] >= end  # the open arena's file holds every record (and the commit)
    with op() as s:
        assert verify(s) == ([], 3 + 90 * 6)
        assert [b"".join(s.read_blocks(r)) for r in refs] == batches
    for size in sizes[:-1]:  # sealed arenas end with their trailer, nothing past it
        assert size <= 256 << 10 and size > (256 << 10) - F.TRAILER_SIZE - 5000


@pytest.mark.parametrize("background", [True, False])
def test_sealed_arenas_synced_in_the_background(make_store, monkeypatch, background):
    """Inside pipelined(), each sealed arena is fsynced by the syncer after its last write, so the
    sync that commits fsyncs only the open arena; every arena is fsynced before the head names it
    either way, and a background fsync that fails fails that sync and every later one."""
    import errno

    from foundation.errors import StoreDiskFailed
    from foundation.store import arena, disk
    monkeypatch.setattr(arena, "SYNC_SEALED", background)
    synced, heads = [], []
    real_fsync = disk.Disk.fsync

    def fsync(self, fd, what="sync"):
        synced.append((os.readlink(f"/proc/self/fd/{fd}"), threading.current_thread().name))
        return real_fsync(self, fd, what)
    monkeypatch.setattr(disk.Disk, "fsync", fsync)
    op = make_store("hash", encrypt=True, arena_size=256 << 10)
    batches = [blocks(90, seed=s) for s in range(1, 7)]
    with op() as s:
        real_head = s.log.write_head
        monkeypatch.setattr(s.log, "write_head", lambda *a, **k: (heads.append(list(synced)), real_head(*a, **k)))
        with s.pipelined():
            refs = [s.write_blocks(b) for b in batches]
        sealed = s.log.open.n
        assert sealed >= 2
        s.sync()
        files = arena_files(op.path)
        before = {p for p, _ in heads[-1]}
        assert set(files) <= before  # every arena durable before the head that names it
        by_sync = [p for p, th in heads[-1] if not th.startswith("arena-sync")]
        if background:
            assert sum(p in files[:sealed] for p in by_sync) == 0  # the sealed ones: the syncer's
            assert sum(th.startswith("arena-sync") for _, th in heads[-1]) == sealed
        else:
            assert set(files[:sealed]) <= set(by_sync)
        assert [b"".join(s.read_blocks(r)) for r in refs] == batches
        if background:
            def failing(self, fd, what="sync"):
                raise self._error(OSError(errno.EIO, "EIO"), what)
            monkeypatch.setattr(disk.Disk, "fsync", failing)
            with pytest.raises(StoreDiskFailed):
                with s.pipelined():
                    for seed in (7, 8, 9, 10, 11):
                        s.write_blocks(blocks(100, seed=seed))
            with pytest.raises(StoreDiskFailed):
                s.sync()
            monkeypatch.setattr(disk.Disk, "fsync", real_fsync)
            with pytest.raises(StoreDiskFailed):
                s.sync()  # still: an fsync that failed once may pass the next time without the data
            s.close(clean=False)
    with op() as s:
        assert [b"".join(s.read_blocks(r)) for r in refs] == batches
        assert verify(s)[0] == []


def test_log_scan_names_every_record_with_its_tag_and_key(make_store, mode):
    """Log.scan's batch form gives native.scan's records with each one's header tag, and the open
    arena loaded from it holds the same tags, keys, addresses and types."""
    from foundation import native
    from foundation.store import format as F, layout as L
    op = make_store(mode)
    with op() as s:
        s.write_blocks(blocks(60, seed=9))
    buf = open(arena_files(op.path)[0], "rb").read()
    with op(writable=False) as s:
        lg, base = s.log, F.ARENA_HEADER_SIZE
        iv = lg.header(0, buf)[0].iv
        ents, end, err = lg.scan(0, iv, memoryview(buf)[base:], base)
        raw, raw_end, _ = native.scan(lg.codec, 0, iv, buf[base:], base)
        assert len(ents) > 60 and (end, err) == (raw_end, None) == (len(buf), None)
        assert [e[:5] for e in ents] == [(o, t, k[:s.keylen], S, R) for o, t, k, S, R in raw]
        assert [e[5] for e in ents] == [L.tag(buf, e[0]) for e in ents]
        oa = lg.open
        assert oa.n == 0 and bytes(oa.tags) == b"".join(e[5] for e in ents)
        assert bytes(oa.keys) == b"".join(e[2] for e in ents) and bytes(oa.types) == bytes(e[1] for e in ents)
        assert oa.addrs == [F.addr(0, e[0]) for e in ents]


def test_subkeys_are_hkdf_sha256():
    """The store's subkeys come from the standard library's HMAC (no cryptography import at open):
    byte for byte cryptography's HKDF-SHA256, as every store made before derived them."""
    import uuid

    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    from foundation.crypto.keys import Keys

    master, su = os.urandom(32), str(uuid.uuid4())
    k = Keys.derive(master, su)

    def sub(info):
        return HKDF(hashes.SHA256(), 32, uuid.UUID(su).bytes, b"foundation " + info).derive(master)

    assert (k.enc, k.mac, k.score) == (sub(b"enc"), sub(b"mac"), sub(b"score"))
    assert k.weak_seed == int.from_bytes(sub(b"weak")[:8], "big")


def test_uuid_bytes_reads_what_uuid_reads():
    """The salt of the subkeys is the store uuid's 16 bytes, read without the uuid module: the same
    bytes for each form uuid.UUID reads, and the same refusal of a malformed one."""
    import uuid

    from foundation.crypto.keys import uuid_bytes

    for _ in range(200):
        u = uuid.uuid4()
        for text in (str(u), u.hex, u.hex.upper(), "{%s}" % u, u.urn):
            assert uuid_bytes(text) == uuid.UUID(text).bytes
    for bad in ("", "0" * 31, "0" * 33, "g" * 32, str(uuid.uuid4())[:-1] + "x"):
        with pytest.raises(ValueError):
            uuid.UUID(bad)
        with pytest.raises(ValueError):
            uuid_bytes(bad)


def test_log_bytes_since_a_mark(make_store):
    """log_bytes_since counts the growth of the log from the arena open at the mark on (no stat of
    older arenas): the same figure as two log_bytes totals, across arenas sealed in between."""
    op = make_store("hash")
    with op() as s:
        s.write_blocks(blocks(100, seed=3))
        s.sync()
        before, mark = s.log_bytes(), s.log_mark()
        s.write_blocks(blocks(300, seed=4))  # several 256 KiB arenas
        s.sync()
        assert s.log.open.n > mark[0]
        assert s.log_bytes_since(mark) == s.log_bytes() - before > 300 * BS // 2
        mark = s.log_mark()
        assert s.log_bytes_since(mark) == 0


def test_pipelined_batch_repeating_the_one_in_flight_stores_each_block_once(make_store):
    """A batch is decided while the one before is still being appended: a block of that one met
    again is a duplicate all the same (the filter holds it already, the tables are asked again once
    it is settled), and so is one of the batch settled before it."""
    op = make_store("hash", encrypt=True)
    a, b = blocks(120, seed=21), blocks(80, seed=22)
    batches = [a, a[:40 * BS] + b, b + a[40 * BS:60 * BS]]
    with op() as s:
        with s.pipelined():
            refs = [s.write_blocks(x) for x in batches]
        assert s.counters["records"] == 200 and s.counters["dup_blocks"] == 40 + 100
        assert [b"".join(s.read_blocks(r)) for r in refs] == batches
        s.sync()
        assert verify(s) == ([], 200)
    with op() as s:  # and the index cache the append left behind names them all
        assert s.write_blocks(batches[1] + batches[2]) == refs[1] + refs[2]
        assert s.counters["records"] == 200


def test_older_duplicates_decided_beside_the_append_in_flight(make_store, monkeypatch):
    """Inside pipelined(), a batch's duplicates of data the index holds are found while the batch
    before is still appended: their arenas' trailers are read aside (own descriptors, the write
    queue left alone), every duplicate is found, and what is stored reads back and verifies."""
    from foundation.store.arena import Log
    op = make_store("hash", encrypt=True)
    old = blocks(600, seed=31)
    with op() as s:
        s.write_blocks(old)
        s.flush()  # the index holds them: later duplicates are found through it and the summaries
    asides = []
    real = Log.trailer

    def trailer(self, n, aside=False):
        asides.append(aside)
        return real(self, n, aside)
    monkeypatch.setattr(Log, "trailer", trailer)
    batches = [blocks(100, seed=40 + i) + old[i * 150 * BS:(i + 1) * 150 * BS] for i in range(4)]
    with op() as s:
        before = dict(s.counters)
        with s.pipelined():
            refs = [s.write_blocks(x) for x in batches]
        assert s.counters["records"] - before["records"] == 400
        assert s.counters["dup_blocks"] - before["dup_blocks"] == 600
        assert True in asides  # (the first batch has no append before it: read the plain way)
        assert [b"".join(s.read_blocks(r)) for r in refs] == batches
        s.sync()
        assert verify(s) == ([], 1000)


def test_write_blocks_hashed_beforehand(make_store):
    """write_blocks(hashed=hash_blocks(buf)) names and stores what write_blocks(buf) does (zero
    blocks too); hashes of other blocks are refused."""
    op = make_store("hash", encrypt=True)
    data = blocks(30, seed=51) + bytes(BS * 3) + blocks(5, seed=52)
    with op() as s:
        plain = s.write_blocks(data)
    with op() as s:
        h = s.hash_blocks(data)
        assert s.write_blocks(data, hashed=h) == plain
        with pytest.raises(BadInput):
            s.write_blocks(data[:BS * 10], hashed=h)
        with pytest.raises(BadInput):
            s.write_blocks(data, btype=BlockType.TREE, hashed=h)
        assert b"".join(s.read_blocks(plain)) == data


def test_scattered_reads_over_many_arenas_are_asked_for_in_groups(make_store, monkeypatch):
    """read_many asks the kernel for scattered records together (posix_fadvise WILLNEED) in groups
    of at most MAX_FDS // 2 arenas, so a read over more arenas than that (a newest day's tree
    nodes over a year of arenas) is not one latency after another; every block reads back exact."""
    from foundation.store import arena as arena_mod
    from foundation.store.format import arena_name

    opener = make_store(mode="hash")
    rng = random.Random(7)
    with opener() as s:
        data = [rng.randbytes(BS) for _ in range(40 * 70)]  # ~60 records fill a 256 KiB arena
        joined = s.write_blocks(b"".join(data))
        refs = [joined[i * s.ref_size:(i + 1) * s.ref_size] for i in range(len(data))]
        s.sync()
        s.flush()
    pick = list(range(0, len(data), 70))[:40]  # one block an arena, about
    asked = []
    monkeypatch.setattr(arena_mod.os, "posix_fadvise",
                        lambda fd, off, n, adv: asked.append((os.readlink(f"/proc/self/fd/{fd}"), off, n)))
    with opener(writable=False) as s:
        got = s.read_blocks(b"".join(refs[i] for i in pick), cache=False)
        where = [divmod(s.address(refs[i]), 1 << 32) for i in pick]  # (arena, offset) of each record
    assert got == [data[i] for i in pick]
    assert len({n for n, _ in where}) > arena_mod.MAX_FDS // 2  # more than one group's worth
    # every record's own bytes asked for ahead of its read (not only its arena's trailer or header)
    assert all(any(p.endswith(os.sep + arena_name(n)) and o <= off < o + k for p, o, k in asked)
               for n, off in where)
    cuts = arena_mod._ahead_groups([(n, 0, 1, 0, 0) for n in range(40)] + [(3, 0, arena_mod.AHEAD_BYTES, 0, 0)])
    assert cuts == {0: 32, 32: 40, 40: 41}


def test_summaries_directory_made_again_but_never_the_stores(make_store):
    """Summaries are derived: a deleted summaries directory is made again when the next arena is
    sealed. A store whose own directory went (a disk unmounted beneath it) is not made again on
    the mount point's file system: the seal fails instead."""
    op = make_store("hash")
    with op() as s:
        shutil.rmtree(os.path.join(op.path, "summaries"))
        refs = s.write_blocks(blocks(200, seed=9))  # several 256 KiB arenas sealed
        assert os.listdir(os.path.join(op.path, "summaries"))
    with op() as s:
        assert b"".join(s.read_blocks(refs)) == blocks(200, seed=9)
    gone = make_store("hash")
    s = gone()
    moved = gone.path + ".moved"
    os.rename(gone.path, moved)
    try:
        with pytest.raises(Exception):
            s.write_blocks(blocks(200, seed=10))
            s.sync()
        assert not os.path.exists(gone.path)
    finally:
        os.rename(moved, gone.path)
        try:
            s.close()
        except Exception:
            pass  # what the failed seal left is the crash tests' business
