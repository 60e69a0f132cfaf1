"""A command's first reads, asked of the kernel all at once while Python imports (a cold cache).

A later day on a cold page cache waited for its first reads one at a time:
~150 module files (each an open and a read, or page faults of a shared
object), the store's small files, its Bloom filter (mapped, then faulted
in page by page at random) and the open arena (read whole at open).
`start` hands their names to a thread that opens each one and asks for it
with posix_fadvise(WILLNEED): the disk serves them together while the
interpreter is still importing, and the reads that follow find them in
the page cache. Only the names are known here, so this module imports
nothing of the store (the point is to begin before it loads); the store's
file names are checked against foundation.store.format by the tests.
It is a hint and nothing more: no byte goes into Python, a missing file is
skipped, no error reaches the command, and a warm cache costs ~1 ms;
FOUNDATION_WARMUP=0 turns it off.

`archive` also runs `qemu-img create` for each night's new overlays (its
shared libraries are QEMU's, mapped already; its own file is not): the
program file is asked for after the libraries.

`archive` also imports libvirt's binding, whose ~50 shared libraries the
dynamic loader reads page by page on a cold cache (50 major faults, ~18
ms of a night's 36 ms import). Which libraries they are depends on the
host, so it is learnt: the archive keeps the list of the shared objects it
mapped past its start in its state directory (LIBS, rewritten only when it
changes), and later runs ask for them right after the modules.
"""

import os
import sys

# The store's small files (docs/format.md §2), read by every open; the index only for its header.
STORE_FILES = ("foundation.json", "head", "head.1", "counters.json", "damaged.json", "bloom.json")
INDEX_FILE, INDEX_HEADER = "index", 4096
BLOOM_FILE = "bloom"
ARENAS = "arenas"
WRITERS = {"import-image", "archive"}  # commands whose open maps the Bloom filter and appends
BIG = 256 << 20  # a file larger than this is not asked for whole (a Bloom filter of a huge store)
PROBE = 64 << 10  # of a large file named on the command line (an image): its first bytes, which a probe reads
SMALL = 1 << 20  # a file named on the command line up to this size is asked for whole (--changed)

# The standard library a writing command imports after the interpreter's own start, as paths under
# its directory without ".py" (a module missing here costs a cold read later, never an error).
STDLIB = (
    "argparse", "gettext", "logging/__init__", "traceback", "linecache", "tokenize", "token", "textwrap",
    "string", "datetime", "hashlib", "hmac", "base64", "json/__init__", "json/decoder", "json/scanner",
    "json/encoder", "copy", "concurrent/__init__",
    "concurrent/futures/__init__", "concurrent/futures/_base", "concurrent/futures/thread", "locale",
    "signal", "selectors", "subprocess", "queue", "heapq", "bisect", "struct", "threading", "weakref",
    "_weakrefset", "contextlib", "enum", "functools", "operator", "keyword", "reprlib",
    "collections/__init__", "collections/abc", "types", "typing", "re/__init__", "re/_compiler",
    "re/_parser", "re/_constants", "re/_casefix", "copyreg", "uuid", "platform", "ctypes/__init__",
    "ctypes/_endian",
)
EXTENSIONS = ("_datetime", "_hashlib", "_blake2", "_json", "array", "mmap", "_posixsubprocess",
              "select", "fcntl", "_heapq", "_queue", "_bisect", "_struct", "math", "binascii", "_uuid",
              "_ctypes", "_random", "_sha512", "zlib")
SITE = ("_cffi_backend", "pybloomfilter")  # third-party extension modules the store loads
OURS = ("", "native", "store", "image", "catalog", "crypto")  # our packages: every module of these
CLI = ("__init__", "logs", "common")  # and of the command line, these and the command's own
# `archive` also loads the archiver and libvirt's binding (its C library is libvirtd's, mapped already)
VM_PACKAGES, VM_SITE, VM_SITE_PY = ("vm",), ("libvirtmod",), ("libvirt",)
VM_PROGRAM = "qemu-img"  # on PATH: the new overlays of `archive` (image/qemuimg.py NewLayer)
SUMMARIES, SUMMARIES_MAX = "summaries", 32 << 20  # a night's old tree nodes need most of the arenas' summaries

