"""Image trees in a real store: many days of random changes, both modes, every size edge."""

import os
import shutil
import tempfile

import pytest
from test_image_support import BS, MemStore, content, make_store, mutate, open_store, seeded

from foundation.errors import BadInput, DataCorrupt
from foundation.image import (BadRanges, BytesSource, ImageReader, Root, Shape, read_blob,
                              restore_image, write_blob, write_image)
from foundation.image import tree as tree_mod
from foundation.store import BlockType

MODES = ["hash", "value"]


@pytest.fixture(params=MODES)
def store(request, tmp_path):
    path = make_store(tmp_path / "store", mode=request.param)
    with open_store(path) as s:
        yield s


class Recording(BytesSource):
    """A source that remembers which byte ranges were read."""

    def __init__(self, data):
        super().__init__(data)
        self.reads = []

    def read(self, offset, length):
        self.reads.append((offset, length))
        return super().read(offset, length)

    def readinto(self, offset, view):
        self.reads.append((offset, len(view)))
        return super().readinto(offset, view)


def full(store, img):
    return write_image(store, BytesSource(bytes(img)), len(img))


def readback(store, root):
    return ImageReader(store, root).read(0, root.size)


def test_days_of_changes_round_trip_and_match_full_read(store):
    rng = seeded(11)
    img = bytearray(content(rng, 3 << 20))
    roots = [(full(store, img), bytes(img))]
    for day in range(10):
        changed = mutate(rng, img, days_ops=rng.randint(1, 12), grow=day in (2, 7))
        prev = roots[-1][0]
        root = write_image(store, BytesSource(bytes(img)), len(img), prev=prev, changed=changed)
        # the --changed path and a full read build the same tree, block for block
        assert root == full(store, img), f"day {day}"
        roots.append((root, bytes(img)))
    for root, data in roots:  # every day still restores byte for byte
        assert readback(store, root) == data


def test_only_changed_leaves_are_read_and_paths_rewritten(tmp_path):
    s = MemStore("hash")
    rng = seeded(3)
    img = bytearray(content(rng, 8 << 20))
    img[:] = rng.randbytes(len(img))  # every block distinct
    root = full(s, img)
    blocks_before = len(s.blocks)
    img[5 * BS + 100:5 * BS + 200] = b"x" * 100
    img[1000 * BS:1002 * BS] = rng.randbytes(2 * BS)
    src = Recording(bytes(img))
    new = write_image(s, src, len(img), prev=root, changed=[(5 * BS + 100, 100), (1000 * BS, 2 * BS)])
    # whole aligned blocks, and nothing else
    assert sorted(src.reads) == [(5 * BS, BS), (1000 * BS, 2 * BS)]
    sh = Shape(s, len(img))
    assert sh.depth == 2
    # 3 new leaves, 2 level-1 nodes (leaf 5 and leaves 1000-1001 live in different ones), 1 root
    assert len(s.blocks) - blocks_before == 3 + 2 + 1
    assert readback(s, new) == img
    assert readback(s, root) != img


