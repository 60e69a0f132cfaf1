"""foundation.warmup names the files a command reads first, and never gets in a command's way."""

import os
import subprocess
import sys

import pytest

from foundation import warmup
from foundation.store import format as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_store_file_names_are_the_stores():
    # warmup cannot import the store (it starts before it loads): its copies of the names must agree
    assert set(warmup.STORE_FILES) == {F.CONFIG, *F.HEADS, F.COUNTERS, F.DAMAGED, F.BLOOM_STATE}
    assert (warmup.INDEX_FILE, warmup.INDEX_HEADER) == (F.INDEX, F.INDEX_HEADER_SIZE)
    assert (warmup.BLOOM_FILE, warmup.ARENAS) == (F.BLOOM, F.ARENAS)


def test_import_image_asks_for_its_store_and_its_files(tmp_path):
    store = tmp_path / "s"
    (store / "arenas").mkdir(parents=True)
    for n in (0, 1, 2):
        (store / "arenas" / F.arena_name(n)).write_bytes(b"x")
    changed = tmp_path / "c.json"
    changed.write_text("[]")
    argv = ["--store", str(store), "--key-file", "/k", "import-image", "vm", "/img.raw", "--changed", str(changed)]
    files = dict(warmup._files(argv, {}))
    assert files[str(store / F.CONFIG)] == 0
    assert files[str(store / F.INDEX)] == F.INDEX_HEADER_SIZE  # its header only
    assert files[str(store / F.BLOOM)] < 0 and str(store / "arenas" / F.arena_name(2)) in files
    assert str(store / "arenas" / F.arena_name(1)) not in files  # the newest arena only
    assert files["/k"] == 0
    assert files["/img.raw"] == -warmup.PROBE and files[str(changed)] == -warmup.PROBE
    assert "import-image" not in files and str(store) not in files  # no option value taken for a file


def test_a_reader_does_not_ask_for_the_bloom_filter(tmp_path):
    files = dict(warmup._files(["list"], {"FOUNDATION_STORE": str(tmp_path)}))
    assert str(tmp_path / F.CONFIG) in files
    assert str(tmp_path / F.BLOOM) not in files


def test_module_files_cover_the_command():
    # every module of ours that import-image loads is asked for, and most standard ones exist where named
    code = ("import sys, foundation.cli.import_image, foundation.store.store; "
            "print('\\n'.join(m.__cached__ for m in list(sys.modules.values()) "
            "if getattr(m, '__cached__', None) and m.__name__.startswith('foundation')))")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                       env={**os.environ, "PYTHONPATH": ROOT, "PYTHONDONTWRITEBYTECODE": ""})
    asked = set(warmup._modules("import-image"))
    loaded = {os.path.realpath(c) for c in p.stdout.split()}
    ours = {os.path.realpath(a) for a in asked if os.sep + "foundation" + os.sep in a}
    missing = {c for c in loaded if os.path.exists(c)} - ours
    assert not missing, missing
    std = [a for a in asked if a.startswith(os.path.dirname(os.__file__))]
    assert sum(os.path.exists(a) for a in std) >= 0.8 * len(std)


def test_a_night_imports_neither_dataclasses_nor_inspect():
    # what `archive` loads (its listings' reader included) stays off the modules that cost a start
    # ~10 ms (foundation/fields.py); the records keep a dataclass's equality and repr
    code = ("import sys, foundation.cli, foundation.cli.archive, foundation.cli.common, foundation.cli.find, "
            "foundation.snapshotfs.filesindex, foundation.vm.archiver, foundation.store.store; "
            "print(sorted({'dataclasses', 'inspect', 'ast', 'dis'} & set(sys.modules)))")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                       env={**os.environ, "PYTHONPATH": ROOT})
    assert p.stdout.strip() == "[]"
    from foundation.catalog import DiskEntry, Snapshot
    from foundation.config import Config
    from foundation.image import Root
    from foundation.store import format as F

    h = F.Head(3, 100, 7, F.ZERO_CHAIN, 9)
    assert h == F.Head(**vars(h)) and h != F.Head(3, 100, 7, F.ZERO_CHAIN, 10)
    assert repr(h).startswith("Head(arena=3, end=100, count=7, chain=b'")
    assert F.Trailer(1, 2, b"a", b"c").sealed == b"a" and F.Trailer(1, 2, b"a", b"c", 1, b"s").sealed == b"s"
    r = Root(b"r", 4096, 0)
    assert {r: 1}[Root(b"r", 4096, 0)] == 1 and Root.from_json(r.to_json()) == r
    s = Snapshot(1, "vm", "u", None, {"vda": DiskEntry(r, 4096)})
    assert s == Snapshot(1, "vm", "u", None, {"vda": DiskEntry(r, 4096)}) and s != Snapshot(2, "vm", "u", None)
    assert Config(store="/s").store == "/s" and Config().exclude == [] and Config().exclude is not Config().exclude
    with pytest.raises(TypeError, match="no setting 'stroe'"):
        Config(stroe="/s")


