"""Putting arenas rewritten by gc in place of the old ones.

gc decides what to keep (foundation.gc); the store owns the files, so the
switch is here: a rewritten arena is written beside its arena
(`NNNNNNNN.arena.gc`) and swapped in by rename, one arena at a time in
compare-by-hash mode, or all at once through one journal, `gc.json`, in
compare-by-value mode. Once the journal is on disk the switch is rolled
forward by whoever opens the store next for writing (finish()); before it,
nothing old has changed. A reader never waits for that writer: from the
journal on, the new arena set is whole on disk (each arena is its `.gc`
file until renamed, then its own file), so a reader reads that set under
the journal's head (view()). docs/format.md §12 gives the write order.
"""

import json
import logging
import os

from foundation.faults import crash_point
from foundation.store import format as F
from foundation.store.arena import write_heads
from foundation.store.disk import atomic_write, fsync_dir

log = logging.getLogger(__name__)

JOURNAL = "gc.json"
TEMP = ".gc"  # suffix of a rewritten arena before its swap
CRASH_ENV = "FOUNDATION_GC_CRASH"  # tests: "point" or "point:N" exits at the N-th time gc reaches it


def write_arena(store, n, data):
    """Write the new bytes of arena n beside the old file, durably -> its path."""
    path = store.log.path(n) + TEMP
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        store.disk.pwrite(fd, "arena", 0, bytes(data))
        store.disk.fsync(fd, "arena")
    finally:
        os.close(fd)
    return path


def swap(store, n, path, summary):
    """Put the rewritten arena n (at path, from write_arena) in place of the old one, with its
    summary bytes: the old summary goes first, so a crash before the new one is written rebuilds
    it from the new arena."""
    sp = os.path.join(store.path, F.SUMMARIES, F.summary_name(n))
    if os.path.exists(sp):
        os.unlink(sp)
    store.log.forget(n)
    os.rename(path, store.log.path(n))
    fsync_dir(store.log.dir)
    atomic_write(sp, summary, sync=False)
    store.forget_summary(n)


def save_damaged(store, old=None):
    """damaged.json from store.bad (if verify wrote one); `old` = (arena, generation) about to be
    swapped out: its entries carry that generation, so they stop naming records once the arena
    has another (foundation.gc's docstring)."""
    p = os.path.join(store.path, F.DAMAGED)
    if os.path.exists(p):
        recs = [list(F.split(a)) for a in sorted(store.bad)]
        for r in recs:
            if old and r[0] == old[0]:
                r.append(old[1])
        atomic_write(p, json.dumps({"records": recs}).encode())


def drop_leftovers(path):
    """Rewritten arenas gc never swapped in (it stopped first): the old arenas stand -> the arena
    numbers dropped (the writer says it undid the gc)."""
    adir = os.path.join(path, F.ARENAS)
    dropped = []
    for name in sorted(os.listdir(adir)):
        if name.endswith(".arena" + TEMP):
            os.unlink(os.path.join(adir, name))
            dropped.append(int(name.split(".")[0]))
    if dropped:
        fsync_dir(adir)
        log.warning("store %s: an interrupted gc was undone: %d rewritten arena(s) it never swapped in were "
                    "deleted; the old arenas stand and every kept day is as before", path, len(dropped))
    return dropped


def commit(store, first, files, old_last, head):
    """Write the journal: from here on the switch happens, now or at the next open."""
    j = {"first": first, "files": files, "old_last": old_last, "head": head.pack(store.keys.mac).hex()}
    atomic_write(os.path.join(store.path, JOURNAL), json.dumps(j).encode())
    if store.watch:     # the host takes the shorter, rewritten log as the newest before the head moves
        store.watch.record(store.uuid, head)


def journal_head(path):
    """The bytes of the head an interrupted switch puts in place, or None if none is pending."""
    try:
        with open(os.path.join(path, JOURNAL)) as f:
            return bytes.fromhex(json.load(f)["head"])
    except (OSError, ValueError, KeyError):
        return None


def pending(path):
    return os.path.exists(os.path.join(path, JOURNAL))


def _journal(path):
    with open(os.path.join(path, JOURNAL), "rb") as f:
        return json.loads(f.read())


def view(path):
    """What a reader reads while a switch is pending -> (head bytes, {arena: path of its `.gc`
    file}): the new set, which is whole on disk from the journal on. An arena whose `.gc` file is
    gone was renamed into place already (Log.fd falls back to the arena's own path)."""
    j = _journal(path)
    adir = os.path.join(path, F.ARENAS)
    return bytes.fromhex(j["head"]), {n: os.path.join(adir, F.arena_name(n)) + TEMP for n in j["files"]}


def finish(path):
    """Roll an interrupted switch forward (idempotent): new arenas in, old tail out, new head."""
    jp = os.path.join(path, JOURNAL)
    j = _journal(path)
    adir = os.path.join(path, F.ARENAS)
    sdir = os.path.join(path, F.SUMMARIES)

    def drop(p):
        try:
            os.unlink(p)
        except FileNotFoundError:
            pass

    # Every derived structure names old addresses: drop them, the next open rebuilds.
    drop(os.path.join(path, F.INDEX))
    drop(os.path.join(path, F.BLOOM_STATE))
    drop(os.path.join(path, F.DAMAGED))
    for n in range(j["first"], j["old_last"] + 1):
        drop(os.path.join(sdir, F.summary_name(n)))
    for n in j["files"]:
        tmp = os.path.join(adir, F.arena_name(n)) + TEMP
        if os.path.exists(tmp):
            os.rename(tmp, os.path.join(adir, F.arena_name(n)))
            crash_point(CRASH_ENV, "gc.renamed")
    last = max(j["files"])
    for n in range(last + 1, j["old_last"] + 1):
        drop(os.path.join(adir, F.arena_name(n)))
    fsync_dir(adir)
    crash_point(CRASH_ENV, "gc.trimmed")
    write_heads(path, bytes.fromhex(j["head"]))
    crash_point(CRASH_ENV, "gc.headed")
    os.unlink(jp)
    fsync_dir(path)
