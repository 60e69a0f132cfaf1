"""qcow2.py's maps are the ones qemu-img gives, for every image it reads; it refuses what it does not read, and a layer still written."""

import random
import subprocess

import pytest

from test_image_support import qemu, scattered

from foundation.image import qcow2, qemuimg

MiB = 1 << 20
SIZE = 8 * MiB


def _by_qemu_img(monkeypatch):
    """qemuimg's maps with the direct reader switched off: what qemu-img alone says."""
    def no(*a, **k):
        raise qcow2.Unsupported("switched off")
    monkeypatch.setattr(qcow2, "layer_map", no)
    monkeypatch.setattr(qcow2, "chain_map", no)


def _norm(ext):
    """Extents joined where adjacent and of one kind (qemu-img splits where layers or flags change)."""
    out = []
    for e in ext:
        s, n, *rest = e
        if len(rest) == 3:
            f, off, zero = rest
        else:
            f, (off, zero) = None, rest
        if out:
            ps, pe, pf, poff, pz = out[-1]
            if pe == s and pz == zero and pf == f and (
                    (off is None and poff is None) or (off is not None and poff is not None and poff + pe - ps == off)):
                out[-1] = (ps, s + n, pf, poff, pz)
                continue
        out.append((s, s + n, f, off, zero))
    return out


@pytest.fixture
def images(tmp_path):
    rng = random.Random(11)
    raw = tmp_path / "base.raw"
    with open(raw, "wb") as f:
        scattered(f, SIZE, rng, 20, 200_000)
    p = {"raw": str(raw)}
    for name, opts in (("qcow2", []), ("v2", ["-o", "compat=0.10"]), ("small", ["-o", "cluster_size=4096"]),
                       ("big", ["-o", "cluster_size=2M"]), ("compressed", ["-c"])):
        p[name] = str(tmp_path / f"{name}.qcow2")
        qemu("qemu-img", "convert", "-O", "qcow2", *opts, p["raw"], p[name])
    return p


def _overlay(tmp_path, name, backing, fmt, *writes, opts=(), relative=False):
    top = tmp_path / name
    qemu("qemu-img", "create", "-f", "qcow2", *opts, "-b",
          backing.rsplit("/", 1)[1] if relative else backing, "-F", fmt, str(top))
    cmds = []
    for w in writes:
        cmds += ["-c", w]
    if cmds:
        qemu("qemu-io", "-f", "qcow2", *cmds, str(top))
    return str(top)


WRITES = ("write -P 0x5a 1000k 300k", "write -z 3M 64k", "write -P 0x11 7M 8k", "write -z -u 5M 128k")


@pytest.mark.parametrize("base", ["raw", "qcow2", "v2", "small", "big", "compressed"])
def test_maps_equal_qemu_imgs(images, tmp_path, monkeypatch, base):
    fmt = "raw" if base == "raw" else "qcow2"
    opts = ("-o", "compat=0.10") if base == "v2" else ()
    mid = _overlay(tmp_path, "mid.qcow2", images[base], fmt, "write -P 0x22 2M 1M", "write -z 6M 256k", opts=opts)
    top = _overlay(tmp_path, "top.qcow2", mid, "qcow2", *(WRITES if base != "v2" else WRITES[::2]),
                   relative=True)
    tops = [top, mid] + ([images[base]] if fmt == "qcow2" else [])
    direct = {p: (qcow2.layer_map(p), qcow2.chain_map(p, layers := [])) + (layers,) for p in tops}
    _by_qemu_img(monkeypatch)
    for p in tops:
        layer, chain, layers = direct[p]
        assert _norm(layer) == _norm(qemuimg.layer_map(p))
        want_layers = []
        assert _norm(chain) == _norm(qemuimg.chain_map(p, "qcow2", layers_out=want_layers))
        assert [(x["filename"], x["format"], x["virtual-size"]) for x in layers] == \
               [(x["filename"], x["format"], x["virtual-size"]) for x in want_layers]
        assert sum(n for _, n, *_ in chain) == SIZE
    # the day's writes, whole clusters, zeros included
    zeros = [(3 * MiB, 64 << 10), (5 * MiB, 128 << 10)] if base != "v2" else []
    assert [(s, n) for s, n, _, _ in direct[top][0]] == [(960 << 10, 384 << 10)] + zeros + [(7 * MiB, 64 << 10)]


