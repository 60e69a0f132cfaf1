"""Garbage collection: give back the space of blocks no kept snapshot reaches.

Nothing is deleted unless the user asks (paper §7.1): `forget` and `prune`
only rewrite the catalog, and `gc` then marks what the kept snapshots
reach by backward sweeps of the log (mark.py) and rewrites the arenas
whose share of garbage is worth it. In compare-by-hash mode each such
arena is rewritten alone and swapped in by rename (compact.py), so gc can
stop after any arena (--max-time, --target-free) and every step leaves a
store in which every kept snapshot restores. In compare-by-value mode,
where moving a block renames it, the log is rewritten from the first such
arena to its end in one journaled switch (reflow.py). `--relayout` (hash
mode) rewrites the whole log through that same switch, the newest snapshot
of each VM first in disk order, so that recent days restore front to back
after years of nights (relayout.py); a plain gc does the same by itself
for the tail of the log it would rewrite for the most part anyway.

gc holds the writer lock and the readers lock (no /snapshot mount or
restore may read arenas while they move); the index and Bloom filter are
rebuilt at the end, or at the next open if gc is killed.

damaged.json names records by arena and offset, and a rewritten arena has
new offsets: an entry left naming the old file would hide the intact record
that now starts there. So before the rename that swaps arena n in, the
entries of arena n are written with the generation of the file they name
(the store ignores them once the arena has another), and damaged.json is
written without them at the end. Killed before that rename, they still
apply to the old file; after it, to nothing.
"""

import contextlib
import logging
import shutil
import time
from dataclasses import dataclass, field

from foundation.catalog import Catalog
from foundation.errors import DataCorrupt, Error, UsageError
from foundation.faults import crash_point
from foundation.gc import compact, mark, reflow, relayout
from foundation.store import format as F
from foundation.store import layout as L
from foundation.store import switch

log = logging.getLogger(__name__)

CRASH_ENV = switch.CRASH_ENV  # the store's switch marks its own points under the same variable


@dataclass
class Report:
    mode: str
    arenas: int = 0              # arenas in the log
    records: int = 0
    garbage: int = 0             # bytes of records nothing kept reaches (in sealed arenas, for hash mode)
    candidates: list = field(default_factory=list)  # arenas with enough garbage to rewrite
    rewritten: list = field(default_factory=list)
    blocked: list = field(default_factory=list)  # (arena, why)
    before: int = 0              # bytes of arena files before
    after: int = 0               # and after
    stopped: str = ""            # why gc stopped before rewriting every candidate
    relayout: bool = False       # the log was laid out again from arena relayout_from, the newest days first
    relayout_from: int = 0
    seconds: float = 0.0
    dry_run: bool = False

    @property
    def reclaimed(self):
        return self.before - self.after


def _crash(point):
    crash_point(CRASH_ENV, point)


def roots(cat):
    """Refs the kept snapshots start from: every tree and blob the catalog names."""
    return [r.ref for r in cat.live_roots()]


def catalog_roots(cat):
    """The current catalog: its record and its blob."""
    return [cat.ref, cat.blob.ref] if cat.ref is not None else []


def collect(store, min_garbage=0.1, max_time=None, target_free=None, dry_run=False, progress=None,
            relayout=None):
    """Run one gc over a writable store -> Report. relayout (hash mode): True rewrites the whole log,
    the newest days first (relayout.py), instead of the arenas worth it one by one; False never;
    None the tail of the log that the arena-by-arena rewrite would move for the most part anyway
    (_relayout_from)."""
    t0 = time.monotonic()
    if switch.pending(store.path):
        raise DataCorrupt("an interrupted gc switch is pending; reopen the store to finish it")
    if relayout and store.mode != "hash":
        raise UsageError("--relayout applies to compare-by-hash stores; a compare-by-value store's gc "
                         "already rewrites its log in order from the first arena worth it")
    if relayout and (max_time is not None or target_free is not None):
        raise UsageError("--relayout rewrites the whole log in one switch: it cannot stop early, so "
                         "--max-time and --target-free do not go with it")
    store.exclusive()
    cat = Catalog.load(store)
    arenas = mark.Arenas(store)
    rep = Report(store.mode, arenas=arenas.last + 1, dry_run=dry_run)
    rep.before = store.log_bytes()
    step = progress("marking", arenas.last + 1) if progress else None
    if store.mode == "hash":
        live = mark.mark_hash(store, roots(cat) + catalog_roots(cat), step)
        try:
            _unlisted_damage(store, arenas, live)
            if relayout:
                _relayout(store, arenas, live, cat, rep, dry_run, progress)
            else:
                _hash(store, arenas, live, cat, rep, min_garbage, max_time, target_free, dry_run, progress, t0,
                      relayout is None)
        finally:
            live.close()
    else:
        live = mark.mark_value(store, roots(cat), catalog_roots(cat), step)
        _value(store, arenas, live, cat, rep, min_garbage, dry_run, progress)
    rep.after = store.log_bytes()
    rep.seconds = time.monotonic() - t0
    return rep


