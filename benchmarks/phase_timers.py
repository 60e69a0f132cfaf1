#!/usr/bin/env python3
"""One `foundation` command run in this process with timers around its steps: where a later day's CPU goes.

cProfile sees the calling thread only and inflates per-call Python; perf
sees C but not which Python step called it. This wraps the steps of a
writing command (store open, catalog, write_image and its parts, the
append and writer threads, commit, close) and reports for each: calls,
wall ms, process CPU ms (all threads: time.process_time) and the calling
thread's CPU ms (time.thread_time); steps of other threads are reported
as "[thread] step" with their own CPU. Nested steps are included in their
parents. TRACE=1 also prints a timeline (start, end, ms, thread, step) of
every step longer than 2 ms. The interpreter's start before this script
and the imports of the command are reported first. Steps a tree does not
have are left out, so two trees compare.

    PYTHONPATH=TREE python benchmarks/phase_timers.py --store S import-image NAME IMAGE --changed C.json
"""

import functools
import importlib
import os
import sys
import threading
import time

T0 = time.perf_counter()
START_CPU = time.process_time()  # the interpreter's start up to here (site, this file)
ROWS = {}
EVENTS = []
TRACE = bool(os.environ.get("TRACE"))

STEPS = [  # (module, class or None, function, label); indented labels are parts of the one above
    ("foundation.store.store", "Store", "open", "store open"),
    ("foundation.store.arena", "Log", "load", "  Log.load"),
    ("foundation.store.index", "Index", "open", "  Index.open"),
    ("foundation.store.cache", "IndexCache", "_open_bloom", "  Bloom filter open"),
    ("foundation.catalog", "Catalog", "load", "catalog load"),
    ("foundation.image.source", "Opening", "result", "image open (probe wait)"),
    ("foundation.cli.import_image", None, "write_image", "write_image"),
    ("foundation.image.tree", "_Builder", "ensure", "  old tree nodes (ensure)"),
    ("foundation.store.read", "Reads", "read_blocks", "    read_blocks"),
    ("foundation.store.cache", "IndexCache", "prefetch", "    prefetch"),
    ("foundation.store.dedup", "Writes", "write_blocks", "  write_blocks"),
    ("foundation.native", None, "scores", "    hashing (native.scores)"),
    ("foundation.native", None, "tables_lookup", "    index cache lookups (native.tables_lookup)"),
    ("foundation.store.dedup", "Writes", "_write_hash", "    decision (_write_hash)"),
    ("foundation.store.dedup", "Writes", "_settle_append", "    wait for the append in flight"),
    ("foundation.store.dedup", "Writes", "_known_older", "    older duplicates (_known_older)"),
    ("foundation.store.dedup", "Writes", "_exists", "    older duplicates (_exists)"),
    ("foundation.store.cache", "IndexCache", "_load_summary", "    summary loads"),
    ("foundation.store.dedup", "Writes", "_bloom_add", "    Bloom filter fed"),
    ("foundation.image.tree", "_Builder", "finish", "  tree nodes written"),
    ("foundation.store.dedup", "Writes", "_append", "append (pack, write, index)"),
    ("foundation.store.arena", "Log", "append", "  Log.append (pack)"),
    ("foundation.store.arena", "Log", "_write_out", "write behind"),
    ("foundation.image.source", "RawSource", "readinto", "image reads"),
    ("foundation.catalog", "Catalog", "commit", "catalog commit"),
    ("foundation.store.store", "Store", "sync", "  sync"),
    ("foundation.store.store", "Store", "close", "store close"),
    ("foundation.store.store", "Store", "flush", "  index flush"),
    ("foundation.store.index", "Index", "_merge", "    merge (read, merge, write)"),
    ("foundation.store.cache", "IndexCache", "_save_bloom", "  Bloom filter saved"),
]


def timed(label, f):
    @functools.wraps(f)
    def w(*a, **k):
        main = threading.current_thread() is threading.main_thread()
        t, c, m = time.perf_counter(), time.process_time(), time.thread_time()
        try:
            return f(*a, **k)
        finally:
            t1 = time.perf_counter()
            key = label if main else "[thread] " + label.strip()
            r = ROWS.setdefault(key, [0, 0.0, 0.0, 0.0])
            r[0] += 1
            r[1] += t1 - t
            r[2] += time.process_time() - c if main else 0.0
            r[3] += time.thread_time() - m
            if TRACE:
                EVENTS.append((t - T0, t1 - T0, threading.current_thread().name[:14], label.strip()))
    return w


def patch(modname, cls, fn, label):
    try:
        mod = importlib.import_module(modname)
    except ImportError:
        return
    if cls is None:
        if hasattr(mod, fn):
            setattr(mod, fn, timed(label, getattr(mod, fn)))
        return
    c = getattr(mod, cls, None)
    owner = next((k for k in getattr(c, "__mro__", ()) if fn in k.__dict__), None)
    if owner is None:
        return
    f = owner.__dict__[fn]
    if isinstance(f, (classmethod, staticmethod)):
        setattr(owner, fn, type(f)(timed(label, f.__func__)))
    else:
        setattr(owner, fn, timed(label, f))


def main():
    t, c = time.perf_counter(), time.process_time()
    try:  # the command's first reads asked for, as `python -m foundation` does (trees that have it)
        from foundation import warmup
        warmup.start(sys.argv[1:])
    except ImportError:
        pass
    import foundation.cli as cli
    name = cli._named(sys.argv[1:])
    if name:
        importlib.import_module(f"foundation.cli.{name}")
    imports = (time.perf_counter() - t, time.process_time() - c)
    for step in STEPS:
        patch(*step)
    try:
        rc = timed("command", cli.main)(sys.argv[1:])
    finally:
        out = sys.stderr
        print(f"{'step':46s} {'calls':>6s} {'wall ms':>8s} {'cpu ms':>8s} {'own ms':>8s}", file=out)
        print(f"{'interpreter start (before this script)':46s} {'':6s} {'':8s} {START_CPU * 1e3:8.1f}", file=out)
        print(f"{'imports of the command':46s} {'':6s} {imports[0] * 1e3:8.1f} {imports[1] * 1e3:8.1f}", file=out)
        for k, (n, w, pc, own) in ROWS.items():
            print(f"{k:46s} {n:6d} {w * 1e3:8.1f} {pc * 1e3 if pc else float('nan'):8.1f} {own * 1e3:8.1f}", file=out)
        print(f"total: wall {(time.perf_counter() - T0) * 1e3:.1f} ms, CPU {time.process_time() * 1e3:.1f} ms "
              "(this process; a child such as qemu-img not counted)", file=out)
        for a, b, th, label in sorted(EVENTS):
            if b - a > 0.002 or label == "command":
                print(f"{a * 1e3:8.1f} {b * 1e3:8.1f} {(b - a) * 1e3:7.1f} {th:14s} {label}", file=out)
    return rc


if __name__ == "__main__":
    sys.exit(main())
