"""Bad input is refused before anything is written: names, times, damaged images, init's places."""

import json
import os
import subprocess
from datetime import datetime, timedelta, timezone

import pytest
from test_image_support import BS, make_store, seeded

from foundation.catalog import BadName, BadTime, TimeOutOfRange, check_name, check_time, parse_time
from foundation.cli import main


def cli(capsys, *args):
    capsys.readouterr()
    rc = main([*map(str, args)])
    out, err = capsys.readouterr()
    return rc, out, err


def snapshots(capsys, store):
    rc, out, _ = cli(capsys, "--store", store, "list", "--json")
    assert rc == 0
    return json.loads(out)


def store_files(path):
    """Every file of the store with its bytes: what a refused command must leave as it was. The
    writers' lock file is not the store's content (import-image takes it while qemu-img probes the
    image, and it holds the last writer's pid)."""
    out = {}
    for d, _, names in os.walk(path):
        for n in names:
            if d == str(path) and n == "lock":
                continue
            p = os.path.join(d, n)
            with open(p, "rb") as f:
                out[os.path.relpath(p, path)] = f.read()
    return out


@pytest.mark.parametrize("name", [".", "..", "#5", "-x", " vm", "vm ", "a/b", "a@b", "", "x" * 201, "a\nb", ".hidden"])
def test_bad_names_are_refused(name):
    with pytest.raises(BadName) as e:
        check_name(name)
    assert "not starting with a space, '-', '#' or '.'" in str(e.value)


@pytest.mark.parametrize("name", ["vm", "web-1", "db.example.org", "Win 10", "a#b", "a.b-c_d", "x" * 200, "ü"])
def test_good_names_pass(name):
    assert check_name(name) == name


def test_times_out_of_range_are_refused():
    now = datetime(2026, 11, 25, tzinfo=timezone.utc)
    for text in ("1900-01-01", "1969-12-31T23:59:59Z"):
        with pytest.raises(TimeOutOfRange, match="before 1970-01-01"):
            check_time(parse_time(text), now)
    for text in ("9999-01-01", "2026-11-26T00:00:01Z"):
        with pytest.raises(TimeOutOfRange, match="more than a day after now"):
            check_time(parse_time(text), now)
    assert check_time(now + timedelta(hours=23), now) == now + timedelta(hours=23)
    assert check_time(parse_time("1970-01-01T00:00:00Z"), now).year == 1970
    # what datetime cannot even hold is a bad time, not a traceback
    for text in ("0001-01-01T00:00:00+05:00", "0001-01-01", "9999-12-31T23:59:59-05:00"):
        with pytest.raises(BadTime):
            parse_time(text)


def test_import_refuses_bad_names_and_times_and_writes_nothing(tmp_path, capsys):
    store = make_store(tmp_path / "store")
    img = tmp_path / "disk.raw"
    img.write_bytes(seeded(1).randbytes(64 * BS))
    assert cli(capsys, "--store", store, "import-image", "vm", img, "--at", "2024-05-01")[0] == 0
    before = store_files(store)
    for name, at, msg in [(".", [], "'.' is not a valid snapshot name"),
                          ("..", [], "'..' is not a valid snapshot name"),
                          ("#5", [], "'#5' is not a valid snapshot name"),
                          ("-x", [], "'-x' is not a valid snapshot name"),
                          ("vm", ["--at", "1900-01-01"], "cannot be dated 1900-01-01T00:00:00.000000Z: it is before 1970"),
                          ("vm", ["--at", "9999-01-01"], "more than a day after now")]:
        rc, _, err = cli(capsys, "--store", store, "import-image", *at, "--", name, img)
        assert rc == 31, (name, at, err)
        assert msg in err, err
        assert "Traceback" not in err
    assert store_files(store) == before
    assert len(snapshots(capsys, store)) == 1


def qemu(*args):
    subprocess.run(args, check=True, capture_output=True)