def test_nothing_fails_a_command(tmp_path):
    warmup._ask([(str(tmp_path / "missing"), 0), (str(tmp_path), -warmup.PROBE), ("", 0)])
    assert warmup._files([], {}) and warmup._files(["--store"], {}) is not None
    assert warmup._command(["--store", "s", "-v", "archive"]) == 3
    assert warmup._command(["--version"]) is None


def test_the_store_of_the_config_file(tmp_path):
    from foundation import config

    assert (warmup.CONFIG, warmup.CONFIG_ENV) == (config.DEFAULT_PATH, config.ENV)
    conf = tmp_path / "f.toml"
    conf.write_text('# nightly\nkey_file = "/k"\nstore = "/mnt/backup/s"\n\n[replicas.x]\nstore = "/no"\n')
    assert warmup._configured(str(conf), "store") == "/mnt/backup/s"
    files = dict(warmup._files(["archive"], {"FOUNDATION_CONFIG": str(conf)}))
    assert "/mnt/backup/s/" + F.CONFIG in files and "/mnt/backup/s/" + F.BLOOM in files
    conf.write_text('[vms.web]\nstore = "/no"\n')
    assert warmup._configured(str(conf), "store") is None
    assert warmup._configured(str(tmp_path / "missing.toml"), "store") is None


def test_switched_off(monkeypatch):
    monkeypatch.setattr(warmup, "_started", False)
    started = []
    monkeypatch.setattr(warmup, "_files", lambda argv, env: started.append(argv) or [])
    warmup.start(["list"], {warmup.SWITCH: "0"})
    assert not started and not warmup._started


def test_archive_asks_for_the_archiver_libvirt_and_the_summaries(tmp_path, monkeypatch):
    store = tmp_path / "s"
    (store / F.SUMMARIES).mkdir(parents=True)
    for n in (0, 1):
        (store / F.SUMMARIES / F.summary_name(n)).write_bytes(b"x" * 1000)
    files = dict(warmup._files(["--store", str(store), "archive"], {}))
    assert all(files[str(store / F.SUMMARIES / F.summary_name(n))] == 0 for n in (0, 1))
    import importlib.util

    import foundation.vm.archiver as archiver
    pyc = importlib.util.cache_from_source(archiver.__file__)
    assert pyc in files or not os.path.exists(pyc)  # (none is written under PYTHONDONTWRITEBYTECODE)
    assert any(os.path.basename(f).startswith("libvirtmod") for f in files)
    # the program that makes the night's new overlays, from PATH
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / warmup.VM_PROGRAM).write_bytes(b"\x7fELF")
    env = {"PATH": f"{tmp_path / 'nowhere'}:{tmp_path / 'bin'}"}
    assert str(tmp_path / "bin" / warmup.VM_PROGRAM) in dict(warmup._files(["archive"], env))
    assert not [f for f in dict(warmup._files(["import-image"], env)) if warmup.VM_PROGRAM in f]
    # an import-image does not load the archiver; a night of a big store asks for no summary
    assert not any(os.sep.join(("foundation", "vm", "")) in f for f in dict(warmup._files(["import-image"], {})))
    monkeypatch.setattr(warmup, "SUMMARIES_MAX", 1500)
    assert not [f for f in dict(warmup._files(["--store", str(store), "archive"], {})) if F.SUMMARIES in f]
    assert warmup.SUMMARIES == F.SUMMARIES


