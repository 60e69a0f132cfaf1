"""The TOML config file: defaults, paths, and a clear error for every mistake."""

import pytest

from foundation.config import ConfigError, load_config


def test_defaults_when_the_default_file_is_missing(monkeypatch, tmp_path):
    monkeypatch.delenv("FOUNDATION_CONFIG", raising=False)
    monkeypatch.setattr("foundation.config.DEFAULT_PATH", str(tmp_path / "absent.toml"))
    c = load_config()
    assert (c.path, c.store, c.key_file, c.libvirt_uri, c.vms, c.exclude, c.state_dir, c.quiesce) == \
        (None, None, None, "qemu:///system", "all", [], "/var/lib/foundation", "auto")


def test_values_and_relative_paths(tmp_path):
    f = tmp_path / "foundation.toml"
    f.write_text('store = "/mnt/backup/fdn"\nkey_file = "keys/k.key"\nvms = ["a", "b"]\n'
                 'exclude = ["c"]\nlibvirt_uri = "qemu+ssh://h/system"\nquiesce = false\n'
                 '[replica]\nurl = "s3://x"\n')
    c = load_config(str(f))
    assert c.store == "/mnt/backup/fdn" and c.key_file == str(tmp_path / "keys/k.key")
    assert c.vms == ["a", "b"] and c.exclude == ["c"] and c.quiesce == "never"
    assert c.libvirt_uri == "qemu+ssh://h/system" and c.section("replica") == {"url": "s3://x"}
    assert c.section("absent") == {}


@pytest.mark.parametrize("text, mode", [("true", "auto"), ("false", "never"), ('"auto"', "auto"),
                                        ('"always"', "always"), ('"never"', "never")])
def test_quiesce_modes(tmp_path, text, mode):
    f = tmp_path / "q.toml"
    f.write_text(f"quiesce = {text}\n")
    assert load_config(str(f)).quiesce == mode


def test_env_names_the_file(monkeypatch, tmp_path):
    f = tmp_path / "x.toml"
    f.write_text('store = "/s"\n')
    monkeypatch.setenv("FOUNDATION_CONFIG", str(f))
    assert load_config().store == "/s"


@pytest.mark.parametrize("text, msg", [
    ('stroe = "/x"\n', "unknown setting 'stroe'"),
    ("store = 3\n", "store must be a str"),
    ('vms = "some"\n', 'vms must be "all" or a list of VM names'),
    ("vms = []\n", 'vms must be "all" or a list'),
    ('exclude = "a"\n', "exclude must be a list"),
    ('quiesce = "yes"\n', 'quiesce must be "auto", "always" or "never" (or true/false), not \'yes\''),
    ("quiesce = 1\n", 'quiesce must be "auto"'),
    ("store = \n", "not valid TOML"),
])
def test_mistakes_are_named(tmp_path, text, msg):
    f = tmp_path / "bad.toml"
    f.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_config(str(f))
    assert msg in str(e.value) and str(f) in str(e.value)


def test_named_file_must_exist(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        load_config(str(tmp_path / "nope.toml"))
