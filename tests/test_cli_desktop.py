"""The command as a desktop user meets it: --version, the install check, --json, logs, completion, man page."""

import os
import shutil
import subprocess
import sys

import foundation
from foundation.native import build

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(*args, env=None, **kw):
    e = dict(os.environ)
    for k in ("FOUNDATION_STORE", "FOUNDATION_KEY_FILE", "FOUNDATION_CONFIG", "JOURNAL_STREAM"):
        e.pop(k, None)
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "foundation", *args], capture_output=True, text=True,
                          env=e, cwd=ROOT, **kw)


def test_version():
    r = run("--version")
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"foundation {foundation.__version__}\n"


def test_missing_headers_are_named():
    assert build.missing_headers() == []
    assert build.missing_headers(["openssl/evp.h", "no_such_header_zz.h"]) == ["no_such_header_zz.h"]


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