def test_a_layer_still_written_is_refused(images, tmp_path):
    """As `qemu-img map` without -U: a writer holding QEMU's write lock makes the map fail."""
    top = _overlay(tmp_path, "top.qcow2", images["qcow2"], "qcow2", WRITES[0])
    holder = subprocess.Popen(["qemu-io", "-f", "qcow2", top], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        holder.stdin.write(b"read 0 512\n")
        holder.stdin.flush()
        holder.stdout.readline()
        with pytest.raises(qcow2.Busy):
            qcow2.layer_map(top)
        with pytest.raises(qemuimg.LayerBusy, match=f"Image {top} is still open for writing.*Is another process "
                                                    "using the image") as e:
            qemuimg.layer_map(top)
        assert isinstance(e.value, qemuimg.QemuImgFailed) and e.value.code == 60
        assert qcow2.layer_map(top, lock=False)          # -U: read anyway
        assert qcow2.chain_map(top)                      # the chain's map shares, as qemu-img -U
    finally:
        holder.stdin.close()
        holder.wait(timeout=10)
    # a reader (-U, read-only) does not stop it
    reader = subprocess.Popen(["qemu-io", "-r", "-U", "-f", "qcow2", top], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        reader.stdin.write(b"read 0 512\n")
        reader.stdin.flush()
        reader.stdout.readline()
        assert qcow2.layer_map(top)
    finally:
        reader.stdin.close()
        reader.wait(timeout=10)


@pytest.mark.parametrize("case", ["no backing format", "extended l2", "encrypted", "not qcow2"])
def test_what_it_does_not_read_goes_to_qemu_img(images, tmp_path, monkeypatch, case):
    if case == "no backing format":
        top = _overlay(tmp_path, "top.qcow2", images["qcow2"], "qcow2", WRITES[0])
        with open(top, "r+b") as f:      # the backing format's header extension made an unknown one
            head = f.read(4096)
            f.seek(head.index(bytes.fromhex("e2792aca")))
            f.write(bytes.fromhex("12345678"))
        assert qemuimg.chain_map(top, "qcow2")      # qemu-img probes the format
    elif case == "extended l2":
        top = _overlay(tmp_path, "top.qcow2", images["qcow2"], "qcow2", WRITES[0], opts=("-o", "extended_l2=on"))
    elif case == "encrypted":
        # the header's crypt_method set to LUKS (a real LUKS image: qemu-img times its key derivation
        # when it creates one, and fails on a busy machine)
        top = _overlay(tmp_path, "top.qcow2", images["qcow2"], "qcow2", WRITES[0])
        with open(top, "r+b") as f:
            f.seek(32)
            f.write((2).to_bytes(4, "big"))
    else:
        top = images["raw"]
    with pytest.raises(qcow2.Unsupported):
        qcow2.chain_map(top)
    with pytest.raises(qcow2.Unsupported):
        qcow2.layer_map(top)
    if case == "extended l2":   # qemuimg asks qemu-img, which reads it
        got = qemuimg.layer_map(top)
        _by_qemu_img(monkeypatch)
        assert got == qemuimg.layer_map(top) and got


def test_a_smaller_layer_hides_what_lies_below_its_end(images, tmp_path, monkeypatch):
    """top (8 MiB) over mid (4 MiB) over base (8 MiB): beyond 4 MiB the guest reads zeros, not the base."""
    mid = str(tmp_path / "mid.qcow2")
    qemu("qemu-img", "create", "-f", "qcow2", "-b", images["qcow2"], "-F", "qcow2", mid, "4M")
    top = str(tmp_path / "top.qcow2")
    qemu("qemu-img", "create", "-f", "qcow2", "-b", mid, "-F", "qcow2", top, "8M")
    qemu("qemu-io", "-f", "qcow2", "-c", "write -P 0x33 7M 64k", top)
    got = qcow2.chain_map(top)
    assert sum(n for _, n, *_ in got) == SIZE
    below = [(s, n, f) for s, n, f, _, zero in got if s + n > 4 * MiB and not zero]
    assert below == [(7 * MiB, 64 << 10, top)]
    _by_qemu_img(monkeypatch)
    assert _norm(got) == _norm(qemuimg.chain_map(top, "qcow2"))


def test_extents_read_ahead_are_used_only_while_the_layer_is_unchanged(images, tmp_path, monkeypatch):
    """prefetch(top) reads the maps of the layers below the top ahead (they are frozen while the top
    is written); chain_map uses them only if the file was not written since, and only once."""
    mid = _overlay(tmp_path, "mid.qcow2", images["qcow2"], "qcow2", "write -P 0x22 2M 1M")
    top = _overlay(tmp_path, "top.qcow2", mid, "qcow2", WRITES[0])
    want = qcow2.chain_map(top)
    monkeypatch.setattr(qcow2, "_AHEAD", {})
    qcow2.prefetch(top)
    assert sorted(qcow2._AHEAD) == sorted([mid, images["qcow2"]])     # not the top: it may still be written
    read = []
    real = qcow2.Image.extents
    monkeypatch.setattr(qcow2.Image, "extents", lambda self: read.append(self.path) or real(self))
    assert qcow2.chain_map(top) == want and read == [top] and qcow2._AHEAD == {}
    # a layer written after its map was read ahead is read again
    qcow2.prefetch(top)
    qemu("qemu-io", "-f", "qcow2", "-c", "write -P 0x44 4M 64k", mid)
    read.clear()
    got = qcow2.chain_map(top)
    assert read == [top, mid] and got != want
    assert (4 * MiB, 64 << 10, mid) in [(s, n, f) for s, n, f, _, _ in got]


def test_the_chain_takes_the_top_from_its_locked_map_while_it_is_unchanged(images, tmp_path, monkeypatch):
    """layer_map(top) with the lock, then chain_map(top): the top's tables are read once (a night
    maps overlay(k) both ways); a top written in between, or mapped without the lock, is read again."""
    top = _overlay(tmp_path, "top.qcow2", images["qcow2"], "qcow2", WRITES[0])
    want = qcow2.chain_map(top)
    monkeypatch.setattr(qcow2, "_AHEAD", {})
    read = []
    real = qcow2.Image.extents
    monkeypatch.setattr(qcow2.Image, "extents", lambda self: read.append(self.path) or real(self))
    qcow2.layer_map(top)
    assert qcow2.chain_map(top) == want and read == [top, images["qcow2"]]    # the top by layer_map alone
    read.clear()
    assert qcow2.chain_map(top) == want and read == [top, images["qcow2"]]     # used once only
    qcow2.layer_map(top, lock=False)
    read.clear()
    assert qcow2.chain_map(top) == want and read == [top, images["qcow2"]]
    qcow2.layer_map(top)
    qemu("qemu-io", "-f", "qcow2", "-c", "write -P 0x45 5M 64k", top)
    read.clear()
    got = qcow2.chain_map(top)
    assert read == [top, images["qcow2"]] and (5 * MiB, 64 << 10, top) in [(s, n, f) for s, n, f, _, _ in got]


def test_new_layer_is_whole_or_absent(tmp_path):
    """NewLayer: the overlay appears under its name only whole, with its backing's cluster size and
    extended L2 when that is qcow2; a failed making leaves neither the name nor its .part."""
    base = tmp_path / "base.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-o", "cluster_size=256k,extended_l2=on",
                    str(base), str(SIZE)], check=True)
    new = tmp_path / "base.qcow2.fdn-1.qcow2"
    (tmp_path / ("base.qcow2.fdn-1.qcow2" + qemuimg.PART)).write_bytes(b"cut short")  # a kill's leftover
    qemuimg.NewLayer(str(new), str(base), "qcow2").done()
    info = qemuimg.info(str(new), "qcow2")
    assert info["cluster-size"] == 256 << 10 and info["format-specific"]["data"]["extended-l2"] is True
    assert info["full-backing-filename"] == str(base) and new.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base.qcow2", new.name]
    with pytest.raises(FileExistsError):  # never replaced
        qemuimg.NewLayer(str(new), str(base), "qcow2").done()
    assert qemuimg.info(str(new), "qcow2")["full-backing-filename"] == str(base)
    # a backing qemu-img cannot open as the format named: QemuImgFailed, nothing left behind
    raw = tmp_path / "raw.img"
    raw.write_bytes(bytes(SIZE))
    with pytest.raises(qemuimg.QemuImgFailed, match="create"):
        qemuimg.NewLayer(str(tmp_path / "raw.img.fdn-1.qcow2"), str(raw), "qcow2").done()
    with pytest.raises(FileNotFoundError):  # no backing at all
        qemuimg.NewLayer(str(tmp_path / "gone.fdn-1.qcow2"), str(tmp_path / "gone"), "raw")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base.qcow2", new.name, "raw.img"]