CONFIG, CONFIG_ENV = "/etc/foundation/foundation.toml", "FOUNDATION_CONFIG"  # foundation.config's
STATE_DIR, STATE_ENV = "/var/lib/foundation", "FOUNDATION_STATE_DIR"  # the archiver's (config, cli.common)
LIBS = "warmup-libs"  # in the state directory: the shared objects an archive mapped, a path a line
LIBS_MAX = 16 << 20  # a larger one (ICU's data, 31 MB) is mapped, not read: not asked for

SWITCH = "FOUNDATION_WARMUP"  # "0": no warm-up (to measure a command without it)

_started = False
_at_start = None  # mapped() when an `archive` started: what learn() compares with


def start(argv, env=os.environ):
    """Start asking for the files the command in argv (without the program name) will read."""
    global _started, _at_start
    if _started or env.get(SWITCH) == "0":
        return
    _started = True
    try:
        at = _command(argv)
        if at is not None and argv[at] == "archive":
            _at_start = mapped()
        import _thread

        _thread.start_new_thread(_ask, (_files(argv, env),))
    except Exception:  # noqa: BLE001 - a hint: the command runs the same without it
        pass


def _ask(files):
    for path, length in files:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            if length < 0:  # the first -length bytes, or all of it when it is small
                size = os.fstat(fd).st_size
                length = size if size <= SMALL else -length
            os.posix_fadvise(fd, 0, length, os.POSIX_FADV_WILLNEED)
        except OSError:
            pass
        finally:
            os.close(fd)


def _files(argv, env):
    """[(path, length)] in the order they will be needed: modules, then the store, then the
    files named on the command line (length 0: all of it; negative: see _ask)."""
    at = _command(argv)
    command = argv[at] if at is not None else None
    out = [(p, 0) for p in _modules(command)]
    config = _option(argv, "--config") or env.get(CONFIG_ENV) or CONFIG
    if command == "archive":  # before the store's files: the import of libvirt comes first
        state = _option(argv, "--state-dir") or env.get(STATE_ENV) or _configured(config, "state_dir") or STATE_DIR
        asked = {p for p, _ in out}
        out += [(p, 0) for p in _remembered(os.path.join(state, LIBS)) if p not in asked]
        out += [(p, 0) for p in _on_path(VM_PROGRAM, env)]  # needed after the libraries
    store = _option(argv, "--store") or env.get("FOUNDATION_STORE") or _configured(config, "store")
    if store:
        out += [(os.path.join(store, f), 0) for f in STORE_FILES]
        out.append((os.path.join(store, INDEX_FILE), INDEX_HEADER))
        if command in WRITERS:  # in the order an open reads them: the open arena, then the filter
            newest = _newest_arena(os.path.join(store, ARENAS))
            if newest:
                out.append((newest, -BIG))
            out.append((os.path.join(store, BLOOM_FILE), -BIG))
        if command == "archive":
            out += _summaries(os.path.join(store, SUMMARIES))
    key = _option(argv, "--key-file") or env.get("FOUNDATION_KEY_FILE")
    if key:
        out.append((key, 0))
    if at is not None:
        out += [(a, -PROBE) for a in argv[at + 1:] if not a.startswith("-")]
    return out


def _command(argv):
    """The index of the command's name in argv (its first word that is no global option), or None."""
    skip = False
    for i, a in enumerate(argv):
        if skip:
            skip = False
        elif a in ("--store", "--key-file", "--config"):
            skip = True
        elif not a.startswith("-"):
            return i
    return None


def _option(argv, name):
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(name + "="):
            return a[len(name) + 1:]
    return None


def _configured(path, name):
    """The top-level `name = "..."` of the config file, found without a TOML parser (this runs
    before any import); a line it misreads only names files that are then not found."""
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if line.startswith("["):
                    return None  # past the top level
                key, eq, value = line.partition("=")
                value = value.strip()
                if eq and key.strip() == name and len(value) > 1 and value[0] == value[-1] == '"':
                    return value[1:-1]
    except (OSError, UnicodeDecodeError):
        pass
    return None


