"""Build foundation._native, the C core, with cffi (API, out-of-line mode).

The declarations are csrc/foundation.h itself, so the header Python sees
and the header C compiles against cannot drift apart. setup.py names this
file in `cffi_modules`; `pip install -e .` and `pip install .` build it.
For quick iteration, build in place next to the sources (run the file, not
the module: importing foundation.native needs the module already built):

    python foundation/native/build.py

Needs a C compiler and the OpenSSL 3 and zstd headers (Debian: gcc
pkg-config libssl-dev libzstd-dev). They are looked for first, with the
compiler itself, so a machine without them gets one line naming the
packages to install instead of a compiler error (borg's setup does the same).

FOUNDATION_ZSTD=DIR links zstd statically from DIR (its zstd.h and a
libzstd.a built with -fPIC, e.g. zstd's lib/ after
`make libzstd.a CFLAGS="-O3 -fPIC"`) instead of the system's shared
library: the records are the same bytes, but zstd 1.5.7 compresses 4 KiB
blocks ~15 % faster than Debian 12's 1.5.4 (benchmarks/README.md, branch d0d).
"""

import importlib.machinery
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile

from cffi import FFI

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CSRC = os.path.join(ROOT, "csrc")
SOURCES = ["core.c", "hash.c", "lanes.c", "record.c", "bucket.c", "table.c", "bloom.c", "plan.c"]
LIBRARIES = ["libcrypto", "libzstd"]
HEADERS = ["zstd.h", "openssl/evp.h"]
PACKAGES = ("install the C core's build dependencies: "
            "Debian/Ubuntu `apt-get install gcc pkg-config libzstd-dev libssl-dev`, "
            "Fedora `dnf install gcc pkgconf-pkg-config libzstd-devel openssl-devel`")


def cdef(header):
    """The header without preprocessor lines: what cffi's parser accepts."""
    with open(header) as f:
        return "".join(line for line in f if not line.lstrip().startswith("#"))


def pkgconfig(flag, default):
    """Compiler or linker flags from pkg-config, or default without it."""
    if shutil.which("pkg-config") is None:
        return default
    try:
        out = subprocess.run(["pkg-config", flag, *LIBRARIES], check=True,
                             capture_output=True, text=True).stdout
    except subprocess.CalledProcessError:
        return default
    return out.split()


def missing_headers(headers=HEADERS, include_dirs=()):
    """The headers the C compiler cannot find (all of them when there is no compiler)."""
    cc = shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc")
    flags = shlex.split(os.environ.get("CFLAGS", "")) + [f"-I{d}" for d in include_dirs]
    missing = []
    for h in headers:
        try:
            r = subprocess.run([*cc, *flags, "-E", "-x", "c", "-o", os.devnull, "-"],
                               input=f"#include <{h}>\n", capture_output=True, text=True)
        except OSError:
            return list(headers)
        if r.returncode != 0:
            missing.append(h)
    return missing


def check_headers(include_dirs=()):
    """Stop the build with one line naming the packages when a header is missing."""
    if shutil.which((os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()[0]) is None:
        sys.exit(f"foundation: no C compiler found; {PACKAGES}")
    missing = missing_headers(include_dirs=include_dirs)
    if missing:
        sys.exit(f"foundation: {' and '.join(missing)} not found; {PACKAGES}")


def static_zstd():
    """FOUNDATION_ZSTD's directory and its libzstd.a, or (None, None) to link the system's."""
    d = os.environ.get("FOUNDATION_ZSTD")
    if not d:
        return None, None
    lib = os.path.join(os.path.abspath(d), "libzstd.a")
    if not os.path.exists(os.path.join(d, "zstd.h")) or not os.path.exists(lib):
        sys.exit(f"foundation: FOUNDATION_ZSTD={d} has no zstd.h and libzstd.a")
    return os.path.abspath(d), lib


def builder(paths):
    """The FFI builder, naming files through paths (a path -> path function)."""
    zdir, zlib = static_zstd()
    cflags = ([f"-I{zdir}"] if zdir else []) + pkgconfig("--cflags-only-I", [])
    check_headers([f[2:] for f in cflags if f.startswith("-I")])
    ldflags = pkgconfig("--libs-only-L", [])
    ffi = FFI()
    ffi.cdef(cdef(os.path.join(CSRC, "foundation.h")))
    ffi.set_source(
        "foundation._native",
        '#include "foundation.h"\n',
        sources=[paths(os.path.join(CSRC, s)) for s in SOURCES],
        depends=[paths(os.path.join(CSRC, h)) for h in ("foundation.h", "internal.h")],
        include_dirs=[paths(CSRC)] + [f[2:] for f in cflags if f.startswith("-I")],
        library_dirs=[f[2:] for f in ldflags if f.startswith("-L")],
        libraries=["crypto", "pthread"] if zlib else ["crypto", "zstd", "pthread"],
        extra_objects=[zlib] if zlib else [],
        extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter",
                            "-pthread", "-fvisibility=hidden"],
        # a static zstd's symbols stay inside the module
        extra_link_args=["-pthread"] + (["-Wl,--exclude-libs,libzstd.a"] if zlib else []),
    )
    return ffi


def relative(path):
    # setuptools wants sources relative to setup.py's directory, its working
    # directory while it builds.
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


ffibuilder = builder(relative)


def main():
    """Compile foundation/_native in place, through a scratch directory."""
    with tempfile.TemporaryDirectory() as tmp:
        # cffi compiles from inside tmp: name every file absolutely
        so = builder(os.path.abspath).compile(tmpdir=tmp, verbose="-v" in sys.argv)
        # One file, named as pip names it: a leftover with a more specific
        # suffix (.cpython-311-...so) would shadow what pip builds later.
        stem = os.path.join(ROOT, "foundation", "_native")
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            if os.path.exists(stem + suffix):
                os.remove(stem + suffix)
        abi3 = ".abi3.so" in importlib.machinery.EXTENSION_SUFFIXES
        dest = stem + ".abi3.so" if abi3 else os.path.join(os.path.dirname(stem), os.path.basename(so))
        shutil.copyfile(so, dest)
    print(dest)


if __name__ == "__main__":
    main()
