"""SnapshotSource reads a frozen chain byte for byte as QEMU does: directly where QEMU places the bytes, else over NBD."""

import concurrent.futures
import mmap
import os
import pathlib
import random
import shutil
import subprocess
import tempfile

import pytest

from test_image_support import qemu, scattered

from foundation.image import qemuimg
from foundation.vm.source import SnapshotSource

pytestmark = pytest.mark.skipif(not shutil.which("qemu-img") or not shutil.which("qemu-nbd"),
                                reason="needs qemu-img and qemu-nbd (qemu-utils)")
MiB = 1 << 20
SIZE = 8 * MiB


@pytest.fixture
def images(tmp_path):
    """A raw disk of scattered random and text data, its qcow2 and compressed qcow2, and overlays on each."""
    rng = random.Random(5)
    raw = tmp_path / "base.raw"
    with open(raw, "wb") as f:
        scattered(f, SIZE, rng, 24, 300_000)
        f.seek(5 * MiB)
        f.write(b"a text-like extent " * 9000)
    p = {"raw": str(raw), "qcow2": str(tmp_path / "base.qcow2"), "compressed": str(tmp_path / "c.qcow2")}
    qemu("qemu-img", "convert", "-O", "qcow2", p["raw"], p["qcow2"])
    qemu("qemu-img", "convert", "-c", "-O", "qcow2", p["raw"], p["compressed"])
    for kind, fmt in (("raw", "raw"), ("qcow2", "qcow2"), ("compressed", "qcow2")):
        top = str(tmp_path / f"{kind}.fdn-1.qcow2")
        qemu("qemu-img", "create", "-f", "qcow2", "-b", p[kind], "-F", fmt, top)
        qemu("qemu-io", "-f", "qcow2", "-c", "write -P 0x5a 1000k 300k", "-c", "write -z 3M 64k", top)
        p[f"{kind}-overlay"] = top
    return p


def _expected(path, fmt, tmp_path):
    out = tmp_path / "expected.raw"
    qemu("qemu-img", "convert", "-f", fmt, "-O", "raw", path, str(out))
    data = out.read_bytes()
    assert len(data) == SIZE
    return data


@pytest.mark.parametrize("top, base, direct", [
    ("qcow2", "qcow2", True), ("compressed", "compressed", False), ("raw", "raw", True),
    ("qcow2-overlay", "qcow2", True), ("raw-overlay", "raw", True), ("compressed-overlay", "compressed", False)])
