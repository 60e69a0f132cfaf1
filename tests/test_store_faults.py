"""Faults of the store's disk and files meet one line, a documented exit code, and no change on disk.

Issue 17 item 4: a store the user may not write, an edited foundation.json, a
scrambled index, the disk unmounted under a running import, EIO from the
device. Each case runs the commands a user would, asserts the exit status
and the message, and hashes every file of the store before and after.
"""

import errno
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import pytest
from test_cli_images import ROOT, cli, day, write
from test_gc import files, serves
from test_image_support import content, make_store, seeded

from foundation.errors import StoreConfigBad, StoreDiskFailed, StoreReadOnly
from foundation.store import format as F


def two_days(tmp_path, capsys, mode="hash"):
    """A store with two imported days -> (store, {day: bytes}, image path)."""
    store = make_store(tmp_path / "s", mode=mode)
    rng = seeded(3)
    img = bytearray(content(rng, 1 << 20))
    image = tmp_path / "disk.raw"
    history = {}
    for d in (1, 2):
        img[d * 8192:d * 8192 + 4096] = rng.randbytes(4096)
        write(image, img)
        assert cli(capsys, store, "import-image", "vm", image, "--at", day(d))[0] == 0
        history[d] = bytes(img)
    return store, history, image


def one_line(err):
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# ---- a store the user may not write ------------------------------------------------------------

def test_a_read_only_mount_refuses_writers_and_serves_readers(tmp_path, capsys):
    store, history, image = two_days(tmp_path, capsys)
    ro = tmp_path / "ro"
    ro.mkdir()
    if subprocess.run(["mount", "--bind", store, ro], capture_output=True).returncode:
        pytest.skip("bind mounts need root")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", ro], check=True)
        before = files(ro)
        rc, _, err = cli(capsys, ro, "import-image", "vm", image, "--at", day(3))
        assert rc == StoreReadOnly.code
        assert f"Store {ro} cannot be written" in one_line(err) and "Read-only file system" in err
        serves(capsys, str(ro), history)
        rc, out, err = cli(capsys, ro, "verify")
        assert rc == 0 and out.startswith("ok:"), err
        assert files(ro) == before
    finally:
        subprocess.run(["umount", ro])


def test_a_lock_file_the_user_may_not_open_is_one_line(tmp_path, capsys):
    if os.geteuid() != 0:
        pytest.skip("needs root to make a root-owned lock file and run as another user")
    base = tempfile.mkdtemp(prefix="foundation-ro-")
    try:
        os.chmod(base, 0o755)
        store, history, image = two_days(tmp_path, capsys)
        store = shutil.copytree(store, os.path.join(base, "s"))   # its lock file: root's, 0644
        shutil.copy(image, os.path.join(base, "disk.raw"))
        os.chmod(os.path.join(base, "disk.raw"), 0o644)
        before = files(store)
        rc, err = as_nobody(["--store", store, "import-image", "vm", os.path.join(base, "disk.raw"), "--at", day(3)],
                            os.path.join(base, "err"))
        assert rc == StoreReadOnly.code, err
        line = one_line(err)
        assert f"Store {store} cannot be written ({store}/lock: Permission denied)" in line
        assert files(store) == before
    finally:
        shutil.rmtree(base)


def as_nobody(argv, errfile):
    """Run the CLI in a forked child that has become user nobody -> (status, stderr). Forked, not
    started: the interpreter's own files need not be readable by that user."""
    from foundation.cli import main

    with open(errfile, "w"):
        os.chmod(errfile, 0o666)
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            sys.stderr = open(errfile, "a")
            rc = main(argv)
            sys.stderr.flush()
        except BaseException:
            import traceback
            traceback.print_exc()
            sys.stderr.flush()
            rc = 99
        os._exit(rc)
    _, status = os.waitpid(pid, 0)
    with open(errfile) as f:
        return os.waitstatus_to_exitcode(status), f.read()


# ---- an edited foundation.json -------------------------------------------------------------------

