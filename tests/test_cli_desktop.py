"""The command as a desktop user meets it: --version, the install check, --json, logs, completion, man page."""

import datetime as dt
import json
import os
import shutil
import subprocess
import sys

import pytest

import foundation
from foundation.native import build
from tests.conftest import FIRST_PAYLOAD, arena_files, blocks, damage

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(*args, env=None, **kw):
    e = dict(os.environ)
    for k in ("FOUNDATION_STORE", "FOUNDATION_KEY_FILE", "FOUNDATION_CONFIG", "JOURNAL_STREAM", "INVOCATION_ID"):
        e.pop(k, None)
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "foundation", *args], capture_output=True, text=True,
                          env=e, cwd=ROOT, **kw)


def test_version():
    r = run("--version")
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"foundation {foundation.__version__}\n"


def test_the_console_script_returns_the_command_status_with_its_objects_frozen():
    """`foundation` (pyproject's console script) and `python -m foundation` both run cli.console:
    main's exit status, and the command's objects frozen for the interpreter's exit."""
    import tomllib

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        assert tomllib.load(f)["project"]["scripts"]["foundation"] == "foundation.cli:console"
    code = ("import gc, sys; from foundation.cli import console; sys.argv = ['foundation'] + sys.argv[1:]; "
            "gc.unfreeze(); c = console(); print(c, gc.get_freeze_count() > 1000)")
    for args, want in ((["completion"], "0 True"), (["--store", "/nonexistent/store", "list"], "10 True")):
        r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=ROOT)
        assert r.stdout.splitlines()[-1] == want, r.stderr


def test_missing_headers_are_named():
    assert build.missing_headers() == []
    assert build.missing_headers(["openssl/evp.h", "no_such_header_zz.h"]) == ["no_such_header_zz.h"]


def test_static_zstd_is_linked_from_its_directory(tmp_path, monkeypatch):
    """FOUNDATION_ZSTD=DIR: zstd from DIR's libzstd.a and zstd.h instead of the system's library."""
    monkeypatch.setenv("FOUNDATION_ZSTD", str(tmp_path))
    with pytest.raises(SystemExit, match=f"FOUNDATION_ZSTD={tmp_path} has no zstd.h and libzstd.a"):
        build.static_zstd()
    for f in ("zstd.h", "libzstd.a"):
        (tmp_path / f).write_bytes(b"")
    assert build.static_zstd() == (str(tmp_path), str(tmp_path / "libzstd.a"))
    kw = build.builder(os.path.abspath)._assigned_source[3]
    assert kw["extra_objects"] == [str(tmp_path / "libzstd.a")] and "zstd" not in kw["libraries"]
    assert kw["include_dirs"][1] == str(tmp_path)  # before the system's headers
    monkeypatch.delenv("FOUNDATION_ZSTD")
    kw = build.builder(os.path.abspath)._assigned_source[3]
    assert kw["extra_objects"] == [] and "zstd" in kw["libraries"]


def test_build_without_headers_says_which_packages(tmp_path):
    """setup.py on a machine whose compiler finds no headers: one line naming the packages, no compiler error."""
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", "*.so", "build", "__pycache__", "tests",
                                                             "benchmarks", ".pytest_cache"))
    r = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=src,
                       capture_output=True, text=True, env={**os.environ, "CFLAGS": "-nostdinc"})
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert lines[-1] == (
        "foundation: zstd.h and openssl/evp.h not found; install the C core's build dependencies: "
        "Debian/Ubuntu `apt-get install gcc pkg-config libzstd-dev libssl-dev`, "
        "Fedora `dnf install gcc pkgconf-pkg-config libzstd-devel openssl-devel`")
    assert "No such file or directory" not in r.stderr and "Traceback" not in r.stderr


# -- --json outputs ------------------------------------------------------------

NO_LIBVIRT = "qemu+unix:///system?socket=/nonexistent/libvirt-sock"


def journal_record(state, name, status, finished, error=None, uuid=None):
    """A VM journal record as the archiver writes it (foundation/vm/journal.py)."""
    uuid = uuid or f"00000000-0000-0000-0000-{abs(hash(name)) % 10**12:012d}"
    os.makedirs(os.path.join(state, "vm"), exist_ok=True)
    rec = {"version": 1, "uuid": uuid, "name": name, "seq": 1, "disks": {}, "run": None,
           "last": {"finished": finished.isoformat(), "status": status, "error": error, "changed_bytes": 0,
                    "consistency": "crash-consistent", "repaired": [], "snapshots": [], "seconds": 1.0}}
    with open(os.path.join(state, "vm", f"{uuid}.json"), "w") as f:
        json.dump(rec, f)