def test_blocks_rewritten_with_their_own_bytes_write_no_node():
    """Ranges said to be changed whose blocks hold the same bytes as before: every node they reach
    is opened and patched with the refs it already holds, and none is handed to the store again."""
    s = MemStore("value")
    rng = seeded(5)
    img = bytearray(rng.randbytes(8 << 20))
    root = full(s, img)
    nodes = []  # the tree blocks each later write hands to the store
    write = s.write_blocks
    s.write_blocks = lambda buf, btype=1: (nodes.append(len(buf) // BS) if btype == BlockType.TREE else None,
                                           write(buf, btype))[1]
    new = write_image(s, BytesSource(bytes(img)), len(img), prev=root,
                      changed=[(0, 300 * BS), (1000 * BS, 5 * BS), (len(img) - BS, BS)])
    assert new == root and sum(nodes) == 0
    img[1000 * BS] ^= 1  # one byte of one block: its level-1 node and the root change
    new = write_image(s, BytesSource(bytes(img)), len(img), prev=root, changed=[(1000 * BS, 1)])
    assert sum(nodes) == 2 and new != root and readback(s, new) == img


def test_a_later_day_holds_one_copy_of_each_node_it_opens():
    """The nodes a later day opens (~340 at once on the standard workload) are held once each, the
    copy being patched, not beside their old bytes as well."""
    s = MemStore("hash")
    img = seeded(6).randbytes(8 << 20)
    root = full(s, img)
    b = tree_mod._Builder(s, Shape(s, len(img)), root)
    b.ensure(list(range(16)))
    blocks = [x for node in b.open[1].values() for x in node if isinstance(x, (bytes, bytearray)) and len(x) == BS]
    assert len(b.open[1]) == 16 and len(blocks) == 16


def test_unchanged_day_costs_nothing(store):
    rng = seeded(4)
    img = content(rng, 1 << 20)
    root = full(store, img)
    assert write_image(store, BytesSource(img), len(img), prev=root, changed=[]) == root
    assert write_image(store, BytesSource(img), len(img), prev=root, changed=[(10, 0)]) == root


@pytest.mark.parametrize("sizes", [
    [0, 1, BS, BS + 1, 3 * BS - 7, 0],
    [5 * BS + 3, 300 * BS + 1, 17 * BS, 2],
    [1, 200 * BS, 1],
])
def test_grow_and_shrink_across_depths(store, sizes):
    rng = seeded(sum(sizes))
    img = bytearray()
    prev = full(store, img)
    for n in sizes:
        if n > len(img):
            start = len(img)
            img += content(rng, n - start)
            changed = [(start, n - start)]
        else:
            del img[n:]
            changed = []
        if len(img) > 2:
            img[1:2] = b"Q"
            changed.append((1, 1))
        root = write_image(store, BytesSource(bytes(img)), len(img), prev=prev, changed=changed)
        assert root.size == len(img)
        assert readback(store, root) == img
        assert root == full(store, img)
        prev = root


def test_deep_trees_with_small_blocks(tmp_path):
    """512-byte blocks make depth 3 and 4 reachable with small images."""
    for mode in MODES:
        path = make_store(tmp_path / mode, mode=mode, block_size=512, arena_size=64 << 10)
        with open_store(path) as s:
            rng = seeded(9)
            img = bytearray(content(rng, 3 << 20))
            sh = Shape(s, len(img))
            assert sh.depth >= 3
            root = full(s, img)
            for day in range(3):
                changed = mutate(rng, img, days_ops=8, grow=day == 1)
                root = write_image(s, BytesSource(bytes(img)), len(img), prev=root, changed=changed)
                assert readback(s, root) == img
            # shrink back to a depth-1 tree and grow again
            del img[40 * 512:]
            root = write_image(s, BytesSource(bytes(img)), len(img), prev=root, changed=[])
            assert root.depth == Shape(s, len(img)).depth
            assert readback(s, root) == img


def test_zero_blocks_cost_nothing(store):
    img = bytes(4 << 20)
    root = full(store, img)
    assert root.ref == store.null_ref
    assert readback(store, root) == img
    # a zero subtree in the middle of data: null ref inside the tree
    rng = seeded(5)
    img = bytearray(content(rng, 6 << 20))
    img[2 << 20:4 << 20] = bytes(2 << 20)  # a whole level-1 node in both modes
    root = full(store, img)
    r = ImageReader(store, root)
    nulls = sum(1 for _, _, refs in r.iter_leaves() if refs is None)
    assert nulls >= 1
    assert r.read(0, len(img)) == img


def test_zeros_are_archived_as_zeros_and_not_read(store):
    rng = seeded(6)
    img = bytearray(rng.randbytes(2 << 20))
    zeros = [(BS * 10 + 5, BS * 20), (BS * 100, BS * 3)]
    src = Recording(bytes(img))
    root = write_image(store, src, len(img), zeros=zeros)
    expect = bytearray(img)
    for o, n in zeros:
        expect[o:o + n] = bytes(n)
    assert readback(store, root) == expect
    for o, n in src.reads:  # full blocks inside a zero range are never read
        for b in range(o // BS, (o + n) // BS):
            assert not (BS * 11 <= b * BS and (b + 1) * BS <= BS * 30 + 5), b
    # zeros also apply to unchanged parts on a --changed day
    root2 = write_image(store, BytesSource(bytes(img)), len(img), prev=write_image(
        store, BytesSource(bytes(img)), len(img)), changed=[], zeros=zeros)
    assert readback(store, root2) == expect


def test_changed_ranges_are_checked(store):
    img = bytes(10 * BS)
    root = full(store, img)
    with pytest.raises(BadRanges, match=r"entry 1 \[40000, 1000\] ends at byte 41000, beyond the end"):
        write_image(store, BytesSource(img), len(img), prev=root, changed=[(0, 1), (40000, 1000)])
    with pytest.raises(BadRanges, match="negative"):
        write_image(store, BytesSource(img), len(img), prev=root, changed=[(-1, 4)])
    assert issubclass(BadRanges, BadInput)


def test_reader_random_and_sequential_reads(store):
    rng = seeded(8)
    img = content(rng, (3 << 20) + 1234)
    root = full(store, img)
    r = ImageReader(store, root, node_cache=4)
    for _ in range(300):
        off = rng.randrange(0, len(img) + 10)
        n = rng.choice([1, 511, BS, BS + 1, 65536, 200000])
        assert r.read(off, n) == img[off:off + n]
    # sequential 128 KiB reads (what FUSE does) grow the read-ahead window
    out = bytearray()
    off = 0
    while off < len(img):
        out += r.read(off, 131072)
        off += 131072
    assert out == img
    assert r.read(len(img), 10) == b""
    with pytest.raises(ValueError):
        r.read(-1, 1)


def test_restore_is_sparse_and_exact(store, tmp_path):
    rng = seeded(12)
    img = bytearray(content(rng, 4 << 20))
    img[BS:(3 << 20)] = bytes((3 << 20) - BS)
    img += b"tail"  # not a whole block
    root = full(store, img)
    out = tmp_path / "out.raw"
    restore_image(store, root, out)
    assert out.read_bytes() == img
    st = os.stat(out)
    assert st.st_blocks * 512 < len(img) - (2 << 20)  # the zero megabytes are holes
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".out.raw")]