def _unlisted_damage(store, arenas, live):
    """A damaged record that no summary lists (stepped over while its arena was open, or when a
    summary was rebuilt) is invisible to the mark: if it is a live tree node, what it names would
    go. Its header tells (type and key, unless the header itself is damaged); a live tree node
    with no intact copy of its block elsewhere stops gc."""
    listed = {}
    for a in sorted(store.bad):
        n, off = F.split(a)
        if n > arenas.last:
            continue
        if n not in listed:
            listed[n] = set(arenas.records(n)[1])
        if a in listed[n]:
            continue
        header = store.log.record_header(n, off)
        if L.is_record(header, 0) and (L.btype(header, 0) != F.TREE or L.key(header, 0) not in live):
            continue   # data, or a node no kept snapshot reaches: nothing live hangs from it
        try:
            store.read(L.key(header, 0))
        except Exception:
            raise DataCorrupt(f"arena {n} offset {off}: a damaged record that no summary lists, and no intact "
                              "copy of its block exists: gc cannot tell what it names, so it stopped before "
                              "changing anything. Run `foundation repair` (a replica or a disk image may heal "
                              "it); an archive that meets the block stores it again") from None


# ---- compare-by-hash: arena by arena ---------------------------------------------

def _hash(store, arenas, live, cat, rep, min_garbage, max_time, target_free, dry_run, progress, t0, auto):
    plans = []
    for n in range(arenas.last):  # the open arena is still being written: never rewritten
        p = compact.plan_hash(store, arenas, live, n)
        rep.records += len(p.keep)
        rep.garbage += p.garbage
        p.keep = None  # found again when the arena is rewritten: memory stays per arena
        if p.garbage and p.blocked:
            rep.blocked.append((n, p.blocked))
        elif p.garbage and p.share >= min_garbage:
            plans.append(p)
    # The most garbage first: a limited run frees the most space.
    plans.sort(key=lambda p: -p.garbage)
    rep.candidates = [p.arena for p in plans]
    first = _relayout_from(store, arenas, plans, rep, cat) if auto and max_time is None and target_free is None \
        else None
    if first is not None:
        # The tail first, through its switch (which rebuilds the index); then the arenas before
        # it one by one, which the switch leaves as they were.
        try:
            if _relayout(store, arenas, live, cat, rep, dry_run, progress, first, asked=False):
                plans = [p for p in plans if p.arena < first]
        except Error as e:
            if rep.rewritten:  # switched already: what failed is not the copy
                raise
            # Not asked for: the copy's files are gone (_undone_if_cut), the arenas are rewritten
            # one by one as before, and the user hears why.
            log.warning("gc could not lay the log out again (%s); it rewrites the arenas one by one", e)
            rep.relayout, rep.relayout_from = False, 0
            rep.candidates = [p.arena for p in plans]
    if dry_run or not plans:
        return
    step = progress("rewriting arenas", len(plans)) if progress else None
    store.index.mark_dirty()  # from the first swap on, index entries may name moved records
    freed = 0
    for k, p in enumerate(plans):
        if max_time is not None and time.monotonic() - t0 > max_time:
            rep.stopped = f"--max-time {max_time:g}s reached"
            break
        if target_free is not None and freed >= target_free:
            rep.stopped = f"--target-free reached ({freed:,} bytes freed)"
            break
        n = p.arena
        _, addrs, _, _ = arenas.records(n)
        p = compact.plan_hash(store, arenas, live, n, p.healed)
        tr = store.log.trailer(n)
        old = store.log.file_size(n)
        path, new, arrays = compact.rewrite(store, n, [addrs[i] for i in p.keep], tr.generation + 1,
                                            tr.chain, tr.sealed)
        if any(a >> 32 == n for a in store.bad):
            switch.save_damaged(store, (n, tr.generation))  # durable before the rename (module doc)
        _crash("gc.written")
        compact.swap(store, n, path, new, arrays)
        _crash("gc.swapped")
        store.forget_damaged(n)  # damaged records there were healed copies: dropped
        freed += old - store.log.file_size(n)
        rep.rewritten.append(n)
        if step:
            step(k + 1)
    _rebuild(store)


def _rebuild(store):
    """Index, Bloom filter, caches and damaged.json after records moved."""
    switch.save_damaged(store)
    store.rebuild_derived()


# ---- compare-by-value: one reflow from the first arena worth it ---------------------

def _value(store, arenas, live, cat, rep, min_garbage, dry_run, progress):
    first = None
    for n in range(arenas.last + 1):
        _, addrs, _, end = arenas.records(n)
        sizes = compact.record_sizes(addrs, end)
        flags = live.flags[n]
        g = sum(s for s, f in zip(sizes, flags) if not f)
        rep.records += sum(1 for f in flags if f & mark.LIVE)
        rep.garbage += g
        total = sum(sizes)
        if first is None and g and g / total >= min_garbage:
            first = n
    rep.candidates = [] if first is None else list(range(first, arenas.last + 1))
    if first is None or dry_run:
        return
    step = progress("rewriting arenas", arenas.last + 1 - first) if progress else None
    with _undone_if_cut(store):
        out, rel = reflow.reflow(store, arenas, live, first, step)
        if cat.ref is not None:
            new = Catalog()
            new._parse(reflow.translated_catalog(cat.serialize(), rel))
            new.generation = cat.generation
            new.commit(out)
        head = out.finish(store.commit().generation + 1)  # the switch is a commit: the number goes on
    _switch(store, arenas, first, out, head, rep)