def _remembered(path):
    try:
        with open(path, encoding="utf-8") as f:
            return [p for p in f.read().split("\n") if p.startswith("/")]
    except (OSError, UnicodeDecodeError):
        return []


def mapped():
    """The shared objects this process has mapped (/proc/self/maps), or None where it cannot tell."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            rows = [line.split(None, 5) for line in f]
    except OSError:
        return None
    return {r[5].rstrip("\n") for r in rows if len(r) == 6 and r[5].startswith("/") and ".so" in r[5]}


def learn(state_dir, before=None):
    """At the end of an archive: remember the shared objects mapped since `before` (a mapped(); by
    default the one start() took: libvirt's binding and its libraries, the standard library's
    extension modules), for the next runs' warm-up, when they differ from those remembered.
    Like the warm-up itself, a hint: nothing is raised; without a `before` (no warm-up ran) or
    with nothing new mapped, the list stays as it is."""
    before = _at_start if before is None else before
    now = mapped()
    if before is None or now is None:
        return
    new = []
    for p in sorted(now - before):
        try:
            if "\n" not in p and os.stat(p).st_size <= LIBS_MAX:
                new.append(p)
        except OSError:
            continue
    path = os.path.join(state_dir, LIBS)
    if not new or new == _remembered(path):
        return
    tmp = f"{path}.{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write("\n".join(new) + "\n")
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass


def _summaries(d):
    """The arenas' summaries, whole, if they are SUMMARIES_MAX at most together (else none: a big
    store's night needs a few of many). A night's old tree nodes lie in most arenas (the unchanged
    parts of the disk were stored on day 0, the rest on the nights since), and each node read
    asks for its arena's summary: cold, ~35 ms of waits on the deciding thread, ~400 ms into the run."""
    out, total = [], 0
    for n in sorted(_listdir(d)):
        p = os.path.join(d, n)
        try:
            total += os.stat(p).st_size
        except OSError:
            continue
        if total > SUMMARIES_MAX:
            return []
        out.append((p, 0))
    return out


def _newest_arena(d):
    try:
        names = [n for n in os.listdir(d) if n.endswith(".arena")]
    except OSError:
        return None
    return os.path.join(d, max(names)) if names else None


def _modules(command):
    import _imp

    tag = sys.implementation.cache_tag
    std = os.path.dirname(os.__file__)
    out = []
    for m in STDLIB:
        d, _, name = m.rpartition("/")
        out.append(os.path.join(std, d, "__pycache__", f"{name}.{tag}.pyc"))
    suffix = _imp.extension_suffixes()[0]
    out += [os.path.join(std, "lib-dynload", e + suffix) for e in EXTENSIONS]
    sites = [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
    vm = command == "archive"
    out += [os.path.join(s, e + suffix) for s in sites[:1] for e in SITE + (VM_SITE if vm else ())]
    if vm:
        out += [os.path.join(s, "__pycache__", f"{m}.{tag}.pyc") for s in sites[:1] for m in VM_SITE_PY]
    here = os.path.dirname(os.path.abspath(__file__))
    cli = set(CLI) | ({command.replace("-", "_")} if command else set())
    for sub in OURS + (VM_PACKAGES if vm else ()) + ("cli",):
        d = os.path.join(here, sub, "__pycache__")
        try:
            names = os.listdir(d)
        except OSError:
            continue
        for n in names:
            mod, _, rest = n.partition(".")
            if rest == f"{tag}.pyc" and (sub != "cli" or mod in cli):
                out.append(os.path.join(d, n))
    out += [os.path.join(here, n) for n in _listdir(here) if n.startswith("_native") and n.endswith(".so")]
    return out


def _on_path(name, env):
    """[the first `name` on PATH], or [] (shutil.which, without importing shutil before the command
    does: it loads bz2 and lzma)."""
    for d in env.get("PATH", os.defpath).split(os.pathsep):
        p = os.path.join(d or ".", name)
        if os.path.isfile(p):
            return [p]
    return []


def _listdir(d):
    try:
        return os.listdir(d)
    except OSError:
        return []