def test_restore_qcow2(store, tmp_path):
    import subprocess

    rng = seeded(13)
    img = content(rng, 2 << 20)
    root = full(store, img)
    out = tmp_path / "out.qcow2"
    restore_image(store, root, out, fmt="qcow2")
    info = subprocess.run(["qemu-img", "info", "--output=json", str(out)], capture_output=True, text=True)
    assert '"format": "qcow2"' in info.stdout
    back = tmp_path / "back.raw"
    subprocess.run(["qemu-img", "convert", "-O", "raw", str(out), str(back)], check=True)
    assert back.read_bytes() == img


def test_blobs(store):
    for data in [b"", b"x", bytes(BS), b"y" * (BS + 1), bytes(range(256)) * 3000]:
        root = write_blob(store, data)
        assert read_blob(store, root) == data
    a = b"".join(b"line %d\n" % i for i in range(20000))
    ra = write_blob(store, a)
    b = a + b"one more line\n"
    rb = write_blob(store, b, prev=ra, prev_data=a)
    assert read_blob(store, rb) == b
    assert rb == write_blob(store, b)
    assert Root.from_json(rb.to_json()) == rb


def test_blob_update_sends_only_the_tail():
    s = MemStore("value")
    a = b"".join(b"line %d\n" % i for i in range(100000))
    ra = write_blob(s, a)
    s.calls["write_blocks"] = 0
    before = s.bytes_written
    rb = write_blob(s, a + b"x\n", prev=ra, prev_data=a)
    assert read_blob(s, rb) == a + b"x\n"
    assert s.bytes_written - before <= 4 * BS  # last leaf + the path above it


def test_images_share_one_store_and_dedup(tmp_path):
    for mode in MODES:
        path = make_store(tmp_path / mode, mode=mode)
        with open_store(path) as s:
            rng = seeded(21)
            a = rng.randbytes(2 << 20)
            ra = full(s, a)
            s.sync()
            before = s.log_bytes()
            b = a[:1 << 20] + rng.randbytes(BS) + a[(1 << 20) + BS:]
            rb = full(s, b)
            s.sync()
            grew = s.log_bytes() - before
            assert grew < 16 * BS, grew  # one new block and a few tree nodes
            assert readback(s, ra) == a and readback(s, rb) == b


def test_big_batches(monkeypatch):
    """Leaves reach the store in batches of CHUNK bytes, not block by block."""
    monkeypatch.setattr(tree_mod, "CHUNK", 1 << 20)
    s = MemStore("hash")
    img = seeded(1).randbytes(5 << 20)
    full(s, img)
    data_calls = s.calls["write_blocks"]
    assert data_calls <= 5 + 5 * 3  # 5 data batches + a few node batches each


@pytest.mark.parametrize("ahead", [1, 2, 3])
def test_appends_in_flight_keep_every_block(tmp_path, monkeypatch, ahead):
    """With `ahead` appends in flight (each batch decided against the keys of those not yet settled),
    every day restores byte for byte, duplicates across batches are stored once, and the caller's
    buffers are never changed under an append."""
    monkeypatch.setattr(tree_mod, "CHUNK", 1 << 20)  # six batches: the repeat is the next one
    path = make_store(tmp_path / "store", mode="hash")
    rng = seeded(41)
    img = bytearray(content(rng, 6 << 20))
    img[1 << 20:2 << 20] = img[:1 << 20]  # a batch repeats the one before it (still in flight)
    with open_store(path) as s:
        s.ahead = ahead
        r1 = full(s, img)
        records = s.counters["records"]
        ch = mutate(rng, img)
        r2 = write_image(s, BytesSource(bytes(img)), len(img), prev=r1, changed=ch)
        s.sync()
        assert readback(s, r2) == img
    with open_store(path, writable=False) as s:
        assert readback(s, r2) == img
    with open_store(path) as s2:  # the same image again: every block a duplicate
        s2.ahead = ahead
        assert full(s2, img) == r2
    uniq = len({bytes(img[i:i + BS]) for i in range(0, 6 << 20, BS)} - {bytes(BS)})
    assert records <= uniq + 64  # its data blocks once each, plus the tree nodes


