"""The store's commands, as a user runs them: init, stats, verify, rebuild, --help."""

import json
import os
import subprocess
import sys

import pytest

from foundation.cli import main, parser
from foundation.store import Store
from tests.conftest import FIRST_PAYLOAD, arena_files, blocks, damage


def run(*args, env=None):
    e = dict(os.environ)
    e.pop("FOUNDATION_STORE", None)
    e.pop("FOUNDATION_KEY_FILE", None)
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "foundation", *args], capture_output=True, text=True, env=e)


def test_every_subcommand_has_help():
    sub = parser()._subparsers._group_actions[0]
    assert {"init", "stats", "verify", "rebuild"} <= set(sub.choices)
    for name in sub.choices:
        r = run(name, "--help")
        assert r.returncode == 0, (name, r.stderr)
        assert "usage: foundation" in r.stdout


def test_init_stats_verify_rebuild(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    key = tmp_path / "store.key"
    r = run("--store", str(store), "--key-file", str(key), "init", "--arena-size", "256K", "--max-log-size", "64M")
    assert r.returncode == 0, r.stderr
    assert "key file" in r.stdout and os.path.exists(key)
    env = {"FOUNDATION_STORE": str(store), "FOUNDATION_KEY_FILE": str(key)}
    with Store.open(str(store), key_file=str(key), writable=True) as s:
        s.write_blocks(blocks(200, seed=1) + blocks(200, seed=1))
    r = run("stats", "--json", env=env)
    assert r.returncode == 0, r.stderr
    st = json.loads(r.stdout)
    assert st["records"] == 200 and st["dup_blocks"] == 200 and st["encrypted"]
    assert st["dedup_ratio"] == pytest.approx(2.0)
    r = run("verify", env=env)
    assert r.returncode == 0 and "ok: 200 records" in r.stdout
    os.unlink(store / "index")
    r = run("rebuild", env=env)
    assert r.returncode == 0 and "200 records" in r.stdout, r.stderr
    # damage a record: verify names it and fails
    a = arena_files(str(store))[0]
    damage(a, FIRST_PAYLOAD + 5, b"\x00\x01\x02")
    r = run("verify", env=env)
    assert r.returncode == 1
    assert "DAMAGED arena 0 offset 72" in r.stdout


def test_init_refuses_bad_places(tmp_path):
    r = run("--store", str(tmp_path / "missing" / "store"), "init", "--no-encrypt")
    assert r.returncode == 10 and "its parent directory" in r.stderr and "Mount the backup disk" in r.stderr
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "file").write_text("x")
    r = run("init", str(tmp_path / "used"), "--no-encrypt")
    assert r.returncode == 11 and "not empty" in r.stderr
    r = run("stats")
    assert r.returncode == 2 and "no store given" in r.stderr
    (tmp_path / "s").mkdir()
    r = run("init", str(tmp_path / "s"), "--block-size", "3000", "--no-encrypt")
    assert r.returncode != 0 and "power of two" in r.stderr


def test_wrong_key_file_is_named(tmp_path):
    for n in ("a", "b"):
        (tmp_path / n).mkdir()
        assert run("--key-file", str(tmp_path / f"{n}.key"), "init", str(tmp_path / n)).returncode == 0
    r = run("--store", str(tmp_path / "a"), "--key-file", str(tmp_path / "b.key"), "stats")
    assert r.returncode == 13 and "belongs to store" in r.stderr


def test_main_returns_codes(tmp_path, capsys):
    assert main(["--store", str(tmp_path / "nope"), "stats"]) == 10
    assert "not mounted" in capsys.readouterr().err