def test_reads_the_chain_as_qemu_does(images, tmp_path, top, base, direct):
    top_fmt = "raw" if top == "raw" else "qcow2"
    base_fmt = "raw" if base == "raw" else "qcow2"
    want = _expected(images[top], top_fmt, tmp_path)
    with SnapshotSource(images[top], top_fmt, images[base], base_fmt, SIZE) as src:
        got = bytearray(SIZE)
        view = memoryview(got)
        for off in range(0, SIZE, 3 * MiB // 2):   # reads that straddle clusters and extents
            n = min(3 * MiB // 2, SIZE - off)
            assert src.readinto(off, view[off:off + n]) == n
        assert got == want
        assert src.read(12345, 3 * MiB) == want[12345:12345 + 3 * MiB]
        assert src.read(SIZE - 100, 4096) == want[-100:]
        for off, n in src.holes():
            assert want[off:off + n] == bytes(n)
        if top != base:
            assert src.changed == [(960 << 10, 384 << 10), (3 * MiB, 64 << 10)]   # whole 64 KiB clusters
        else:
            assert src.changed is None
        # qemu-nbd is started only for what QEMU alone decodes (compressed clusters)
        assert (src._nbd is None) == direct
        # and only a chain read straight from its files takes two reads at once (its one NBD
        # connection does not), as write_image then asks: each half of a batch in a thread
        assert src.parallel_reads == direct
    if direct:
        with SnapshotSource(images[top], top_fmt, images[base], base_fmt, SIZE) as src:
            assert src.parallel_reads
            got = bytearray(SIZE)
            view = memoryview(got)
            step = 3 * MiB // 4
            with concurrent.futures.ThreadPoolExecutor(2) as pool:
                done = list(pool.map(lambda off: src.readinto(off, view[off:off + min(step, SIZE - off)]),
                                     range(0, SIZE, step)))
            assert got == want and sum(done) == SIZE
            assert len(src._files) == len({e[2] for e in src._ext if e[2]} | ({src.base} if src.base_raw else set()))


def test_an_overlay_still_written_is_refused(images):
    """The day's layer is mapped without -U: a writer holding it makes the read fail, not archive a moving disk."""
    top = images["qcow2-overlay"]
    holder = subprocess.Popen(["qemu-io", "-f", "qcow2", top], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        holder.stdin.write(b"read 0 512\n")
        holder.stdin.flush()
        holder.stdout.readline()
        with pytest.raises(qemuimg.QemuImgFailed, match="Is another process using the image"):
            SnapshotSource(top, "qcow2", images["qcow2"], "qcow2", SIZE)
    finally:
        holder.stdin.close()
        holder.wait(timeout=10)


@pytest.mark.parametrize("top", ["qcow2", "compressed", "raw", "qcow2-overlay", "raw-overlay", "compressed-overlay"])
def test_size_learnt_from_the_map(images, top):
    """Without a size, the source takes the disk's virtual size from the chain's `info` it runs anyway
    (a raw top: from `qemu-img info`): the same as `qemu-img info` says."""
    fmt = "raw" if top == "raw" else "qcow2"
    base = top.replace("-overlay", "")
    with SnapshotSource(images[top], fmt, images[base], "raw" if base == "raw" else "qcow2") as src:
        assert src.size == qemuimg.info(images[top], fmt)["virtual-size"] == SIZE


def _resident(path):
    """Bytes of the file in the page cache (fincore)."""
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--raw", "--output", "RES", path],
                         capture_output=True, text=True, check=True).stdout
    return int(out.split()[0])


def _evict(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _on_a_disk():
    """A directory on a disk's file system: tmp_path may be tmpfs, whose files live in the page
    cache (nothing there is read around it); /var/tmp, else the checkout's own directory."""
    for d in ("/var/tmp", os.path.dirname(os.path.abspath(__file__))):
        fs = subprocess.run(["stat", "-f", "-c", "%T", d], capture_output=True, text=True).stdout.strip()
        if fs not in ("tmpfs", "ramfs"):
            return d
    raise AssertionError("neither /var/tmp nor the checkout lies on a disk: the test needs a file outside "
                         "the page cache")


def test_a_shared_overlay_is_read_through_the_page_cache(images):
    """A night's overlay(k), which QEMU's merge reads through the page cache at the same time, is read
    through it too (one read from the disk serves both); otherwise, and the base always, around it."""
    with tempfile.TemporaryDirectory(dir=_on_a_disk()) as d:
        base, top = os.path.join(d, "base.qcow2"), os.path.join(d, "base.qcow2.fdn-1.qcow2")
        shutil.copyfile(images["qcow2"], base)
        qemu("qemu-img", "create", "-f", "qcow2", "-b", base, "-F", "qcow2", top)
        qemu("qemu-io", "-f", "qcow2", "-c", "write -P 0x5a 1000k 300k", "-c", "write -z 3M 64k", top)
        want = _expected(top, "qcow2", pathlib.Path(d))
        resident = {}
        for shared in (False, True):
            _evict(top)
            _evict(base)
            buf = mmap.mmap(-1, SIZE)   # page-aligned, as the write path's buffers (O_DIRECT needs it)
            with SnapshotSource(top, "qcow2", base, "qcow2", SIZE, shared=shared) as src:
                assert src.readinto(0, memoryview(buf)) == SIZE and buf[:] == want
                resident[shared] = (_resident(top), _resident(base))
    # the overlay's 384 KiB of data clusters: in the cache only when shared; the base's never
    assert resident[True][0] >= resident[False][0] + (384 << 10)
    assert resident[True][1] == resident[False][1] < (1 * MiB)