def test_a_source_read_two_at_once_gets_a_deeper_pipeline(tmp_path, monkeypatch):
    """A raw image (two reads at once) is archived with DEEP appends in flight and DEEP_READS
    batches read ahead, in as many buffers as that takes; a source read one batch at a time with
    the store's own `ahead` and one batch read ahead. The store's `ahead` is its own again after
    either, and every byte reads back (a second day decided against the batches in flight)."""
    import mmap

    from foundation.image.source import RawSource

    monkeypatch.setattr(tree_mod, "CHUNK", 1 << 20)  # six batches
    rng = seeded(43)
    img = bytearray(content(rng, 6 << 20))
    img[2 << 20:3 << 20] = img[1 << 20:2 << 20]  # a batch repeats the one before it (in flight)
    raw = tmp_path / "disk.raw"
    raw.write_bytes(bytes(img))
    buffers = []

    class Maps:  # the image buffers write_image maps
        def mmap(self, *a, **k):
            buffers.append(mmap.mmap(*a, **k))
            return buffers[-1]

    monkeypatch.setattr(tree_mod, "mmap", Maps())
    path = make_store(tmp_path / "store", mode="hash")
    with open_store(path) as s:
        seen = []
        write_blocks = s.write_blocks

        def spy(buf, *a, **k):
            seen.append(s.ahead)
            return write_blocks(buf, *a, **k)

        monkeypatch.setattr(s, "write_blocks", spy)
        src = RawSource(str(raw))
        try:
            r1 = write_image(s, src, len(img))
        finally:
            src.close()
        assert tree_mod.DEEP > 1 and tree_mod.DEEP_READS > 1
        assert seen and set(seen) == {tree_mod.DEEP} and s.ahead == 1
        assert len(buffers) == 1 + tree_mod.DEEP_READS + tree_mod.DEEP
        seen.clear()
        buffers.clear()
        other = bytes(content(seeded(44), 6 << 20))
        assert readback(s, full(s, other)) == other
        assert seen and set(seen) == {1} and s.ahead == 1
        assert len(buffers) == 3  # one being read, one written, one appending
        ch = mutate(rng, img)
        r2 = write_image(s, BytesSource(bytes(img)), len(img), prev=r1, changed=ch)
        s.sync()
        assert readback(s, r2) == img
        assert readback(s, r1) == raw.read_bytes()


def test_encrypted_store_round_trip(tmp_path):
    key = tmp_path / "keys" / "store.key"
    path = make_store(tmp_path / "store", mode="hash", encrypt=True, key_file=str(key))
    rng = seeded(30)
    img = bytearray(content(rng, 1 << 20))
    with open_store(path, key_file=str(key)) as s:
        r1 = full(s, img)
        ch = mutate(rng, img)
        r2 = write_image(s, BytesSource(bytes(img)), len(img), prev=r1, changed=ch)
        s.sync()
    with open_store(path, writable=False, key_file=str(key)) as s:
        assert readback(s, r2) == img


def test_source_with_only_read(store):
    """A source without readinto (the contract's minimum) works the same."""

    class Plain:
        def __init__(self, data):
            self.data = data

        def read(self, offset, length):
            return self.data[offset:offset + length]

    img = content(seeded(14), (1 << 20) + 77)
    root = write_image(store, Plain(img), len(img))
    assert root == full(store, img)
    assert readback(store, root) == img


