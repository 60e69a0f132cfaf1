"""One `foundation archive` with the start and end of each step stamped: the timeline of a night.

Runs the CLI in this process with the archiver's steps, the qemu-img runs,
the libvirt calls that wait (snapshot, commit, job), the store's open,
flush and close and the file listings wrapped by a timer, and prints one
line per call to stderr when it ends: start and end in ms since the
interpreter reached this script, duration, name (threads interleave: a
call beside another one overlaps it). The wrappers cost a few µs per call;
the figures are those of the plain command within the noise.

    PYTHONPATH=TREE python3 benchmarks/archive_timeline.py --config CFG archive [VM]
"""

import functools
import importlib
import sys
import threading
import time

T0 = time.monotonic()
P0 = time.perf_counter()
EVENTS = []

STAMPS = {
    "foundation.cli.common": ["open_store"],
    "foundation.cli.archive": ["_archive_all", "after_write", "record_run", "_names"],
    "foundation.cli.find": ["update_listings"],
    "foundation.snapshotfs.filesindex": ["FilesIndex.__init__", "FilesIndex.update", "FilesIndex._unchanged",
                                         "FilesIndex._index_one", "changed_ranges"],
    "foundation.vm.archiver": ["Archiver._snapshot", "Archiver._archive", "Archiver._commit", "Archiver._cleanup",
                               "Archiver._adopt", "Archiver._thaw_if_frozen", "Archiver._merge"],
    "foundation.vm.journal": ["save"],
    "foundation.vm.domain": ["_libvirt", "Domain.__init__", "Domain.snapshot", "Domain.disks", "Domain.wait_job",
                             "Domain.start_commit", "Domain.inactive_mentions", "Domain.agent_problem"],
    "foundation.vm.source": ["SnapshotSource.__init__"],
    "foundation.vm.swap": ["find_swap"],
    "foundation.vm.sink": ["StoreSink.__init__", "StoreSink.write_disk", "StoreSink.add"],
    "foundation.store.store": ["Store.open", "Store.flush", "Store.close", "Store.sync"],
    "foundation.store.arena": ["Log.sync", "Log.seal"],
    "foundation.store.index": ["Index.flush"],
    "foundation.store.cache": ["IndexCache._save_bloom"],
    "foundation.catalog": ["Catalog.load", "Catalog.commit"],
    "foundation.image.qemuimg": ["run"],
    "foundation.image.tree": ["_Builder.ensure"],
}


def _stamp(what, fn):
    @functools.wraps(fn)
    def timed(*a, **k):
        t = time.monotonic() - T0
        try:
            return fn(*a, **k)
        finally:
            th = threading.current_thread().name
            EVENTS.append((t, time.monotonic() - T0, what + ("" if th == "MainThread" else f" [{th}]")))
    return timed


def _patch():
    for mod, names in STAMPS.items():
        m = importlib.import_module(mod)
        for name in names:
            obj, attr = m, name
            if "." in name:
                cls, attr = name.split(".")
                obj = getattr(m, cls)
            if hasattr(obj, attr):
                setattr(obj, attr, _stamp(f"{mod.rsplit('.', 1)[-1]}.{name}", getattr(obj, attr)))
    # names imported with `from ... import` before the patch
    import foundation.cli.archive as a
    import foundation.cli.common as c
    import foundation.vm.archiver as v
    a.open_store = c.open_store
    v.swap.find_swap = importlib.import_module("foundation.vm.swap").find_swap


WAITS = {}   # (thread, what) -> [calls, seconds]
SPANS = []   # (thread, what, start, end) of every call summed in WAITS, when TIMELINE_SPANS names a file


def _waits():
    """Sum the waits of the write path: futures waited for (by the function that waits), the
    append thread's work and the C calls that release the GIL (their time includes taking it back)."""
    import concurrent.futures
    import os
    from foundation import native
    from foundation.image import source
    from foundation.store import arena, dedup

    spans = bool(os.environ.get("TIMELINE_SPANS"))

    def add(what, dt):
        th = threading.current_thread().name
        w = WAITS.setdefault((th, what), [0, 0.0])
        w[0] += 1
        w[1] += dt
        if spans:
            t = time.perf_counter() - P0
            SPANS.append((th, what, round(t - dt, 6), round(t, 6)))

    res = concurrent.futures.Future.result

    def result(self, timeout=None):
        t = time.perf_counter()
        try:
            return res(self, timeout)
        finally:
            add("wait in " + sys._getframe(1).f_code.co_name, time.perf_counter() - t)
    concurrent.futures.Future.result = result
    try:
        import libvirt         # the round trips to libvirtd a night makes, counted and timed
    except ImportError:
        libvirt = None
    for mod, names in ((native, ["scores", "pack", "tables_lookup", "zero_flags", "bloom_add", "scan_columns", "fill", "seal"]),
                       (getattr(libvirt, "virDomain", None), ["XMLDesc", "isActive", "isPersistent", "blockJobInfo",
                                                            "blockCommit", "snapshotCreateXML", "UUIDString"]),
                       (dedup.Writes, ["_queued", "_gather", "_index_added",
                                                                            "_write_hash", "_bloom_add"]),
                       (source.RawSource, ["readinto"]), (arena.Log, ["_write_direct"])):
        if mod is None:
            continue
        for n in names:
            fn = getattr(mod, n, None)
            if fn is None:
                continue

            def wrap(fn=fn, n=n):
                @functools.wraps(fn)
                def timed(*a, **k):
                    t = time.perf_counter()
                    try:
                        return fn(*a, **k)
                    finally:
                        add(n, time.perf_counter() - t)
                return timed
            setattr(mod, n, wrap())


def _name_threads():
    """Each Python thread's name given to its OS thread (/proc/PID/task/TID/comm, 15 bytes), so that a
    sampler of /proc tells them apart; threads the C core starts inherit their starter's name."""
    import ctypes
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return
    boot = threading.Thread._bootstrap_inner

    def named(self):
        prctl(15, self.name.replace("ThreadPoolExecutor-", "pool").encode()[:15], 0, 0, 0)  # PR_SET_NAME
        return boot(self)
    threading.Thread._bootstrap_inner = named


def main():
    t = time.monotonic()
    from foundation import warmup

    warmup.start(sys.argv[1:])  # as `python -m foundation` does (cli starts it for its console script only)
    _name_threads()
    import foundation.cli
    _patch()
    import os
    if os.environ.get("TIMELINE_WAITS"):
        _waits()
    EVENTS.append((t - T0, time.monotonic() - T0, "imports (cli, vm, store)"))
    sys.argv = ["foundation", *sys.argv[1:]]
    try:
        return foundation.cli.main()
    finally:
        import os
        path = os.environ.get("TIMELINE_ERR")   # a file instead of stderr (for a harness that keeps it)
        out = open(path, "w") if path else sys.stderr
        for s, e, w in sorted(EVENTS):
            print(f"{s * 1e3:8.1f} {e * 1e3:8.1f} {(e - s) * 1e3:7.1f}  {w}", file=out)
        for (th, what), (n, dt) in sorted(WAITS.items(), key=lambda x: -x[1][1]):
            print(f"waits {dt * 1e3:9.1f} ms {n:6d} calls  {what} [{th}]", file=out)
        if path:
            out.close()
        if os.environ.get("TIMELINE_SPANS"):
            import json
            with open(os.environ["TIMELINE_SPANS"], "w") as f:
                json.dump(SPANS, f)


if __name__ == "__main__":
    sys.exit(main())