@contextlib.contextmanager
def _undone_if_cut(store):
    """A new log being written beside the old one: if writing it fails (the disk full, Ctrl-C),
    its files go at once, so a full disk gets its space back now, not at the next open."""
    try:
        yield
    except BaseException:
        switch.drop_leftovers(store.path)
        raise


def _switch(store, arenas, first, out, head, rep):
    """Switch the new log (arenas first.., ended by head's commit) in through the journal."""
    _crash("gc.written")
    old_last = arenas.last
    store.suspend()  # nothing of the old log may be written after the journal; the locks stay
    switch.commit(store, first, out.files, old_last, head)
    _crash("gc.journaled")
    switch.finish(store.path)
    rep.rewritten = list(out.files)
    store.resume(switched=True)


# ---- compare-by-hash, --relayout: the log from one arena on, the newest days first -----------

RELAYOUT_SHARE = 0.75  # of a tail of the log's sealed bytes in arenas worth rewriting: gc lays it out
RELAYOUT_MIN = 2  # sealed arenas a tail holds at least to be laid out (one is a plain rewrite)
SCATTERED = 3.0  # relayout.scatter() from which the newest days are worth the whole log laid out...
WHOLE_COST = 3.0  # ...when the log holds at most this many times their disks' bytes


def _relayout_from(store, arenas, plans, rep, cat):
    """Where a plain gc lays the log out again, or None: from the first arena of the longest tail
    that the arena-by-arena rewrite would move for the most part anyway (RELAYOUT_SHARE of its
    sealed bytes): a year pruned at once moves nearly every arena (the tail is the whole log), a
    monthly prune the month's arenas, whose newest blocks then lie together. From arena 0 when
    the newest days lie SCATTERED and the log is small beside them (WHOLE_COST): months of such
    tails thin out as later nights overwrite their blocks, and the whole log gathers them again."""
    if store.bad:
        return None
    worth = {p.arena for p in plans}
    total = cand = 0
    first = None
    for n in range(arenas.last - 1, -1, -1):
        size = store.log.file_size(n)
        total += size
        cand += size if n in worth else 0
        if cand >= RELAYOUT_SHARE * total and arenas.last - n >= RELAYOUT_MIN:
            first = n
    if first != 0 and arenas.last >= RELAYOUT_MIN:
        ratio, disks = relayout.scatter(store, cat)
        if ratio >= SCATTERED and store.log_bytes() - rep.garbage <= WHOLE_COST * disks:
            log.info("the newest days lie over %.1f times the arenas they need: laying the whole log out again",
                     ratio)
            first = 0
    return first


def _relayout(store, arenas, live, cat, rep, dry_run, progress, first=0, asked=True):
    """Lay arenas first..last out again (relayout.py) -> whether it did (or, dry, would). Too little
    free space for the copy refuses what was asked (--relayout) and passes over what gc chose
    itself. first 0 (--relayout) also counts the report's records and garbage, which the
    arena-by-arena plan counts otherwise."""
    count = need = garbage = 0
    for n in range(first, arenas.last + 1):
        keys, addrs, types, end = arenas.records(n)
        for i, size in enumerate(compact.record_sizes(addrs, end)):
            if keys[i * 32:(i + 1) * 32] in live:
                count += 1
                need += size
            elif types[i] != F.COMMIT:
                garbage += size
    if store.bad:
        raise DataCorrupt(f"{len(store.bad)} damaged record(s) are listed: --relayout copies every live record "
                          "and would stop at them. Run `foundation repair` first, or a plain gc")
    free = shutil.disk_usage(store.path).free
    if need + store.arena_size > free:
        if not asked:
            log.info("gc rewrites the arenas one by one: laying arenas %d on out again would need %d bytes "
                     "free", first, need + store.arena_size)
            return False
        raise UsageError(f"--relayout writes the {need:,} bytes of live records beside the old log before "
                         f"it deletes that, and the store's disk has {free:,} bytes free: run a plain gc "
                         "first, or free space on that disk")
    if first == 0:
        rep.records, rep.garbage = count, garbage
    rep.candidates = sorted(set(rep.candidates) | set(range(first, arenas.last + 1)))
    rep.relayout, rep.relayout_from = True, first
    if dry_run:
        return True
    step = progress("laying out the log again", count, "records") if progress else None
    out = reflow.relog(store, arenas, first)
    with _undone_if_cut(store):
        if relayout.copy_live(store, arenas, live, cat, out, step, first) != count and step:
            step(count)  # the line ends even if a record counted twice was copied once
        head = out.finish(store.commit().generation + 1)
    _switch(store, arenas, first, out, head, rep)
    return True
