"""rawstream.RawStream: the reads of an open vda.raw, sequential from decoded windows, small ones alone."""

import errno
import random

import pyfuse3
import pytest
import trio
from test_image_support import BS, make_store, open_store

from foundation.errors import DataCorrupt
from foundation.image import BytesSource, ImageReader, write_image
from foundation.snapshotfs import rawstream
from foundation.snapshotfs.archive import _Clipped
from foundation.snapshotfs.tree import SnapshotFS

WIN = 64 << 10


@pytest.fixture(autouse=True)
def small_windows(monkeypatch):
    monkeypatch.setattr(rawstream, "WINDOW", WIN)
    monkeypatch.setattr(rawstream, "STREAM_BYTES", 1)


class Disk:
    """Bytes read as a disk; reads touching `bad` raise DataCorrupt, as a damaged block does."""

    def __init__(self, data, bad=()):
        self.data, self.bad = data, bad
        self.windows, self.reads = [], []

    def _check(self, off, n):
        for b0, b1 in self.bad:
            if off < b1 and b0 < off + n:
                raise DataCorrupt(f"damaged block at byte {b0}")

    def read(self, off, n):
        self.reads.append((off, n))
        self._check(off, n)
        return self.data[off:off + n]

    def window(self, off, n, alloc=None):
        self.windows.append(off)
        self._check(off, n)
        return memoryview(self.data)[off:off + n]


class FS:
    """What RawStream needs of SnapshotFS: its worker thread and its EIO mapping."""

    _attempt = SnapshotFS._attempt
    _work = SnapshotFS._work

    def __init__(self, nursery):
        self.nursery = nursery
        self.limiter = trio.CapacityLimiter(1)


def stream_reads(disk, size, reads, background=True):
    """Run reads [(offset, length)] one after the other -> [bytes or errno]."""
    out = []

    async def main():
        async with trio.open_nursery() as nursery:
            fs = FS(nursery if background else None)
            s = rawstream.RawStream(disk, size, "vda.raw")
            for off, n in reads:
                try:
                    out.append(bytes(await s.read(off, n, fs)))
                except pyfuse3.FUSEError as e:
                    out.append(e.errno)
            nursery.cancel_scope.cancel()

    trio.run(main)
    return out


@pytest.mark.parametrize("background", [True, False])
def test_sequential_reads_are_served_from_windows(background):
    data = random.Random(1).randbytes(5 * WIN + 1234)
    disk = Disk(data)
    step = 20 << 10  # requests cross window boundaries
    reads = [(o, step) for o in range(0, len(data) + step, step)]
    got = stream_reads(disk, len(data), reads, background)
    assert b"".join(got) == data
    assert sorted(disk.windows) == [w * WIN for w in range(6)]  # each window decoded once
    assert len(disk.reads) == rawstream.SEQUENTIAL  # only the reads before the run was seen


def test_reads_out_of_order_stay_on_the_windows():
    """A reader with several requests in flight (qemu-img convert: 2 MiB pieces, each sent by the
    kernel as two requests, eight pieces at once) reaches the server out of order: it is still
    sequential, each window is decoded once, and no read goes block by block past the first."""
    data = random.Random(6).randbytes(12 * WIN)
    disk = Disk(data)
    half = WIN // 8                                         # a request (1 MiB of 8): half of a piece
    rng = random.Random(7)
    halves = [(o, half) for o in range(0, len(data), half)]
    reads = []
    for g in range(0, len(halves), 16):                     # eight pieces in flight, any order
        group = halves[g:g + 16]
        rng.shuffle(group)
        reads += group
    got = stream_reads(disk, len(data), reads)
    assert got == [data[o:o + n] for o, n in reads]
    assert sorted(disk.windows) == [w * WIN for w in range(12)]
    assert len(disk.reads) < 16                             # only before the first pieces met


def test_who_reads_past_the_page_cache(monkeypatch):
    exe = {1: "/usr/bin/qemu-system-x86_64", 2: "/usr/libexec/qemu-kvm", 3: "/usr/bin/qemu-img", 4: "/usr/bin/cp"}

    def readlink(path):
        pid = int(path.split("/")[2])
        if pid not in exe:
            raise FileNotFoundError(path)
        return exe[pid]

    monkeypatch.setattr(rawstream.os, "readlink", readlink)
    assert [rawstream.direct(pid) for pid in (1, 2, 3, 4)] == [False, False, True, True]
    monkeypatch.setattr(rawstream, "DIRECT", False)
    assert not rawstream.direct(4)


