"""Reading image files: raw directly, qcow2 (backing chains, compressed clusters) through qemu-nbd."""

import json
import os
import subprocess

import pytest
from test_image_support import BS, content, make_store, open_store, seeded

from foundation.image import BadRanges, ImageReader, ImageUnreadable, load_changed, open_image, write_image
from foundation.image.nbd import _alive


def qemu_img(*args):
    subprocess.run(["qemu-img", *args], check=True, capture_output=True)


def qemu_io(img, cmd, fmt="qcow2"):
    subprocess.run(["qemu-io", "-f", fmt, "-c", cmd, img], check=True, capture_output=True)


@pytest.fixture
def chain(tmp_path):
    """base.qcow2 (compressed) <- top.qcow2 (with writes and zeroed clusters); expect.raw = what top reads as."""
    rng = seeded(41)
    raw = tmp_path / "base.raw"
    raw.write_bytes(content(rng, 3 << 20))
    base = tmp_path / "base.qcow2"
    qemu_img("convert", "-c", "-O", "qcow2", str(raw), str(base))
    top = tmp_path / "top.qcow2"
    qemu_img("create", "-f", "qcow2", "-b", str(base), "-F", "qcow2", str(top), str(4 << 20))
    qemu_io(str(top), "write -P 0xab 100000 70000")
    qemu_io(str(top), "write -z 1048576 131072")
    qemu_io(str(top), f"write -P 0x5c {(4 << 20) - 8192} 8192")
    expect = tmp_path / "expect.raw"
    qemu_img("convert", "-O", "raw", str(top), str(expect))
    info = json.loads(subprocess.run(["qemu-img", "info", "--output=json", str(base)],
                                     capture_output=True, text=True).stdout)
    assert info["format"] == "qcow2"
    map_ = subprocess.run(["qemu-img", "map", "--output=json", str(base)], capture_output=True, text=True).stdout
    assert '"compressed": true' in map_ or "compressed" not in map_  # qemu 7.2 does not print it
    return top, expect.read_bytes()


def test_raw_file_reads_and_holes(tmp_path):
    p = tmp_path / "sparse.raw"
    with open(p, "wb") as f:
        f.truncate(8 << 20)
        f.seek(3 << 20)
        f.write(b"data" * 1024)
    src = open_image(str(p))
    try:
        assert src.format == "raw" and src.size == 8 << 20
        holes = src.holes()
        assert holes and holes[0] == (0, 3 << 20)
        assert src.read(3 << 20, 8) == b"datadata"
        assert src.read((8 << 20) - 4, 100) == bytes(4)  # short at the end
    finally:
        src.close()


def test_raw_reads_around_the_page_cache_give_the_same_bytes(tmp_path):
    """Aligned reads go through O_DIRECT, the rest (unaligned offset, length or buffer) buffered."""
    import mmap
    data = content(seeded(7), (3 << 20) + 1000)  # a size that is no multiple of the alignment
    p = tmp_path / "img.raw"
    p.write_bytes(data)
    src = open_image(str(p))
    try:
        buf = memoryview(mmap.mmap(-1, 4 << 20))
        for off, n, at in ((0, 1 << 20, 0), (4096, 2 << 20, 4096), (3 << 20, 4096, 0), (100, 8192, 0),
                           (8192, 5000, 0), (8192, 8192, 1), ((3 << 20) - 4096, 8192, 0)):
            view = buf[at:at + n]
            got = src.readinto(off, view)
            assert bytes(view[:got]) == data[off:off + n]
        try:
            os.close(os.open(p, os.O_RDONLY | os.O_DIRECT))
            direct = True
        except OSError:  # tmpfs, for one
            direct = False
        assert (src.dfd is not None) == direct  # where the file system takes it, aligned reads used it
    finally:
        src.close()


def test_holes_are_not_read(tmp_path):
    p = tmp_path / "sparse.raw"
    with open(p, "wb") as f:
        f.truncate(64 << 20)
        f.seek(5 << 20)
        f.write(b"x" * 10000)
    src = open_image(str(p))
    reads = []
    orig = src.readinto
    src.readinto = lambda o, view: reads.append((o, len(view))) or orig(o, view)
    path = make_store(tmp_path / "store")
    with open_store(path) as s:
        root = write_image(s, src, src.size)
        assert 0 < sum(n for _, n in reads) <= 1 << 20
        r = ImageReader(s, root)
        assert r.read(5 << 20, 10001) == b"x" * 10000 + b"\0"
    src.close()



