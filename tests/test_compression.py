"""The store's `compression` setting (docs/format.md §3): the writers' zstd level, chosen at init."""

import json
import os
import subprocess
import sys

import pytest

from conftest import BS, arena_files, blocks
from foundation import native
from foundation.errors import BadInput, StoreConfigBad
from foundation.store import Store, Tuning
from foundation.store import format as F
from foundation.store import layout as L


def text_blocks(n):
    """Blocks that compress, and compress better at a higher level (long repeats, some noise)."""
    return blocks(n, seed=7, compressible=1.0)


def log_bytes(path):
    return sum(os.path.getsize(a) for a in arena_files(path))


def records(path):
    """(codec, stored length) of every data record in the store's arenas."""
    out = []
    for a in arena_files(path):
        with open(a, "rb") as f:
            buf = f.read()
        off = F.ARENA_HEADER_SIZE
        while off + L.HEADER_SIZE <= len(buf) and L.is_record(buf, off):
            if L.btype(buf, off) == F.DATA:
                out.append((buf[off + L.H_CODEC], L.stored(buf, off)))
            off += L.HEADER_SIZE + L.stored(buf, off)
    return out


def conf_of(path):
    with open(os.path.join(path, F.CONFIG)) as f:
        return json.load(f)


@pytest.mark.parametrize("encrypt", [False, True])
def test_the_setting_is_the_level_records_are_written_at(make_store, encrypt):
    data = text_blocks(64)
    sizes = {}
    for setting in ("none", "zstd:1", "zstd:19"):
        op = make_store(encrypt=encrypt, compression=setting, run=1)  # records of one block each
        assert conf_of(op.path)["compression"] == setting
        with op() as s:
            refs = s.write_blocks(data)
        with op(writable=False) as s:
            assert b"".join(s.read_blocks(refs)) == data
        recs = records(op.path)
        assert len(recs) == 64
        if setting == "none":
            assert recs == [(0, BS)] * 64
        else:
            assert {c for c, _ in recs} == {1}
        sizes[setting] = sum(n for _, n in recs)
    # the same blocks: level 19 stores fewer bytes than level 1, which stores fewer than none
    assert sizes["zstd:19"] < sizes["zstd:1"] < sizes["none"] == 64 * BS


def test_a_store_without_the_setting_writes_at_level_1_and_tuning_overrides(make_store):
    op = make_store()
    assert "compression" not in conf_of(op.path)          # every store made before the setting
    with op() as s:
        assert s.codec.zlevel == 1
    with op(tuning=Tuning(zlevel=0)) as s:
        assert s.codec.zlevel == 0
        s.write_blocks(text_blocks(8))
    assert {c for c, _ in records(op.path)} == {0}
    op6 = make_store(compression="zstd:6")
    with op6() as s:
        assert s.codec.zlevel == 6


def test_an_edited_setting_is_taken_and_a_bad_one_refused(make_store):
    op = make_store(compression="zstd:3")
    with op() as s:
        refs = s.write_blocks(text_blocks(16))
    # a policy, outside `check`: changing it is allowed and old records still read
    conf = conf_of(op.path)
    conf["compression"] = "none"
    with open(os.path.join(op.path, F.CONFIG), "w") as f:
        json.dump(conf, f)
    with op() as s:
        assert s.codec.zlevel == 0
        assert b"".join(s.read_blocks(refs)) == text_blocks(16)
    for bad in ("zstd:99", "lz4", 3):
        conf["compression"] = bad
        with open(os.path.join(op.path, F.CONFIG), "w") as f:
            json.dump(conf, f)
        with pytest.raises(StoreConfigBad) as e:
            op()
        assert "compression" in str(e.value) and str(bad) in str(e.value)
        assert e.value.code == 25


def test_create_refuses_a_bad_setting(tmp_path):
    (tmp_path / "s").mkdir()
    with pytest.raises(BadInput, match=r"compression 'zstd:0' is not"):
        Store.create(str(tmp_path / "s"), encrypt=False, compression="zstd:0")
    assert os.listdir(tmp_path / "s") == []


def test_init_option(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FOUNDATION_STORE")}
    store = tmp_path / "store"

    def init(*extra):
        return subprocess.run([sys.executable, "-m", "foundation", "init", str(store), "--no-encrypt",
                               "--arena-size", "256K", "--max-log-size", "64M", *extra],
                              capture_output=True, text=True, env=env)
    r = init("--compression", "gzip")
    assert r.returncode == BadInput.code and "compression 'gzip' is not" in r.stderr
    assert "Traceback" not in r.stderr
    r = init("--compression", "zstd:5")
    assert r.returncode == 0, r.stderr
    assert conf_of(str(store))["compression"] == "zstd:5"
    with Store.open(str(store), writable=True) as s:
        assert s.codec.zlevel == 5


def test_both_backends_read_what_either_writes_at_the_store_levels():
    """What a store of any setting holds, the C core and the reference decode alike (byte for byte)."""
    if native.native_impl is None:
        pytest.skip("the C core is not built")
    impls = (native.native_impl, native.reference_impl)
    data = text_blocks(8) + os.urandom(2 * BS)
    for level in (1, 3, 6, -5):
        for w in impls:
            c = w.Codec(bytes(32), bytes(range(32)), level)
            recs, offs = w.pack(c, 5, bytes(16), 72, F.DATA, data, BS, bytes(32 * 10))
            for r in impls:
                rc = r.Codec(bytes(32), bytes(range(32)), level)
                got = r.unpack_many(rc, 5, bytes(16), recs, 72, offs)
                assert b"".join(g[2] for g in got) == data


@pytest.mark.parametrize("encrypt", [False, True])
def test_a_damaged_record_of_a_high_level_fails_loudly(make_store, encrypt):
    """A flipped byte in a level-19 payload: the read names the record, never returns other bytes."""
    from foundation.errors import DataCorrupt
    op = make_store(encrypt=encrypt, compression="zstd:19", run=1)
    data = text_blocks(4)
    with op() as s:
        refs = s.write_blocks(data)
    arena = arena_files(op.path)[0]
    with open(arena, "rb") as f:
        buf = f.read()
    off = F.ARENA_HEADER_SIZE
    assert buf[off + L.H_CODEC] == 1 and L.btype(buf, off) == F.DATA
    with open(arena, "r+b") as f:
        f.seek(off + L.HEADER_SIZE + 5)
        f.write(bytes([buf[off + L.HEADER_SIZE + 5] ^ 0x40]))
    with op(writable=False) as s:
        with pytest.raises(DataCorrupt, match=f"arena 0 offset {off}: .* damaged record"):
            s.read_blocks(refs[:s.ref_size])