def test_restore_reads_the_log_in_order_window_by_window(store, tmp_path, monkeypatch):
    """A day whose blocks lie scattered over many arenas: each window's records are read front to
    back in the log, a block named twice lands in both places, and the file is exact and sparse."""
    from foundation.image import reader as reader_mod

    rng = seeded(21)
    img = bytearray(content(rng, 3 << 20))
    img[BS * 10:BS * 11] = img[BS * 500:BS * 501] = b"same" * (BS // 4)  # one record, two places
    root = full(store, img)
    for _ in range(12):  # later days scatter the image's blocks over the log
        ch = mutate(rng, img)
        root = write_image(store, BytesSource(bytes(img)), len(img), prev=root, changed=ch)
    img[-BS:] = bytes(BS)
    img += b"odd tail"
    root = write_image(store, BytesSource(bytes(img)), len(img), prev=root, changed=[(len(img) - BS - 8, BS + 8)])
    store.sync()
    from foundation.store import read as read_mod

    # Spans are handed to the reading threads in log order (two read at once, so the reads
    # themselves may start in either order): the order of submission is what a pass decides.
    reads, order = [], []
    span_read, span_open = read_mod._SpanReads.read, read_mod._SpanReads.open

    def spy(self, arena, start, size, rb):
        # by size too: two windows' spans may start alike (a read reaches back a run's length)
        reads.append((arena, start, size))
        return span_read(self, arena, start, size, rb)

    def spy_open(self, arena):
        order.append(arena)
        return span_open(self, arena)

    monkeypatch.setattr(read_mod._SpanReads, "read", spy)
    monkeypatch.setattr(read_mod._SpanReads, "open", spy_open)
    out = tmp_path / "out.raw"
    monkeypatch.setattr(reader_mod, "FIRST_WINDOW_PART", 1)  # windows of WINDOW from the first
    for window, passes in ((1 << 20, 4), (None, 1)):
        monkeypatch.setattr(reader_mod, "WINDOW", window or (1 << 30))
        reads.clear()
        order.clear()
        restore_image(store, root, out)
        assert out.read_bytes() == img
        assert os.stat(out).st_blocks * 512 < len(img)
        assert len(order) == len(reads) and sorted(reads) == sorted(set(reads))  # each span read once
        descents = sum(b < a for a, b in zip(order, order[1:]))
        assert len(order) > passes and descents <= passes - 1, order


def test_a_stream_of_windows_recycles_its_read_buffers(store, monkeypatch):
    """Window after window of a sequential copy (vda.raw): each window exact, its spans read into
    buffers the process keeps between passes, never more than one pass has in flight."""
    import mmap

    from foundation.store import read as read_mod

    img = content(seeded(7), 6 << 20)
    root = full(store, img)
    store.sync()
    made, real = [], mmap.mmap

    class Counting:
        @staticmethod
        def mmap(*a):
            made.append(a)
            return real(*a)

    monkeypatch.setattr(read_mod, "mmap", Counting)
    monkeypatch.setattr(read_mod, "_spare", [])
    r = ImageReader(store, root)
    step = 2 << 20
    for off in range(0, len(img), step):
        assert bytes(r.read_window(off, step)) == img[off:off + step]
    assert 0 < len(made) <= read_mod.AHEAD and len(read_mod._spare) <= read_mod.SPARE


def test_windows_one_after_the_other_are_one_stream(store, monkeypatch):
    """read_window's windows asked for one after the other are one log-order stream: each window
    planned once, the next one's spans under way while this one ends; a window that is not the
    next, or one after the store was refreshed, starts a stream of its own. Recycled buffers
    (old bytes in them) come back exact, null blocks zeroed. Every window exact."""
    rng = seeded(11)
    img = bytearray(content(rng, 6 << 20))
    img[(1 << 20) + 3 * BS:(1 << 20) + 9 * BS] = bytes(6 * BS)  # null blocks inside a window
    img[(2 << 20) + BS:(2 << 20) + 101 * BS] = bytes(100 * BS)  # a run longer than reader._ZEROS
    root = full(store, img)
    for _ in range(4):  # later days scatter the blocks over the log
        ch = mutate(rng, img)
        root = write_image(store, BytesSource(bytes(img)), len(img), prev=root, changed=ch)
    store.sync()
    plans, made = [], type(store).log_order_plan

    def spy(self, refs):
        plans.append(len(refs))
        return made(self, refs)

    monkeypatch.setattr(type(store), "log_order_plan", spy)
    step = 1 << 20
    bufs = [bytearray(b"\xaa" * step) for _ in range(4)]
    used = []

    def alloc(n):
        used.append(n)
        return bufs[len(used) % 4]  # a window's buffer comes back dirty

    r = ImageReader(store, root)
    fds = []
    for off in range(0, len(img), step):
        assert bytes(r.read_window(off, step, alloc)) == img[off:off + step]
        fds.append(len(os.listdir("/proc/self/fd")))
    assert len(plans) == len(img) // step == len(used)  # once a window
    # the O_DIRECT descriptors of arenas passed are closed as the stream goes on (the log's own
    # descriptors stay, as many as it keeps)
    assert max(fds) <= fds[0] + 1  # (without: one more for every arena passed)
    plans.clear()
    assert bytes(r.read_window(0, step)) == img[:step]  # not the next window: a stream of its own
    assert bytes(r.read_window(3 * step, step)) == img[3 * step:4 * step]  # not the next either
    st = r._stream
    assert bytes(r.read_window(4 * step, step)) == img[4 * step:5 * step]  # the next one: the same stream
    assert r._stream is st
    st.log = object()  # as if the store had been refreshed
    assert bytes(r.read_window(5 * step, step)) == img[5 * step:6 * step]
    assert r._stream is not st
    # a block of the next window that cannot be located fails that window at its own turn, loudly,
    # not the window being read
    bad = bytes(r.leaf_refs(2 * step // BS, 3 * step // BS))

    def lost(self, refs):
        if bytes(refs) == bad:
            raise DataCorrupt("arena 9 offset 0: block lost")
        return made(self, refs)

    monkeypatch.setattr(type(store), "log_order_plan", lost)
    r = ImageReader(store, root)
    assert bytes(r.read_window(step, step)) == img[step:2 * step]
    with pytest.raises(DataCorrupt, match="block lost"):
        r.read_window(2 * step, step)
    assert r._stream is None
    monkeypatch.setattr(type(store), "log_order_plan", made)
    assert bytes(r.read_window(3 * step, step)) == img[3 * step:4 * step]  # the stream starts again


def test_restore_windows_grow_from_a_small_first_one(store, tmp_path, monkeypatch):
    """The first window is WINDOW / FIRST_WINDOW_PART, each next one twice the one before, up to
    WINDOW; the file is exact whatever the cut."""
    from foundation.image import reader as reader_mod

    img = bytearray(content(seeded(41), 3 << 20))
    img[BS * 100:BS * 300] = bytes(BS * 200)  # a hole across a window's edge
    root = full(store, img)
    sizes = []
    plan = reader_mod._plan
    monkeypatch.setattr(reader_mod, "_plan",
                        lambda s, runs: sizes.append(sum(c for _, c, _ in runs)) or plan(s, runs))
    monkeypatch.setattr(reader_mod, "WINDOW", 512 * BS)
    monkeypatch.setattr(reader_mod, "FIRST_WINDOW_PART", 4)
    out = tmp_path / "out.raw"
    restore_image(store, root, out)
    assert out.read_bytes() == img
    per_node, left, want, expect = BS // store.ref_size, len(img) // BS, 128, []
    while left:  # the leaves come a tree node at a time
        expect.append(min(left, -(-want // per_node) * per_node))
        left, want = left - expect[-1], min(512, 2 * want)
    assert sizes == expect and len(sizes) >= 2, sizes


def test_restore_of_an_image_that_fits_one_window_is_one_pass(store, tmp_path, monkeypatch):
    """An image no larger than WINDOW is planned as one window, not cut into a small first one and
    the rest: each arena its blocks lie in is then read once, front to back."""
    from foundation.image import reader as reader_mod

    img = bytearray(content(seeded(43), 2 << 20))
    img[BS * 10:BS * 40] = bytes(BS * 30)
    root = full(store, img)
    sizes = []
    plan = reader_mod._plan
    monkeypatch.setattr(reader_mod, "_plan",
                        lambda s, runs: sizes.append(sum(c for _, c, _ in runs)) or plan(s, runs))
    monkeypatch.setattr(reader_mod, "WINDOW", len(img))
    monkeypatch.setattr(reader_mod, "FIRST_WINDOW_PART", 4)
    out = tmp_path / "out.raw"
    restore_image(store, root, out)
    assert out.read_bytes() == img
    assert sizes == [len(img) // BS], sizes


def test_cold_restore_sweeps_each_arena_once(tmp_path, monkeypatch):
    """A store opened cold knows none of the image's blocks: they are located by sweeping each
    arena the index names (one index lookup and one summary read an arena, not one a block), a
    block named at several places lands in each, and the file is exact."""
    from foundation.store import read as read_mod

    path = make_store(tmp_path / "store", mode="hash")
    rng = seeded(31)
    img = bytearray(content(rng, 2 << 20))
    for i in (3, 77, 300, 401):  # one record, four places, in different arenas' reach
        img[BS * i:BS * (i + 1)] = b"twice" * (BS // 5) + bytes(BS % 5)
    with open_store(path) as s:
        root = full(s, img)
        for _ in range(3):  # later days scatter the image's blocks over the log
            ch = mutate(rng, img)
            root = write_image(s, BytesSource(bytes(img)), len(img), prev=root, changed=ch)
        s.sync()
        s.flush()  # every record in the on-disk index: the write buffer answers for none
        arenas = s.log.open.n + 1
    assert arenas >= 4, arenas
    monkeypatch.setattr(read_mod, "SWEEP_MIN", 256)  # a restore's window, at this image's scale
    monkeypatch.setattr(read_mod, "DIRECT_MIN", 0)
    from foundation.image import reader as reader_mod
    monkeypatch.setattr(reader_mod, "DIRECT_WRITES", True)  # the switch's path, exact too
    with open_store(path, writable=False) as s:
        asked = []
        lookup = s._index_lookup
        monkeypatch.setattr(s, "_index_lookup", lambda key: asked.append(key) or lookup(key))
        # A span reaches a record's largest size past its last record: at the end of an arena's file
        # that read comes back short. Here every span asks 16 bytes more and gets them cut off.
        import types
        monkeypatch.setattr(read_mod, "L", types.SimpleNamespace(HEADER_SIZE=read_mod.L.HEADER_SIZE + 16))
        span_read = read_mod._SpanReads.read

        def short(self, arena, start, size, rb):
            b = span_read(self, arena, start, size, rb)
            return b[:-16] if len(b) == size else b

        monkeypatch.setattr(read_mod._SpanReads, "read", short)
        direct = []  # the passes' O_DIRECT descriptors (None where the file system refuses one)
        span_open = read_mod._SpanReads.open
        monkeypatch.setattr(read_mod._SpanReads, "open",
                            lambda self, arena: span_open(self, arena) or
                            (arena in self.direct and direct.append(self.direct[arena])))
        slow = []  # refs read block by block (tree nodes; a span's blocks only after damage)
        read_blocks = read_mod.Reads.read_blocks
        monkeypatch.setattr(read_mod.Reads, "read_blocks",
                            lambda self, refs: slow.append(len(refs) // 32) or read_blocks(self, refs))
        sweeps = []
        sweep_arena = read_mod.Reads._sweep_arena
        monkeypatch.setattr(read_mod.Reads, "_sweep_arena",
                            lambda self, n, *a: sweeps.append(n) or sweep_arena(self, n, *a))
        out = tmp_path / "out.raw"
        restore_image(s, root, out)
        assert out.read_bytes() == img
        assert sweeps and len(sweeps) == len(set(sweeps)) and len(sweeps) <= arenas
        assert len(asked) <= 2 * arenas  # not one a block (the image has 512)
        # the span at an arena's end reads short of a record's largest size past its last record:
        # still decoded in one piece, not block by block
        assert sum(slow) < 16, slow
        from foundation.image.reader import open_direct
        probe = open_direct(str(out))
        if probe is not None:  # sealed arenas were read around the page cache
            os.close(probe)
            assert direct and all(fd is not None for fd in direct), direct


def test_restore_reads_small_spans_of_an_arena_as_one_task(tmp_path, monkeypatch):
    """A day whose blocks lie in runs with gaps between them (the others overwritten) has many
    small spans: those of one arena are read and decoded as one task of several pieces, each
    block lands where it belongs, with O_DIRECT and through the page cache, and a damaged
    record in a task is read again block by block and named."""
    from foundation.image import reader as reader_mod
    from foundation.store import read as read_mod

    path = make_store(tmp_path / "store", mode="hash")
    rng = seeded(33)
    first = content(rng, 2 << 20)
    later = bytearray(first)
    for k in range(0, len(later) // BS, 32):  # every other run of 16 blocks written again
        later[(k + 16) * BS:(k + 32) * BS] = rng.randbytes(16 * BS)
    with open_store(path) as s:
        full(s, first)
        root = full(s, bytes(later))
        s.sync()
        s.flush()
    monkeypatch.setattr(read_mod, "SWEEP_MIN", 256)
    monkeypatch.setattr(read_mod, "LOG_GAP", 8 << 10)  # each run of 16 blocks its own span
    tasks = []
    cut = read_mod._tasks
    monkeypatch.setattr(read_mod, "_tasks", lambda spans: tasks.append(cut(spans)) or tasks[-1])
    for direct in (0, 1 << 40):
        monkeypatch.setattr(read_mod, "DIRECT_MIN", direct)
        tasks.clear()
        out = tmp_path / f"out{direct}.raw"
        with open_store(path, writable=False) as s:
            restore_image(s, root, out)
        assert out.read_bytes() == bytes(later)
        pieces = [len(t[5]) for ts in tasks for t in ts if t[5] is not None]
        assert pieces and max(pieces) > 1 and max(pieces) <= read_mod.TASK_PIECES, pieces
        live = sum(1 for k in range(len(later) // BS) if any(later[k * BS:(k + 1) * BS]))
        assert sum(t[4] - t[3] for ts in tasks for t in ts) == live  # every block of the day in one task
    # the first record (block 0 of both days, the first piece of a task) damaged: the task is
    # read again block by block, which names it
    arena = sorted((tmp_path / "store" / "arenas").iterdir())[0]
    with open(arena, "r+b") as f:
        f.seek(72 + 64 + 100)  # inside the first record's payload
        f.write(b"\xff\xfe")
    with open_store(path, writable=False) as s:
        with pytest.raises(DataCorrupt, match=r"arena 0 offset 72: record .* check failed"):
            restore_image(s, root, tmp_path / "bad.raw")


def test_direct_writes_whole_pages_and_the_rest_through_the_cache(tmp_path, monkeypatch):
    """A restore's writer: whole pages of a page-aligned buffer go through the O_DIRECT descriptor,
    a short last block through the page cache, and a file system that refuses O_DIRECT mid-way
    gets the rest through the cache; the bytes are exact either way."""
    import errno
    import mmap

    from foundation.image import reader as reader_mod

    path = tmp_path / "out.raw"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    direct = reader_mod.open_direct(str(path))
    scratch = None
    if direct is None:  # a tmpfs /tmp: a disk's file system, as a restore's output has
        os.close(fd)
        scratch = tempfile.mkdtemp(dir="/var/tmp")
        path = os.path.join(scratch, "out.raw")
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        direct = reader_mod.open_direct(path)
    assert direct is not None, f"neither {tmp_path} nor /var/tmp takes O_DIRECT writes"
    try:
        buf = mmap.mmap(-1, 1 << 20)
        buf[:] = seeded(5).randbytes(1 << 20)
        out = reader_mod._Out(fd, direct)
        view = memoryview(buf)
        jobs = [(view[:8192], 4096), (view[8192:8192 + 100], 20480)]
        assert out.write(jobs, buf) is buf and out.direct == direct
        os.fsync(fd)
        got = os.pread(fd, 20580, 0)
        assert got == bytes(4096) + buf[:8192] + bytes(8192) + buf[8192:8292]
        del view, jobs
        calls = []
        pwrite = reader_mod._pwrite

        def refuse(f, b, off):
            calls.append(f)
            if f == direct:
                raise OSError(errno.EINVAL, "Invalid argument")
            return pwrite(f, b, off)

        monkeypatch.setattr(reader_mod, "_pwrite", refuse)
        view = memoryview(buf)
        out.write([(view[:4096], 0), (view[4096:8192], 65536)], buf)
        assert calls == [direct, fd, fd] and out.direct is None
        assert os.pread(fd, 4096, 0) == buf[:4096] and os.pread(fd, 4096, 65536) == buf[4096:8192]
        del view
        buf.close()
    finally:
        os.close(fd)
        os.close(direct)
        if scratch is not None:
            shutil.rmtree(scratch)


def test_restore_of_a_damaged_record_fails_naming_it(tmp_path):
    path = make_store(tmp_path / "store", mode="hash")
    img = seeded(22).randbytes(64 * BS)
    with open_store(path) as s:
        root = full(s, img)
        s.sync()
    arena = sorted((tmp_path / "store" / "arenas").iterdir())[0]
    with open(arena, "r+b") as f:
        f.seek(72 + 64 + 100)  # inside the first record's payload: a data block
        f.write(b"\xff\xfe")
    out = tmp_path / "out.raw"
    with open_store(path, writable=False) as s:
        with pytest.raises(DataCorrupt, match=r"arena 0 offset 72: record .* check failed"):
            restore_image(s, root, out)
    assert not out.exists() and not [p for p in os.listdir(tmp_path) if p.startswith(".out.raw")]


def test_restore_to_a_device_overwrites_every_byte(store, tmp_path):
    """write_raw without holes (a block device): old bytes under the image's zero blocks are zeroed."""
    from foundation.image import write_raw

    rng = seeded(23)
    img = bytearray(content(rng, 2 << 20))
    img[BS * 5:BS * 300] = bytes(BS * 295)
    img += b"x"
    root = full(store, img)
    dev = tmp_path / "dev"
    dev.write_bytes(b"\xaa" * len(img))
    fd = os.open(dev, os.O_WRONLY)
    try:
        write_raw(store, root, fd, sparse=False, window=256 << 10)
    finally:
        os.close(fd)
    assert dev.read_bytes() == img


def test_tree_nodes_are_kept_by_the_reader_only(store):
    """A reader keeps at most node_cache interior nodes, and the store's block cache none of them
    (a copy of a whole day held them twice); every read stays exact."""
    img = content(seeded(43), 6 << 20)
    root = full(store, img)
    store.sync()
    store.blocks.clear()
    r = ImageReader(store, root, node_cache=2)
    assert r.sh.depth >= 2
    step = 64 << 10
    for off in range(0, len(img), step):
        assert r.read(off, step) == img[off:off + step]
    assert len([k for k in r._nodes if k != "root"]) <= 2
    nodes = {v for k, v in r._nodes.items() if k != "root"}  # the root is read as any block is
    assert nodes and not any(data in nodes for (_, data), _ in store.blocks.d.values())
    assert r.read(len(img) - 100, 100) == img[-100:]  # a node dropped is read again


def _sealed_blocks(tmp_path):
    """A store whose first blocks lie in a sealed arena, known only to the on-disk index."""
    from foundation.store import Store, Tuning
    from tests.conftest import blocks as mixed
    path = tmp_path / "s"
    path.mkdir()
    Store.create(str(path), arena_size=256 << 10, max_log_size=64 << 20, encrypt=False)
    data = mixed(160, seed=5)
    with Store.open(str(path), writable=True) as s:
        refs = s.write_blocks(data)
        s.flush()
        assert s.log.open.n >= 1
    tuning = Tuning(index_cache_bytes=1 << 20)
    return (lambda: Store.open(str(path), writable=True, tuning=tuning)), data[:8 * 4096], refs[:8 * 32]


def test_old_nodes_are_located_by_the_index_alone(tmp_path):
    """A later day's old tree nodes: the index lookups made together locate them, no arena summary
    is loaded to confirm each, and the blocks are the ones written."""
    opener, data, refs = _sealed_blocks(tmp_path)
    with opener() as s:
        assert b"".join(tree_mod._read_nodes(s, refs)) == data
        assert not s.summaries
    with opener() as s:  # outside the scope the summary is loaded, as before
        assert b"".join(s.read_blocks(refs)) == data
        assert s.summaries


def test_a_wrong_index_answer_for_an_old_node_fails_loudly(tmp_path, monkeypatch):
    """The index names another block's record: the read finds the key differs, reads again the
    careful way (the arena's summary disagrees too) and fails; never another block's bytes."""
    from foundation.errors import NotFound
    opener, data, refs = _sealed_blocks(tmp_path)
    with opener() as s:
        real = s.index.lookup
        keys = [refs[i:i + 32] for i in range(0, len(refs), 32)]
        other = {k: keys[(i + 1) % len(keys)] for i, k in enumerate(keys)}
        monkeypatch.setattr(s.index, "lookup", lambda k: real(other.get(bytes(k), k)))
        with pytest.raises((DataCorrupt, NotFound)):
            tree_mod._read_nodes(s, refs)