def test_status_json_and_glance(tmp_path, host_state):
    now = dt.datetime.now(dt.timezone.utc)
    state = str(host_state)
    journal_record(state, "fresh", "ok", now - dt.timedelta(hours=5))
    journal_record(state, "old", "ok", now - dt.timedelta(days=3, hours=1))
    journal_record(state, "broken", "failed", now - dt.timedelta(hours=1), error="disk vda: qemu-img map failed")
    conf = tmp_path / "foundation.toml"
    conf.write_text(f'state_dir = "{state}"\nlibvirt_uri = "{NO_LIBVIRT}"\n')
    r = run("--config", str(conf), "status", "--json")
    assert r.returncode == 0, r.stderr
    st = json.loads(r.stdout)
    assert st["version"] == 1 and st["stale_days"] == 2
    vms = {v["name"]: v for v in st["vms"]}
    assert sorted(vms) == ["broken", "fresh", "old"]
    assert vms["fresh"]["stale"] is False and 5 * 3600 - 60 < vms["fresh"]["age_seconds"] < 5 * 3600 + 60
    assert vms["old"]["stale"] is True and vms["old"]["status"] == "ok"
    assert vms["broken"]["status"] == "failed" and vms["broken"]["error"] == "disk vda: qemu-img map failed"
    assert vms["broken"]["last_good"] is None and vms["broken"]["stale"] is True
    assert "chains not checked" in st["libvirt"]
    r = run("--config", str(conf), "status")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "old\n  last good: " in out and "(3 days ago)  STALE" in out
    assert "fresh\n  last good: " in out and "(5 hours ago)\n" in out
    assert "broken\n  last good: none yet  STALE" in out and "disk vda: qemu-img map failed" in out


def test_list_stats_verify_json(make_store, tmp_path):
    opener = make_store(encrypt=False)
    with opener(writable=True) as s:
        s.write_blocks(blocks(50, seed=3))
    env = {"FOUNDATION_STORE": opener.path}
    r = run("list", "--json", env=env)
    assert r.returncode == 0 and json.loads(r.stdout) == []
    st = json.loads(run("stats", "--json", env=env).stdout)
    assert st["records"] == 50 and st["encrypted"] is False
    r = run("verify", "--json", env=env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"version": 1, "ok": True, "records": 50, "arenas": 1, "damaged": [],
                                    "notes": [], "affected": [], "rolled_back": ""}
    damage(arena_files(opener.path)[0], FIRST_PAYLOAD + 5, b"\x00\x01\x02")
    r = run("verify", "--json", env=env)
    assert r.returncode == 1
    v = json.loads(r.stdout)
    assert v["ok"] is False and v["damaged"][0]["arena"] == 0 and v["damaged"][0]["offset"] == 72
    assert v["damaged"][0]["record"] is True and v["damaged"][0]["kind"] == "record"


# -- logs ------------------------------------------------------------------------

def journal_run(args, journal=True):
    """Run with stderr a pipe that JOURNAL_STREAM names (as systemd does) -> (status, stderr text)."""
    r, w = os.pipe()
    st = os.fstat(w)
    env = {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}" if journal else "1:1"}
    e = {k: v for k, v in os.environ.items() if not k.startswith("FOUNDATION_")}
    p = subprocess.Popen([sys.executable, *args], stderr=w, stdout=subprocess.DEVNULL, cwd=ROOT, env={**e, **env})
    os.close(w)
    with os.fdopen(r) as f:
        err = f.read()
    return p.wait(), err


def test_journal_priorities():
    code = ("import logging; from foundation.cli import logs; logs.setup(); log = logging.getLogger('foundation.x'); "
            "log.info('archiving web'); log.warning('web: repaired\\nsecond line'); log.error('web: failed')")
    status, err = journal_run(["-c", code])
    assert status == 0
    assert err == ("<6>foundation.x: archiving web\n<4>foundation.x: web: repaired\n<4>second line\n"
                   "<3>foundation.x: web: failed\n")
    status, err = journal_run(["-m", "foundation", "--store", "/nonexistent/store", "list"])
    assert status == 10
    assert err.startswith("<3>foundation: Store /nonexistent/store does not exist") and err.count("\n") == 1
    # JOURNAL_STREAM naming another stream (a command run from a service's shell): no prefixes
    status, err = journal_run(["-c", code], journal=False)
    assert err.splitlines()[0] == "INFO foundation.x: archiving web"


