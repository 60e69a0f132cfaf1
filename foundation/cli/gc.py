"""`foundation gc`: reclaim the space of blocks no kept snapshot reaches.

Run after `forget` or `prune`. The store stays usable at every moment:
killed at any point, every kept snapshot still restores and the next gc
(or any archive, for a compare-by-value switch) finishes the job.
"""

import sys
import time

from foundation.catalog import format_size as human
from foundation.cli.common import after_write, open_store, size
from foundation.errors import UsageError

NAME = "gc"
HELP = "reclaim the space of blocks that no kept snapshot reaches (after forget/prune)"
DESCRIPTION = (
    "Mark every block the kept snapshots reach (backward sweeps of the log), then rewrite the arenas "
    "whose share of garbage is at least --min-garbage without it. Needs the store to itself: unmount the "
    "/snapshot tree first. Replicas named in the config follow at the end."
)


def add_arguments(p):
    p.add_argument("--dry-run", action="store_true", help="mark and report what gc would reclaim; change nothing")
    p.add_argument("--min-garbage", type=float, default=10.0, metavar="PCT",
                   help="rewrite an arena only if at least PCT %% of it is garbage (default 10)")
    p.add_argument("--max-time", type=float, metavar="SECONDS",
                   help="stop rewriting after this long (compare-by-hash stores; the next gc goes on)")
    p.add_argument("--target-free", type=size, metavar="SIZE",
                   help="stop once this much space is free again, e.g. 20G (compare-by-hash stores)")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--relayout", action="store_true", default=None,
                     help="compare-by-hash stores: rewrite the whole log, the newest day of each VM first in disk "
                          "order, so that recent days restore front to back after years of nights (needs free "
                          "space for the live data). A plain gc does the same for the tail of the log in which at "
                          "least 75%% would be rewritten anyway, when the space is there")
    how.add_argument("--in-place", dest="relayout", action="store_false",
                     help="compare-by-hash stores: only rewrite the arenas worth it, one by one, never the whole log")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--no-replicate", action="store_true", help="do not update the configured replicas afterwards")


class _Steps:
    """`gc: marking 12/40` on a terminal, nothing otherwise."""

    def __init__(self):
        self.on = sys.stderr.isatty()

    def __call__(self, what, total, unit="arenas"):
        last = [0.0]

        def step(done):
            now = time.monotonic()
            if self.on and (now - last[0] > 0.2 or done >= total):
                last[0] = now
                sys.stderr.write(f"\rgc: {what} {done:,}/{total:,} {unit} ")
                if done >= total:
                    sys.stderr.write("\n")
                sys.stderr.flush()
        return step


def run(args):
    from foundation.gc import collect

    if not 0 <= args.min_garbage <= 100:
        raise UsageError(f"--min-garbage must be a percentage from 0 to 100, not {args.min_garbage:g}")
    with open_store(args, writable=True) as store:
        if store.mode == "value" and (args.max_time is not None or args.target_free is not None):
            print("gc: note: --max-time and --target-free do not apply to a compare-by-value store: its log is "
                  "rewritten from the first arena worth it in one journaled pass", file=sys.stderr)
        rep = collect(store, min_garbage=args.min_garbage / 100, max_time=args.max_time,
                      target_free=args.target_free, dry_run=args.dry_run, progress=_Steps(),
                      relayout=args.relayout)
    if not (args.dry_run or args.no_replicate):
        _replicate(args)  # also after a gc that only finished an interrupted one: the log changed then too
    if args.json:
        import dataclasses
        import json
        print(json.dumps({**dataclasses.asdict(rep), "reclaimed": rep.reclaimed}))
        return 0
    print(f"marked: {rep.records:,} live records in {rep.arenas} arenas; "
          f"{human(rep.garbage)} of garbage{' in sealed arenas' if rep.mode == 'hash' and not rep.relayout else ''}")
    for n, why in rep.blocked:
        print(f"skipped arena {n}: {why}")
    if rep.dry_run:
        print(f"dry run: {len(rep.candidates)} arena(s) would be rewritten; nothing changed")
        return 0
    if rep.relayout:
        part = f"the log from arena {rep.relayout_from} on" if rep.relayout_from else "the log"
        print(f"laid {part} out again, the newest day of each VM first, and rewrote {len(rep.rewritten)} arena(s) "
              f"in place of {len(rep.candidates)}; reclaimed {human(rep.reclaimed)} ({human(rep.before)} -> "
              f"{human(rep.after)}) in {rep.seconds:.1f} s")
        return 0
    print(f"rewrote {len(rep.rewritten)} of {len(rep.candidates)} arena(s); reclaimed {human(rep.reclaimed)} "
          f"({human(rep.before)} -> {human(rep.after)}) in {rep.seconds:.1f} s")
    if rep.stopped:
        print(f"stopped early: {rep.stopped}; run gc again to go on")
    return 0


def _replicate(args):
    """Replicas follow: a rewritten arena replaces the old one remotely (after the new manifest)."""
    after_write(args)
