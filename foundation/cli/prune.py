"""`foundation prune`: forget the snapshots a retention policy does not keep.

The policy (catalog/retention.py) comes from the --keep-* options, or, when
none is given, from the config file's `[retention]` table; with neither,
prune refuses to run. It is applied to each name on its own, and the
newest snapshot of each name is always kept. Like `forget`, prune only
writes a new catalog, in one commit; `foundation gc` gives the space back.
"""

import argparse

from foundation.catalog import Catalog
from foundation.catalog.retention import KEYS, Policy, decide
from foundation.cli.common import open_store, settings
from foundation.errors import UsageError

NAME = "prune"
HELP = "forget every snapshot a retention policy (--keep-daily N, ...) does not keep"
DESCRIPTION = (
    "Forget the snapshots that no rule keeps, for each NAME (default: every name). --keep-daily N keeps "
    "the newest snapshot of each of the N most recent days that have one; likewise --keep-weekly (ISO "
    "weeks, Monday first), --keep-monthly and --keep-yearly; --keep-last N keeps the N newest. A snapshot "
    "kept by any rule stays, and each name's newest snapshot always stays. Days, weeks, months and years "
    "are in the local time zone (TZ), the same days as the /snapshot/YYYY/MM/DD tree. Without any --keep "
    "option the config file's [retention] table is used (keep_daily = 7, ...). Nothing is deleted from "
    "the store until `foundation gc`."
)


class NoPolicy(UsageError):
    """No retention policy: give at least one of --keep-last, --keep-daily, --keep-weekly, --keep-monthly, --keep-yearly with a count above 0, or a [retention] table in the config file ({}). Refusing to prune with no policy: it would forget every snapshot but each name's newest."""

    code = 2


RULE_HELP = {
    "last": "keep the N newest snapshots",
    "daily": "keep the newest snapshot of each of the N latest days that have one",
    "weekly": "the same for ISO weeks (Monday to Sunday)",
    "monthly": "the same for months",
    "yearly": "the same for years",
}


def add_arguments(p):
    p.add_argument("names", metavar="NAME", nargs="*", help="only these VMs or images (default: all)")
    for key in KEYS:
        rule = key[len("keep_"):]
        p.add_argument(f"--keep-{rule}", type=_count, metavar="N", help=RULE_HELP[rule])
    p.add_argument("--dry-run", "-n", action="store_true",
                   help="show every snapshot with keep/forget and the rule that keeps it; change nothing")


def _count(text):
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative whole number, not {text!r}")
    return n


def policy_of(args):
    """The --keep-* options if any is given, else the config's [retention] table."""
    given = {k[len("keep_"):]: getattr(args, k) for k in KEYS if getattr(args, k) is not None}
    if given:
        policy, source = Policy(**given), "command line"
    else:
        from foundation.config import DEFAULT_PATH

        conf = settings(args).config
        policy = Policy.from_config(conf.section("retention"), conf.path or DEFAULT_PATH)
        source = conf.path or f"{DEFAULT_PATH}, absent"
    if policy.empty:
        raise NoPolicy(source)
    return policy


def run(args):
    policy = policy_of(args)
    with open_store(args, writable=not args.dry_run) as store:
        cat = Catalog.load(store)
        for name in args.names:
            cat.find(name)  # UnknownName, listing the known names
        names = set(args.names) or set(cat.names())
        decisions = decide([s for s in cat.snapshots() if s.name in names], policy)
        going = [d.snapshot for d in decisions if not d.keep]
        if going and not args.dry_run:
            cat.forget([s.id for s in going])
            cat.commit(store)
    print(f"policy: {policy.describe()}")
    for d in decisions:
        if args.dry_run or not d.keep:
            s = d.snapshot
            why = ", ".join(d.reasons) if d.keep else "no rule keeps it"
            print(f"{'keep' if d.keep else 'forget':6}  {s.name}  #{s.id}  {_local(s.time)}  {why}")
    kept = len(decisions) - len(going)
    if args.dry_run:
        print(f"dry run: {len(going)} snapshot(s) would be forgotten, {kept} kept; nothing changed")
    elif going:
        print(f"{len(going)} snapshot(s) forgotten, {kept} kept. Their space comes back only with "
              f"`foundation gc` (blocks that kept snapshots share stay).")
    else:
        print(f"nothing to forget: the policy keeps all {kept} snapshot(s)")
    return 0


def _local(t):
    return t.astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")