# -- bash completion -------------------------------------------------------------

@pytest.fixture
def complete(tmp_path, host_state):
    """complete(line) -> the candidates bash offers for the last word of `foundation LINE`."""
    import snapshotfs_support as T

    arch = T.StoreArchiver(str(tmp_path / "arch"), encrypt=False)
    disk = tmp_path / "d.img"
    disk.write_bytes(b"x" * 8192)
    for day in (19, 21):
        arch.add("web", T.utc(2026, 11, day, 12), {"vda": str(disk)})
    arch.add("mydisk", T.utc(2026, 11, 20, 12), {"vda": str(disk)})
    now = dt.datetime.now(dt.timezone.utc)
    journal_record(str(host_state), "web", "ok", now)
    journal_record(str(host_state), "db", "ok", now)
    conf = tmp_path / "foundation.toml"
    conf.write_text(f'store = "{arch.store_path}"\nlibvirt_uri = "{NO_LIBVIRT}"\nvms = ["web", "db", "mail"]\n')
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "foundation").write_text(f'#!/bin/sh\nPYTHONPATH={ROOT} exec {sys.executable} -m foundation "$@"\n')
    (bindir / "foundation").chmod(0o755)
    script = tmp_path / "foundation.bash"
    script.write_text(run("completion").stdout)

    def complete(line):
        words = ["foundation", *line.split(" ")]
        prog = (f'source {script}; COMP_WORDS=({" ".join(repr(w) for w in words)}); '
                f'COMP_CWORD={len(words) - 1}; _foundation; printf "%s\\n" "${{COMPREPLY[@]}}"')
        env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "FOUNDATION_CONFIG": str(conf),
               "FOUNDATION_STATE_DIR": str(host_state)}
        r = subprocess.run(["bash", "-c", prog], capture_output=True, text=True, env=env, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        return sorted(w for w in r.stdout.split("\n") if w)
    return complete


def test_completion(complete):
    assert complete("st") == ["stats", "status"]
    assert {"archive", "notify", "completion", "restore", "verify"} <= set(complete(""))
    assert complete("--ver") == ["--verbose", "--version"]
    assert complete("list --j") == ["--json"]
    assert complete("verify --") == ["--help", "--json"]
    # VM names: config file and journal (libvirt unreachable here); several of them
    assert complete("archive ") == ["db", "mail", "web"]
    assert complete("status web m") == ["mail"]
    assert complete("--config /dev/null archive --state-dir x w") == ["web"]
    # snapshot names: NAME@ first, then the local days of that name's snapshots
    assert complete("restore ") == ["mydisk@", "web@"]
    days = sorted(f"web@{T.astimezone():%Y-%m-%d}" for T in (dt.datetime(2026, 11, d, 12, tzinfo=dt.timezone.utc)
                                                             for d in (19, 21)))
    assert complete("restore web@") == days
    assert complete("forget web@2026-11-19 web@2026-11-2") == days[1:]
    # after the snapshot, restore wants a file
    assert complete("restore web@2026-11-21 foundation.b") == ["foundation.bash"]
    assert complete("list m") == ["mail", "mydisk"]
    assert complete("boot web ") == []


# -- man page ---------------------------------------------------------------------

def test_man_page_covers_every_command(tmp_path):
    pytest.importorskip("build_manpages", reason="argparse-manpage is not installed (pip install .[man])")
    from foundation.cli import parser

    page = tmp_path / "foundation.1"
    r = subprocess.run([sys.executable, "-m", "foundation.cli.manpage", str(page)], cwd=ROOT, capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    assert page.read_text().startswith('.TH FOUNDATION "1" ')
    r = subprocess.run(["man", "--warnings", "-l", str(page)], capture_output=True, text=True,
                       env={**os.environ, "MANWIDTH": "100", "MAN_KEEP_FORMATTING": ""})
    assert r.returncode == 0 and r.stderr == "", r.stderr
    text = r.stdout
    assert f"foundation {foundation.__version__}" in text and "[--version]" in text
    sub = parser()._subparsers._group_actions[0]
    for name in sub.choices:
        assert f"COMMAND 'foundation {name}'" in text, name
    verify = text[text.index("COMMAND 'foundation verify'"):]
    assert "--json" in verify[:600]
