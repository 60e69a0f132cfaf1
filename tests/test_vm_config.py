"""The TOML config file: defaults, paths, and a clear error for every mistake."""

import pytest

from foundation.config import ConfigError, load_config, parse_size


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


# ---- the one size grammar (docs/operation.md "Sizes") ----------------------------------------------

@pytest.mark.parametrize("text, n", [
    (4096, 4096), ("4096", 4096), (" 4096 ", 4096), ("0", 0), ("100B", 100), ("100 b", 100),
    ("512K", 512 << 10), ("512k", 512 << 10), ("512KB", 512 << 10), ("512KiB", 512 << 10),
    ("16M", 16 << 20), ("16 MiB", 16 << 20), ("16mb", 16 << 20), ("1.5G", 3 << 29), ("0.5K", 512),
    ("2T", 2 << 40), ("1.25M", 1310720),
])
def test_size_grammar_accepts(text, n):
    assert parse_size(text) == n


@pytest.mark.parametrize("text", [
    "", " ", "M", "1.5", "0.3K", "-1", -1, "1e3", "1,5M", "16 M B", "16MBB", "16Mi", "2P", "1.5.2K",
    "0x10", "16M/s", "sixteen", True, 1.5, None,
])
def test_size_grammar_refuses(text):
    with pytest.raises(ValueError, match="not a size"):
        parse_size(text)


def test_every_size_reader_uses_the_grammar(tmp_path, capsys):
    from foundation.cli import main
    from foundation.replica.config import spec_from_url

    with pytest.raises(SystemExit) as e:
        main(["init", str(tmp_path / "s"), "--arena-size", "1.5"])
    assert e.value.code == 2
    assert "argument --arena-size: not a size: '1.5' (it is not a whole number of bytes)" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()
    with pytest.raises(SystemExit) as e:
        main(["gc", "--target-free", "20Q"])
    assert e.value.code == 2 and "argument --target-free: not a size: '20Q'" in capsys.readouterr().err
    assert spec_from_url("ftp://h/", bandwidth="1.5 MiB/s").bandwidth == 3 << 19
    assert spec_from_url("s3://bucket/p", multipart_threshold="16 MiB").multipart_threshold == 16 << 20
    with pytest.raises(Exception, match=r"multipart_threshold: not a size: '16 Mo'"):
        spec_from_url("s3://bucket/p", multipart_threshold="16 Mo")


def test_live_backing_store_read():
    """The file below a disk's top as libvirt's live XML names it; unsaid (None) whenever it is not a plain file."""
    import xml.etree.ElementTree as ET

    from foundation.vm.domain import _backing

    def disk(inner):
        return ET.fromstring(f"<disk type='file' device='disk'><source file='/v/top.qcow2'/>{inner}</disk>")

    assert _backing(disk("<backingStore type='file' index='1'><format type='qcow2'/>"
                         "<source file='/v/base.qcow2'/><backingStore/></backingStore>")) == "/v/base.qcow2"
    assert _backing(disk("<backingStore/>")) == ""                          # no backing file
    assert _backing(disk("")) is None                                       # not said (inactive XML)
    assert _backing(disk("<backingStore type='network' index='1'><format type='raw'/>"
                         "<source protocol='nbd'><host transport='unix' socket='/s'/></source>"
                         "</backingStore>")) is None                       # not a file: ask the header
