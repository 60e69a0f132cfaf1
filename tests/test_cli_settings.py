"""The CLI's settings: the command line, then the environment, then the config file, read once per command."""

import argparse
import os

import pytest
from test_image_support import content, make_store, seeded

import foundation.config
from foundation.cli import main
from foundation.cli.common import ENVIRONMENT, Settings
from foundation.errors import UsageError


def args(**kw):
    base = dict(store=None, key_file=None, config=None)
    return argparse.Namespace(**{**base, **kw})


def test_the_command_line_wins_then_the_environment_then_the_config(tmp_path):
    cfg = tmp_path / "foundation.toml"
    cfg.write_text('store = "/conf/store"\nkey_file = "/conf/key"\nstate_dir = "/conf/state"\n'
                   'libvirt_uri = "test:///default"\n')
    env = {"FOUNDATION_STORE": "/env/store", "FOUNDATION_CONFIG": str(cfg)}
    s = Settings(args(store="/opt/store"), env)
    assert (s.store, s.key_file, s.state_dir) == ("/opt/store", "/conf/key", "/conf/state")
    assert s.clones_dir == "/conf/state/clones" and s.libvirt_uri == "test:///default"
    s = Settings(args(), {**env, "FOUNDATION_STATE_DIR": "/env/state", "FOUNDATION_CLONES_DIR": "/env/clones"})
    assert (s.store, s.state_dir, s.clones_dir) == ("/env/store", "/env/state", "/env/clones")
    assert s.config.path == str(cfg) and s.snapshot_dir == "/snapshot"
    s = Settings(args(), {"FOUNDATION_CONFIG": str(tmp_path / "absent.toml")})
    with pytest.raises(foundation.config.ConfigError, match="absent.toml: no such file"):
        s.store
    s = Settings(args(store="/opt/store"), {"FOUNDATION_CONFIG": str(tmp_path / "absent.toml")})
    assert s.store == "/opt/store"          # a setting given on the command line never reads the config file


def test_no_store_anywhere_is_a_usage_error(tmp_path):
    s = Settings(args(config=str(tmp_path / "empty.toml")), {})
    (tmp_path / "empty.toml").write_text("")
    with pytest.raises(UsageError, match="no store given: pass --store DIR or set FOUNDATION_STORE"):
        s.store


def test_the_cli_reads_the_environment_only_in_common():
    root = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "foundation", "cli")
    readers = [name for name in sorted(os.listdir(root)) if name.endswith(".py")
               and "os.environ" in open(os.path.join(root, name)).read()]
    assert readers == ["common.py", "logs.py"]        # logs: JOURNAL_STREAM says where stderr goes, no setting
    assert set(ENVIRONMENT.values()) >= {"FOUNDATION_STORE", "FOUNDATION_KEY_FILE", "FOUNDATION_CONFIG",
                                         "FOUNDATION_STATE_DIR", "FOUNDATION_PASSPHRASE"}


def test_an_import_with_a_replica_reads_the_config_file_once(tmp_path, monkeypatch, capsys):
    store = make_store(tmp_path / "store")
    share = tmp_path / "share"
    share.mkdir()
    cfg = tmp_path / "foundation.toml"
    cfg.write_text(f'store = "{store}"\nstate_dir = "{tmp_path / "state"}"\n'
                   f'[replicas.nas]\nurl = "file://{share}"\nallow_plaintext = true\n')
    image = tmp_path / "disk.raw"
    image.write_bytes(content(seeded(5), 1 << 20))
    reads = []
    real = foundation.config.load_config
    monkeypatch.setattr(foundation.config, "load_config", lambda path=None: reads.append(path) or real(path))
    monkeypatch.delenv("FOUNDATION_STORE", raising=False)
    monkeypatch.delenv("FOUNDATION_STATE_DIR", raising=False)      # the config file's state_dir then
    assert main(["--config", str(cfg), "import-image", "vm", str(image), "--at", "2024-05-01"]) == 0
    assert reads == [str(cfg)]              # store, key file, replicas and state dir: one read
    assert (share / "manifest").exists() and sorted(os.listdir(tmp_path / "state")) == ["heads.json", "replicas.json"]
    capsys.readouterr()
    assert main(["--config", str(cfg), "list", "vm"]) == 0 and "vm" in capsys.readouterr().out