def test_holes_within_ranges(tmp_path):
    """holes(within) gives the holes of the whole file clipped to the runs asked about."""
    p = tmp_path / "sparse.raw"
    with open(p, "wb") as f:
        f.truncate((8 << 20) + 1000)  # ends in a hole, inside a block
        for at in (1 << 20, (3 << 20) + 4096, 6 << 20):
            f.seek(at)
            f.write(b"d" * 9000)
    src = open_image(str(p))
    try:
        whole = src.holes()
        for within in ([(0, src.size)], [(0, 4096)], [(1 << 20, 2 << 20), (5 << 20, 16 << 20)],
                       [((3 << 20) + 8192, (3 << 20) + 12288)], [(src.size - 100, src.size + 5000)], []):
            want = [(max(o, s), min(o + n, e) - max(o, s)) for s, e in within for o, n in whole
                    if max(o, s) < min(o + n, e, src.size)]
            assert src.holes(within=within) == want
    finally:
        src.close()


def test_a_later_day_asks_about_the_holes_of_its_changes_only(tmp_path):
    """With --changed, a raw image's holes are looked up inside the changed leaves alone, and the
    tree is the one a lookup over the whole file gives."""
    from foundation.image.source import RawSource

    p = tmp_path / "disk.raw"
    with open(p, "wb") as f:
        f.truncate(32 << 20)
        f.seek(1 << 20)
        f.write(content(seeded(3), 2 << 20))
    path = make_store(tmp_path / "store")
    with open_store(path) as s:
        src = open_image(str(p))
        day0 = write_image(s, src, src.size)
        src.close()
        with open(p, "r+b") as f:  # day 1: bytes written, and a range punched back to a hole
            f.seek(10 << 20)
            f.write(b"n" * 5000)
        os.system(f"fallocate -p -o {(2 << 20)} -l {1 << 20} {p}")
        changed = [(10 << 20, 5000), (2 << 20, 1 << 20), (20 << 20, 4096)]
        roots, asked = [], []
        for within in (True, False):
            src = open_image(str(p))
            src.holes_within = within
            orig = src.holes
            src.holes = lambda within=None, orig=orig: asked.append(within) or orig(within)
            roots.append(write_image(s, src, src.size, prev=day0, changed=changed))
            src.close()
        assert roots[0] == roots[1]
        assert asked[1] is None and sum(e - o for o, e in asked[0]) <= 3 << 20
        r = ImageReader(s, roots[0])
        assert r.read(2 << 20, 1 << 20) == bytes(1 << 20) and r.read(10 << 20, 5000) == b"n" * 5000
        assert isinstance(src, RawSource)

def test_unallocated_qcow2_clusters_are_not_read(tmp_path):
    """A 64 GiB qcow2 with 200 KB written: only the written clusters go over NBD."""
    img = tmp_path / "big.qcow2"
    qemu_img("create", "-f", "qcow2", str(img), "64G")
    qemu_io(str(img), "write -P 0x5a 1048576 200000")
    qemu_io(str(img), f"write -P 0x33 {(64 << 30) - 65536} 65536")
    src = open_image(str(img))
    reads = []
    orig = src.readinto
    src.readinto = lambda o, view: reads.append((o, len(view))) or orig(o, view)
    try:
        with open_store(make_store(tmp_path / "store")) as s:
            root = write_image(s, src, src.size)
            assert 0 < sum(n for _, n in reads) <= 1 << 20
            r = ImageReader(s, root)
            assert r.read(1048576 - 1, 200002) == b"\0" + b"\x5a" * 200000 + b"\0"
            assert r.read((64 << 30) - 65537, 65537) == b"\0" + b"\x33" * 65536
    finally:
        src.close()


