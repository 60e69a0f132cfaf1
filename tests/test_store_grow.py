"""Index and Bloom filter grow with the store: small when new, larger past their thresholds, every
block still found; stores with an index made at its maximum size open as before; a crash while
growing costs nothing (both are derived)."""

import os
import subprocess
import sys
import textwrap

import pybloomfilter
import pytest

from foundation.store import Store, Tuning
from foundation.store import bloom as bloom_mod
from foundation.store import format as F
from foundation.store import primary
from foundation.store.index import GROW_LOAD, Index, plan
from foundation.store.rebuild import rebuild
from foundation.store.verify import verify
from tests.conftest import BS, blocks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N = 4000


@pytest.fixture
def small(monkeypatch):
    """Start index and filter at 256 entries, so that a few thousand blocks grow both several times."""
    monkeypatch.setattr(bloom_mod, "INITIAL", 256)
    monkeypatch.setattr("foundation.store.index.INITIAL", 256)


def test_a_new_store_has_a_small_index_and_filter(tmp_path):
    Store.create(str(tmp_path), encrypt=False)          # default max_log_size: 256 GiB
    assert os.path.getsize(tmp_path / F.INDEX) <= 2 << 20
    assert os.path.getsize(tmp_path / F.BLOOM) <= 128 << 10
    with Store.open(str(tmp_path), writable=True) as s:
        assert s.bloom.capacity == 32768 and s.bloom.error_rate == bloom_mod.ERROR


def _mapped_kb(path):
    """kB of this process's memory in maps of the file at path (each map's pages counted apart)."""
    path, kb, inside = os.path.realpath(path), 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if len(head) >= 5 and "-" in head[0] and ":" in head[3]:
                inside = head[-1] == path
            elif inside and head[0] == "Rss:":
                kb += int(head[1])
    return kb


def test_the_filter_is_held_in_memory_once(make_store):
    """Its tests and its adds go through one map of its file: the process holds each of its pages
    once, where a test through the filter's own map held the whole file a second time."""
    op = make_store("hash")
    data = blocks(3000, seed=8)
    with op() as s:
        s.write_blocks(data)
        s.flush()
    with op() as s:
        refs = s.write_blocks(data + blocks(3000, seed=9))  # every key tested, the fresh ones added
        assert s.bloom.maybe(refs, 32) == b"\1" * 6000
        size = os.path.getsize(os.path.join(op.path, F.BLOOM))
        held = _mapped_kb(os.path.join(op.path, F.BLOOM))
        assert size // 1024 * 3 // 4 < held <= size // 1024 + 8


def test_index_and_filter_grow_and_find_every_block(make_store, mode, small):
    op = make_store(mode, max_log_size=1 << 20)        # the index starts at 19 buckets
    data = blocks(N, seed=5)
    with op() as s:
        first = (s.index.h.nbuckets, s.bloom.capacity)
        refs = s.write_blocks(data)
        s.flush()
        assert s.index.h.nbuckets > first[0] and s.bloom.capacity > first[1]
        assert s.index.h.entries <= GROW_LOAD * s.index.slots()
        assert s.bloom.count <= s.bloom.capacity
        assert os.path.getsize(os.path.join(op.path, F.INDEX)) < 2 << 20
    with op() as s:                                    # cold caches: found through Bloom filter and index
        assert b"".join(s.read_blocks(refs)) == data
        assert s.write_blocks(data) == refs
        assert s.counters["records"] == N
        damage, checked = verify(s)
        assert damage == [] and checked == N
    with op(writable=False) as s:
        assert b"".join(s.read_blocks(refs)) == data


def test_every_entry_survives_a_grow(make_store, small):
    op = make_store("hash", max_log_size=1 << 20)
    with op(tuning=Tuning(write_buffer_bytes=1 << 30)) as s:
        refs = s.write_blocks(blocks(N, seed=6))
        before = s.index.h.nbuckets
        s.flush()                                      # one flush of 4000 entries into 19 buckets: a grow
        assert s.index.h.nbuckets >= plan(2 * N, 32)[0] > before
        for i in range(0, N, 97):
            assert s.index.lookup(refs[i * 32:(i + 1) * 32]), i