def test_short_runs_of_small_reads_stay_on_the_block_path(monkeypatch):
    """A guest reading a few small pieces in a row (a booting day) never waits for a window; a
    run longer than STREAM_BYTES does go to the windows."""
    monkeypatch.setattr(rawstream, "STREAM_BYTES", 32 << 10)
    data = random.Random(8).randbytes(16 * WIN)
    disk = Disk(data)
    rng = random.Random(9)
    bursts = [w * WIN + 8192 * k for k, w in enumerate(rng.sample(range(2, 14), 6))]
    reads = [(b + i * 4096, 4096) for b in bursts for i in range(4)]  # 16 KiB in a row each
    got = stream_reads(disk, len(data), reads)
    assert got == [data[o:o + n] for o, n in reads]
    assert disk.windows == [] and disk.reads == reads
    reads = [(o, 4096) for o in range(WIN, 2 * WIN, 4096)]
    got = stream_reads(disk, len(data), reads)
    assert got == [data[o:o + n] for o, n in reads]
    assert disk.windows[0] == WIN and set(disk.windows) <= {WIN, 2 * WIN}  # its window (and one ahead)
    assert len(disk.reads) == len(bursts) * 4 + 7              # until 32 KiB were read in a row


def test_random_small_reads_never_wait_for_a_window():
    data = random.Random(2).randbytes(8 * WIN)
    disk = Disk(data)
    rng = random.Random(3)
    reads = [(rng.randrange(len(data) // 8192) * 8192, 4096) for _ in range(50)]  # none adjoins another
    got = stream_reads(disk, len(data), reads)
    assert got == [data[o:o + n] for o, n in reads]
    assert disk.windows == [] and disk.reads == reads


def test_a_damaged_block_fails_only_the_reads_that_touch_it():
    data = random.Random(4).randbytes(4 * WIN)
    bad = (2 * WIN + 5000, 2 * WIN + 5001)
    disk = Disk(data, [bad])
    step = 8 << 10
    got = stream_reads(disk, len(data), [(o, step) for o in range(0, len(data), step)])
    for k, o in enumerate(range(0, len(data), step)):
        if o < bad[1] and bad[0] < o + step:
            assert got[k] == errno.EIO
        else:
            assert got[k] == data[o:o + step], o


def test_a_store_image_read_through_windows_in_log_order(tmp_path, monkeypatch):
    """The real reader: windows of an image read in log order equal the image; a damaged record is EIO
    for the request that reads it, and the bytes around it are still right."""
    from foundation.image import reader as reader_mod
    from foundation.store import Store

    monkeypatch.setattr(reader_mod, "LOG_ORDER_MIN", 4)  # these small windows go the log-order way too
    passes = []
    log_order = Store.log_order_plan

    def spy(self, refs):
        passes.append(len(refs))
        return log_order(self, refs)

    monkeypatch.setattr(Store, "log_order_plan", spy)
    path = make_store(tmp_path / "store", mode="hash")
    rng = random.Random(5)
    img = bytearray(rng.randbytes(3 * WIN + 3 * BS))
    img[BS * 7:BS * 9] = bytes(2 * BS)  # null blocks
    img[BS * 40:BS * 41] = img[BS * 3:BS * 4]  # one record, two places
    img += b"tail"
    with open_store(path) as s:
        root = write_image(s, BytesSource(bytes(img)), len(img))
        s.sync()
    step = 12 << 10
    reads = [(o, step) for o in range(0, len(img), step)]
    with open_store(path, writable=False) as s:
        got = stream_reads(_Clipped(ImageReader(s, root), len(img)), len(img), reads)
    assert b"".join(got) == bytes(img)
    assert passes[-4:] == [WIN // BS * 32] * 3 + [4 * 32]  # each window once, in log order
    del passes[:]
    # damage the record of the block at 2 * WIN + BS (random data: stored raw, in write order)
    with open_store(path, writable=False) as s:
        addr = s.address(bytes(ImageReader(s, root).leaf_refs(2 * WIN // BS + 1, 2 * WIN // BS + 2)))
    arena, off = addr >> 32, addr & 0xFFFFFFFF
    with open(tmp_path / "store" / "arenas" / sorted(p.name for p in (tmp_path / "store" / "arenas").iterdir())[arena],
              "r+b") as f:
        f.seek(off + 200)
        f.write(b"\xff\xfe")
    with open_store(path, writable=False) as s:
        got = stream_reads(_Clipped(ImageReader(s, root), len(img)), len(img), reads)
    assert passes.count(WIN // BS * 32) >= 3  # the windows went the log-order way, the damaged one too
    hit = 2 * WIN + BS
    for (o, n), g in zip(reads, got):
        if o < hit + BS and hit < o + n:
            assert g == errno.EIO
        else:
            assert g == bytes(img[o:o + n]), o