@pytest.mark.parametrize("mode", ["hash", "value"])
def test_qcow2_with_backing_chain_and_compressed_clusters(tmp_path, chain, mode):
    top, expect = chain
    src = open_image(str(top))
    try:
        assert src.format == "qcow2" and src.size == len(expect) == 4 << 20
        assert src.read(0, len(expect)) == expect
        path = make_store(tmp_path / "store", mode=mode)
        with open_store(path) as s:
            root = write_image(s, src, src.size)
            assert ImageReader(s, root).read(0, root.size) == expect
            # --changed reads through NBD too
            root2 = write_image(s, src, src.size, prev=root, changed=[(100000, 70000)])
            assert root2 == root
    finally:
        server = src.server
        pid = server.pid
        src.close()
    assert pid is None or not _alive(pid)  # qemu-nbd went away with our connection


def test_unreadable_images_get_clear_errors(tmp_path):
    with pytest.raises(ImageUnreadable, match=r"Cannot read the image .*nope.raw: No such file or directory"):
        open_image(str(tmp_path / "nope.raw"))
    with pytest.raises(ImageUnreadable, match="it is a directory"):
        open_image(str(tmp_path))
    bad = tmp_path / "bad.qcow2"
    qemu_img("create", "-f", "qcow2", str(bad), "1M")
    b = bytearray(bad.read_bytes())
    b[4:8] = (99).to_bytes(4, "big")  # a qcow2 version nobody wrote
    bad.write_bytes(b)
    with pytest.raises(ImageUnreadable, match="bad.qcow2: .*Unsupported qcow2 version 99"):
        open_image(str(bad))
    raw = tmp_path / "plain.raw"
    raw.write_bytes(bytes(BS))
    with pytest.raises(ImageUnreadable, match="plain.raw"):
        open_image(str(raw), "qcow2")
    top = tmp_path / "orphan.qcow2"
    qemu_img("create", "-f", "qcow2", "-b", str(tmp_path / "gone.qcow2"), "-F", "qcow2", "-u", str(top), "1M")
    with pytest.raises(ImageUnreadable, match="orphan.qcow2"):
        open_image(str(top))


def test_one_qemu_img_runner(tmp_path):
    """Every qemu-img call goes through foundation.image.qemuimg.run: its last error line, or its JSON."""
    from foundation.image import qemuimg
    img = tmp_path / "a.qcow2"
    qemuimg.run(["create", "-q", "-f", "qcow2", str(img), "1M"], f"create {img}")
    assert qemuimg.info(str(img))["virtual-size"] == 1 << 20
    with pytest.raises(qemuimg.QemuImgFailed, match=r"qemu-img info .*none.qcow2 failed: .*No such file"):
        qemuimg.info(str(tmp_path / "none.qcow2"))
    with pytest.raises(qemuimg.QemuImgFailed, match="not JSON"):
        qemuimg.run_json(["info", str(img)], f"info {img}")      # (human output, not --output=json)


def test_changed_file_validation(tmp_path):
    def load(text, size=1 << 20):
        p = tmp_path / "ranges.json"
        p.write_text(text)
        return load_changed(str(p), size)

    assert load("[[0, 10], [4096, 4096]]") == [(0, 10), (4096, 4096)]
    assert load("[]") == []
    cases = [
        ("[[0, 10]", r"not valid JSON: .* at line 1 column 9"),
        ('{"a": 1}', "expected a list of \\[offset, length\\] pairs, got dict"),
        ("[[0, 10], [5]]", r"entry 1 is \[5\], not an \[offset, length\] pair of integers"),
        ('[[0, "10"]]', r"entry 0 is \[0, \"10\"\], not an \[offset, length\] pair"),
        ("[[0.5, 10]]", "entry 0 is"),
        ("[[true, 10]]", "entry 0 is"),
        ("[[-1, 10]]", "negative"),
        ("[[1048570, 10]]", r"entry 0 \[1048570, 10\] ends at byte 1048580, beyond the end of the image \(1048576 bytes\)"),
    ]
    for text, msg in cases:
        with pytest.raises(BadRanges, match=msg):
            load(text)
    with pytest.raises(BadRanges, match="cannot read it: No such file"):
        load_changed(str(tmp_path / "missing.json"), 100)
    (tmp_path / "bin.json").write_bytes(b"\xff\xfe")
    with pytest.raises(BadRanges, match="not UTF-8"):
        load_changed(str(tmp_path / "bin.json"), 100)