@pytest.mark.parametrize("how", ["truncated", "scrambled", "truncated backing file"])
def test_damaged_qcow2_is_refused_before_a_block_is_stored(tmp_path, capsys, how):
    store = make_store(tmp_path / "store")
    img = tmp_path / "disk.qcow2"
    qemu("qemu-img", "create", "-f", "qcow2", str(img), "8M")
    qemu("qemu-io", "-c", "write -P 0xab 0 4M", str(img))
    target = img
    if how == "truncated backing file":
        top = tmp_path / "top.qcow2"
        qemu("qemu-img", "create", "-f", "qcow2", "-b", str(img), "-F", "qcow2", str(top))
        qemu("qemu-io", "-c", "write -P 0xcd 4M 64k", str(top))
        target = top
    if how == "scrambled":
        with open(img, "r+b") as f:  # the refcount table's first entry
            f.seek(65536)
            f.write(b"\xff" * 8)
    else:
        os.truncate(img, 1 << 20)  # its data clusters now lie past the end: QEMU would read zeros
    before = store_files(store)
    rc, _, err = cli(capsys, "--store", store, "import-image", "vm", target)
    assert rc == 33, err
    assert "Cannot read the image" in err and "qemu-img check" in err and "nothing was archived" in err
    if how == "truncated backing file":
        assert f"in its backing file {img}" in err
    assert store_files(store) == before
    assert snapshots(capsys, store) == []


def test_an_intact_qcow2_with_leaked_clusters_still_imports(tmp_path, capsys):
    store = make_store(tmp_path / "store")
    img = tmp_path / "disk.qcow2"
    qemu("qemu-img", "create", "-f", "qcow2", str(img), "8M")
    qemu("qemu-io", "-c", "write -P 0x11 0 1M", str(img))
    assert cli(capsys, "--store", store, "import-image", "vm", img)[0] == 0
    out = tmp_path / "out.raw"
    assert cli(capsys, "--store", store, "restore", "vm", out)[0] == 0
    assert out.read_bytes()[:1 << 20] == b"\x11" * (1 << 20)


def test_init_makes_the_store_directory_but_never_its_parent(tmp_path, capsys):
    rc, _, err = cli(capsys, "init", tmp_path / "no" / "store", "--no-encrypt")
    assert rc == 10
    assert f"its parent directory {tmp_path / 'no'} does not exist. Mount the backup disk" in err
    assert "foundation init`." not in err.split("Mount")[0]  # not "create it with init" while running init
    assert not (tmp_path / "no").exists()
    rc, out, err = cli(capsys, "init", tmp_path / "store", "--no-encrypt")
    assert rc == 0, err
    assert (tmp_path / "store" / "foundation.json").exists()


def test_init_takes_the_key_file_from_the_config(tmp_path, capsys):
    keys = tmp_path / "keys"
    keys.mkdir()
    conf = tmp_path / "foundation.toml"
    conf.write_text(f'store = "{tmp_path / "store"}"\nkey_file = "{keys / "store.key"}"\n')
    rc, out, err = cli(capsys, "--config", conf, "init")
    assert rc == 0, err
    assert f"key file: {keys / 'store.key'}" in out
    assert (keys / "store.key").exists()
    rc, out, err = cli(capsys, "--config", conf, "stats")
    assert rc == 0, err
    assert "encrypted" in out


def test_a_config_file_that_is_not_utf8_is_named(tmp_path, capsys):
    conf = tmp_path / "foundation.toml"
    conf.write_bytes(b'store = "\xff\xfe"\n')
    rc, _, err = cli(capsys, "--config", conf, "stats")
    assert rc == 31
    assert err.strip() == f"foundation: Config file {conf}: not UTF-8 text (byte 9 cannot be read): save it as UTF-8"


@pytest.mark.parametrize("where", ["store/key", "store/keys/k.key", "link/key"])
def test_a_key_file_inside_the_store_is_refused(tmp_path, capsys, where):
    (tmp_path / "store").mkdir()
    os.symlink(tmp_path / "store", tmp_path / "link")
    key = tmp_path / where
    rc, _, err = cli(capsys, "--key-file", key, "init", tmp_path / "store")
    assert rc == 31, err
    assert f"the key file {key} must not be kept inside the store" in err
    assert os.listdir(tmp_path / "store") == []  # refused before anything was written