def edit(key, value=None, drop=False):
    def change(conf):
        if drop:
            del conf[key]
        else:
            conf[key] = value(conf[key]) if callable(value) else value
    return change


EDITS = {
    "missing key": (edit("block_size", drop=True), "has no 'block_size'"),
    "wrong type": (edit("block_size", "4096"), "has block_size = '4096', which is not an int"),
    "impossible value": (edit("block_size", 1000), "has a mode, block_size or arena_size no store can have"),
    "changed block_size": (edit("block_size", 2048), "was edited after the store was made"),
    "changed arena_size": (edit("arena_size", lambda v: v * 2), "was edited after the store was made"),
    "changed mode": (edit("mode", "value"), "was edited after the store was made"),
    "changed max_log_size": (edit("max_log_size", lambda v: v * 4), "was edited after the store was made"),
    # the record tag is a parameter: HMAC would call every Poly1305-tagged record damaged
    "tag removed": (edit("tag", drop=True), "was edited after the store was made"),
    "tag changed": (edit("tag", "hmac"), "was edited after the store was made"),
    "unknown tag": (edit("tag", "gmac"), "has an unknown record tag: tag = 'gmac', which is not one of "
                                         "'hmac', 'poly1305'"),
}


@pytest.mark.parametrize("case", sorted(EDITS))
def test_an_edited_config_is_named_and_nothing_changes(tmp_path, capsys, case):
    store, _, image = two_days(tmp_path, capsys)
    path = os.path.join(store, F.CONFIG)
    with open(path) as f:
        conf = json.load(f)
    EDITS[case][0](conf)
    with open(path, "w") as f:
        json.dump(conf, f)
    before = files(store)
    for args in (["list"], ["verify"], ["restore", "vm", tmp_path / "o.raw"],
                 ["import-image", "vm", image, "--at", day(3)]):
        rc, _, err = cli(capsys, store, *args)
        assert rc == StoreConfigBad.code, (args, err)
        line = one_line(err)
        assert f"Store config {path} {EDITS[case][1]}" in line and "put back the original file" in line, line
    assert files(store) == before


def test_a_store_made_before_the_config_check_still_catches_a_changed_arena_size(tmp_path, capsys):
    store, history, image = two_days(tmp_path, capsys)
    path = os.path.join(store, F.CONFIG)
    with open(path) as f:
        conf = json.load(f)
    del conf["check"]              # as written before format 1 had it: such a store still opens
    with open(path, "w") as f:
        json.dump(conf, f)
    serves(capsys, store, history)
    conf["arena_size"] *= 2
    with open(path, "w") as f:
        json.dump(conf, f)
    before = files(store)
    rc, _, err = cli(capsys, store, "list")
    assert rc == StoreConfigBad.code
    assert f"says arena_size {conf['arena_size']}, but the store's arenas were made with " \
           f"{conf['arena_size'] // 2}" in one_line(err)
    assert files(store) == before


# ---- a scrambled index ------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["hash", "value"])
def test_a_scrambled_index_is_rebuilt_not_a_traceback(tmp_path, capsys, caplog, mode):
    store, history, image = two_days(tmp_path, capsys, mode)
    assert cli(capsys, store, "rebuild")[0] == 0      # an index that holds every record
    ipath = os.path.join(store, F.INDEX)
    size = os.path.getsize(ipath)
    with open(ipath, "r+b") as f:                      # every bucket claims more entries than it holds
        f.seek(F.INDEX_HEADER_SIZE)
        f.write(b"\xff" * (size - F.INDEX_HEADER_SIZE))
    before = files(store)
    caplog.clear()
    serves(capsys, store, history)                     # readers: an index in memory, nothing written
    assert files(store) == before
    rc, _, err = cli(capsys, store, "import-image", "vm", image, "--at", day(3))
    assert rc == 0, err
    if mode == "hash":     # value mode looks up weak hashes, which may all miss: then nothing to rebuild
        assert any("the index is damaged (index bucket" in r.getMessage() and "rebuilding it" in r.getMessage()
                   for r in caplog.records), caplog.text
    history[3] = history[2]
    serves(capsys, store, history)
    rc, out, _ = cli(capsys, store, "verify")
    assert rc == 0 and out.startswith("ok:")