def test_pipelined_writes_grow_the_filter_and_store_each_block_once(make_store, small):
    """The Bloom filter takes each batch's keys while its append is in flight and grows between
    them: a block repeated inside a batch, a block of an earlier batch and one of a flushed
    earlier session are each stored once, and every key is in the filter."""
    op = make_store("hash", max_log_size=1 << 20)
    old = blocks(300, seed=11)
    with op() as s:
        s.write_blocks(old)
        s.flush()
    batches = [blocks(700, seed=20 + i) for i in range(6)]
    batches[2] = batches[2][:BS * 100] + batches[2][:BS * 100] + batches[2][BS * 200:]  # a repeat inside
    batches[4] = batches[1][:BS * 350] + batches[4][BS * 350:]                        # an earlier batch
    batches[5] = old + batches[5][BS * 300:]                                          # an earlier session
    distinct = {b[i:i + BS] for b in batches for i in range(0, len(b), BS)}
    distinct -= {old[i:i + BS] for i in range(0, len(old), BS)}
    with op() as s:
        cap, before = s.bloom.capacity, s.counters["records"]   # the counters are the store's, kept
        with s.pipelined():
            refs = [s.write_blocks(b) for b in batches]
        assert s.bloom.capacity > cap and s.counters["records"] - before == len(distinct)
        assert all(r[i:i + 32] in s.bloom for r in refs for i in range(0, len(r), 32))
        assert [b"".join(s.read_blocks(r)) for r in refs] == batches
    with op() as s:
        before = s.counters["records"]
        assert s.write_blocks(b"".join(batches)) == b"".join(refs) and s.counters["records"] == before
        assert verify(s)[0] == []


def test_a_reader_follows_the_index_a_writer_grew(make_store, small):
    op = make_store("hash", max_log_size=1 << 20)
    with op() as w:
        first = w.write_blocks(blocks(50, seed=3))
        w.flush()
        with op(writable=False) as r:
            ino = os.fstat(r.index.fd).st_ino
            refs = w.write_blocks(blocks(N, seed=4))
            w.flush()                                  # grown: a new file renamed over the one r holds
            assert w.index.h.nbuckets > 19
            assert r.refresh()
            assert os.fstat(r.index.fd).st_ino != ino
            assert r.index.h.nbuckets == w.index.h.nbuckets and len(r.wbuf) < 10
            assert b"".join(r.read_blocks(first + refs)) == blocks(50, seed=3) + blocks(N, seed=4)


def old_store(op, keylen):
    """Give op's store what a Foundation before growing made: an index for max_log_size (256 GiB
    here) and a Bloom filter of that capacity."""
    with op() as s:
        h = s.index.h
        cap = primary.capacity(256 << 30, s.block_size)
        home, nfile = plan(cap, keylen)
        path = os.path.join(op.path, F.INDEX)
        idx = Index.create(path, s.disk, keylen, home, nfile, h.uuid)
        idx.flush(b"", 0)
        idx.install(path)
        idx.close()
        os.unlink(os.path.join(op.path, F.BLOOM))
        pybloomfilter.BloomFilter(cap, bloom_mod.ERROR, os.path.join(op.path, F.BLOOM)).close()
        with open(os.path.join(op.path, F.BLOOM_STATE), "w") as f:
            f.write('{"covered": 0}')
        s.index.close()
        s.index = None                                 # close without a flush into the file just replaced
        s.bloom.close()
        s.bloom = None
    return nfile


def test_a_store_with_an_index_at_its_maximum_size_still_opens(make_store, mode):
    op = make_store(mode)
    keylen = 32 if mode == "hash" else 8
    data = blocks(400, seed=7)
    with op() as s:
        refs = s.write_blocks(data)
    nfile = old_store(op, keylen)
    assert os.path.getsize(os.path.join(op.path, F.INDEX)) > 1 << 30
    with op() as s:                                    # index covers nothing: everything comes from the summaries
        assert s.index.h.nfile == nfile and s.bloom.capacity == 1 << 26
        assert b"".join(s.read_blocks(refs)) == data
        more = s.write_blocks(blocks(400, seed=8))
        s.flush()
        assert s.index.h.nfile == nfile                # far below its load: it is not grown
    with op() as s:
        assert s.write_blocks(data + blocks(400, seed=8)) == refs + more
        assert s.counters["records"] == 800
        rebuild(s)                                     # a rebuild (or gc) sizes both for the records
        assert s.index.h.nfile < 1000 and s.bloom.capacity == 32768
    assert os.path.getsize(os.path.join(op.path, F.INDEX)) < 4 << 20
    with op(writable=False) as s:
        assert b"".join(s.read_blocks(refs + more)) == data + blocks(400, seed=8)