def test_archive_asks_first_for_the_libraries_a_run_learnt(tmp_path):
    from foundation import config
    from foundation.cli.common import ENVIRONMENT

    assert (warmup.STATE_DIR, warmup.STATE_ENV) == (config.Config().state_dir, ENVIRONMENT["state_dir"])
    state, store = tmp_path / "state", tmp_path / "s"
    state.mkdir()
    (state / warmup.LIBS).write_text("/usr/lib/libone.so.1\n/usr/lib/libtwo.so.2\n")
    conf = tmp_path / "f.toml"
    conf.write_text(f'store = "{store}"\nstate_dir = "{state}"\n')
    names = [p for p, _ in warmup._files(["archive"], {warmup.CONFIG_ENV: str(conf)})]
    at = names.index("/usr/lib/libone.so.1")
    assert names[at + 1] == "/usr/lib/libtwo.so.2" and at < names.index(str(store / F.CONFIG))
    assert all(p.endswith(".pyc") or ".so" in p for p in names[:at])  # right after the modules
    # --state-dir and the environment come before the config; only `archive` loads libvirt
    other = tmp_path / "other"
    other.mkdir()
    (other / warmup.LIBS).write_text("/usr/lib/libthree.so\n")
    for argv, env in ((["archive", "--state-dir", str(other)], {warmup.CONFIG_ENV: str(conf)}),
                      (["archive"], {warmup.CONFIG_ENV: str(conf), warmup.STATE_ENV: str(other)})):
        got = dict(warmup._files(argv, env))
        assert "/usr/lib/libthree.so" in got and "/usr/lib/libone.so.1" not in got
    assert "/usr/lib/libone.so.1" not in dict(warmup._files(["import-image"], {warmup.CONFIG_ENV: str(conf)}))


def test_a_run_learns_the_libraries_an_import_mapped(tmp_path):
    """learn() writes what was mapped between mapped() and it (here a standard extension module's
    shared object), rewrites the list only when that changes, and never writes an empty one."""
    code = ("import sys; from foundation import warmup; b = warmup.mapped(); import _decimal; "
            "warmup.learn(sys.argv[1], b); print(_decimal.__file__)")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, capture_output=True,
                         text=True, check=True, env={**os.environ, "PYTHONPATH": ROOT}).stdout.strip()
    path = tmp_path / warmup.LIBS
    learnt = path.read_text().split()
    assert os.path.realpath(out) in {os.path.realpath(p) for p in learnt}
    assert all(os.path.isfile(p) and os.path.getsize(p) <= warmup.LIBS_MAX for p in learnt)
    before = path.stat().st_mtime_ns
    os.utime(path, ns=(before - 10**9, before - 10**9))
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, check=True,
                   env={**os.environ, "PYTHONPATH": ROOT}, capture_output=True)
    assert path.stat().st_mtime_ns == before - 10**9 and path.read_text().split() == learnt  # unchanged
    now = warmup.mapped()
    warmup.learn(str(tmp_path), now)  # nothing new mapped: the list stays
    assert path.read_text().split() == learnt
    warmup.learn(str(tmp_path / "missing" / "dir"), set())  # an unwritable place: no error
    assert warmup.mapped() and all(p.startswith("/") for p in warmup.mapped())


def test_an_archive_notes_what_it_mapped_at_its_start(monkeypatch, tmp_path):
    for argv, noted in ((["list"], False), (["--config", "/c", "archive"], True)):
        monkeypatch.setattr(warmup, "_started", False)
        monkeypatch.setattr(warmup, "_at_start", None)
        monkeypatch.setattr(warmup, "_files", lambda argv, env: [])
        warmup.start(argv, {})
        assert (warmup._at_start is not None) == noted
    one = next(p for p in sorted(warmup.mapped()) if os.path.getsize(p) <= warmup.LIBS_MAX)
    monkeypatch.setattr(warmup, "_at_start", warmup.mapped() - {one})
    warmup.learn(str(tmp_path))  # by default: what was mapped since the start
    assert (tmp_path / warmup.LIBS).read_text().split() == [one]