# ---- EIO from the device --------------------------------------------------------------------------

def failing(real, store):
    """os.pread / os.pwrite, failing with EIO on the store's arena files (a bad range of the disk)."""
    def call(fd, *args):
        try:
            name = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            name = ""
        if name.startswith(os.path.join(store, F.ARENAS)):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real(fd, *args)
    return call


def test_eio_on_read_is_one_line_and_changes_nothing(tmp_path, capsys, monkeypatch):
    store, history, _ = two_days(tmp_path, capsys)
    before = files(store)
    monkeypatch.setattr(os, "pread", failing(os.pread, store))
    rc, _, err = cli(capsys, store, "restore", "vm", tmp_path / "o.raw")
    assert rc == StoreDiskFailed.code
    line = one_line(err)
    assert f"Store {store}: the disk was removed or failed; nothing after the last completed snapshot was kept (" \
        in line and "Input/output error)" in line
    monkeypatch.undo()
    assert files(store) == before
    serves(capsys, store, history)


def test_eio_on_write_is_one_line_and_keeps_every_committed_day(tmp_path, capsys, monkeypatch):
    store, history, image = two_days(tmp_path, capsys)
    write(image, content(seeded(9), 1 << 20))          # fresh blocks: they must be written
    monkeypatch.setattr(os, "pwrite", failing(os.pwrite, store))
    rc, _, err = cli(capsys, store, "import-image", "vm", image, "--at", day(3))
    assert rc == StoreDiskFailed.code
    assert "the disk was removed or failed" in one_line(err)
    monkeypatch.undo()
    serves(capsys, store, history)


# ---- the disk unmounted under a running import ---------------------------------------------------------

def test_a_disk_unmounted_under_an_import_is_one_line(tmp_path, capsys):
    disk, mnt = tmp_path / "disk.img", tmp_path / "mnt"
    mnt.mkdir()
    subprocess.run(["truncate", "-s", "160M", disk], check=True)
    subprocess.run(["mkfs.ext4", "-q", disk], check=True)
    if subprocess.run(["mount", "-o", "loop", disk, mnt], capture_output=True).returncode:
        pytest.skip("loop mounts need root and a loop device")
    store = None
    try:
        store = make_store(mnt / "s")
        rng = seeded(5)
        small = tmp_path / "small.raw"
        write(small, content(rng, 1 << 20))
        assert cli(capsys, store, "import-image", "vm", small, "--at", day(1))[0] == 0
        big = tmp_path / "big.raw"
        write(big, rng.randbytes(96 << 20))
        p = subprocess.Popen([sys.executable, "-m", "foundation", "--store", store, "import-image", "vm", big,
                              "--at", day(2)], cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while len(os.listdir(os.path.join(store, F.ARENAS))) < 8 and time.monotonic() < deadline:
            time.sleep(0.05)                           # the import is writing arenas
        subprocess.run(["umount", "-l", mnt], check=True)
        _, err = p.communicate(timeout=120)
        assert p.returncode == StoreDiskFailed.code, err
        line = one_line(err)
        assert line.startswith(f"foundation: Store {store}: the disk was removed or failed; nothing after the "
                               "last completed snapshot was kept (")
        time.sleep(0.5)                                # the lazy unmount lets go once the import's files closed
        subprocess.run(["mount", "-o", "loop", disk, mnt], check=True)
        with open(small, "rb") as f:
            days = {1: f.read()}
        serves(capsys, store, days)                    # the committed day, byte for byte
        assert cli(capsys, store, "import-image", "vm", small, "--at", day(2))[0] == 0   # the next run goes on
        days[2] = days[1]
        serves(capsys, store, days)
        rc, out, err = cli(capsys, store, "verify")
        assert rc == 0 and out.startswith("ok:"), out + err
    finally:
        subprocess.run(["umount", mnt], capture_output=True)