GROWER = textwrap.dedent("""
    import sys
    sys.path.insert(0, {root!r})
    from foundation.store import Store, Tuning
    from foundation.store import bloom
    import foundation.store.index as index
    from tests.conftest import BS, blocks
    bloom.INITIAL = index.INITIAL = 256
    s = Store.open(sys.argv[1], writable=True, tuning=Tuning(write_buffer_bytes=1 << 30))
    n = int(sys.argv[2])
    refs = s.write_blocks(blocks(n, seed=9))      # the filter grows a first time
    s.sync()
    open(sys.argv[3], "w").write(refs.hex())
    s.write_blocks(blocks(2 * n, seed=10))        # and a second time
    s.flush()                                     # the index grows
    print("not reached")
""")


@pytest.mark.parametrize("point", ["index.grow", "bloom.grow:2"])
def test_a_crash_while_growing_leaves_a_store_that_opens(make_store, tmp_path, point, small):
    op = make_store("hash", max_log_size=1 << 20)
    script, out = tmp_path / "grow.py", tmp_path / "refs"
    script.write_text(GROWER.format(root=ROOT))
    p = subprocess.run([sys.executable, str(script), op.path, str(N), str(out)], capture_output=True,
                       env=dict(os.environ, FOUNDATION_INDEX_CRASH=point), cwd=ROOT)
    assert p.returncode == 137, p.stderr.decode()
    assert f"test crash at {point.split(':')[0]}".encode() in p.stderr
    refs = bytes.fromhex(out.read_text())
    with op() as s:
        assert b"".join(s.read_blocks(refs)) == blocks(N, seed=9)
        records = s.counters["records"]
        assert s.write_blocks(blocks(N, seed=9)) == refs  # every block known: nothing stored twice
        assert s.counters["records"] == records
        s.flush()
        damage, checked = verify(s)
        assert damage == [] and checked >= N
    with op(writable=False) as s:
        assert b"".join(s.read_blocks(refs)) == blocks(N, seed=9)


def test_a_close_flushes_the_write_buffer_once_it_is_a_share_of_the_index(make_store):
    """A flush rewrites the whole index: a close leaves a buffer of more than `flush_arenas` arenas
    but less than `flush_share` of the index's entries to the next open (which reads it back from
    the summaries), and flushes one that reaches it."""
    op = make_store("hash")                            # arenas of 256 KiB
    big = Tuning(write_buffer_bytes=16 << 20, index_cache_bytes=1 << 20, block_cache_bytes=1 << 20)
    assert (big.flush_arenas, big.flush_share) == (4, 0.125)
    base, few, more = (blocks(n, seed=n, compressible=0) for n in (2400, 270, 60))
    with op(tuning=big) as s:
        refs = [s.write_blocks(base)]
        n0 = s.counters["records"]
    with op(tuning=big) as s:                          # the first close flushed (past 4 arenas)
        assert s.index.h.entries == n0 and len(s.wbuf) == 0
        covered = s.index.h.covered
        refs.append(s.write_blocks(few))
        n1 = s.counters["records"] - n0
        assert s.log.open.n - F.split(covered)[0] > big.flush_arenas
    assert 0 < n1 + 2 < n0 * big.flush_share
    with op(tuning=big) as s:                          # left in the buffer, read back at open
        assert s.index.h.covered == covered and s.index.h.entries == n0
        assert n1 <= len(s.wbuf) <= n1 + 2             # (and the log's commit records)
        assert s.write_blocks(few) == refs[1]          # found: stored once
        refs.append(s.write_blocks(more))
        n2 = s.counters["records"] - n0 - n1
    assert n1 + n2 >= n0 * big.flush_share
    with op(tuning=big) as s:                          # flushed at that close
        assert len(s.wbuf) == 0 and s.index.h.covered == s.log.end_addr > covered
        assert n0 + n1 + n2 <= s.index.h.entries <= n0 + n1 + n2 + 3
        assert b"".join(s.read_blocks(b"".join(refs))) == base + few + more
        damage, checked = verify(s)
        assert damage == [] and checked == n0 + n1 + n2
