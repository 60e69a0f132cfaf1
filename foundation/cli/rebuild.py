"""`foundation rebuild`: rebuild summaries, index and Bloom filter from the arenas, salvaging around damage."""

from foundation.cli.common import open_store

NAME = "rebuild"
HELP = ("rebuild the summaries, index and Bloom filter from the arenas (they are derived); "
        "exit 1 if some days need blocks that are lost")


def add_arguments(p):
    p.add_argument("--salvage", action="store_true",
                   help="also go on without a lost newest arena (its records stay lost; new ones go to the next)")


def run(args):
    from foundation.catalog.salvage import days_affected, recover_catalog
    from foundation.store.rebuild import rebuild

    with open_store(args, writable=True, salvage=args.salvage) as s:
        for r in s.repaired:
            print(f"repaired: {r}")
        n = rebuild(s)
        catalog = recover_catalog(s) if args.salvage else []
        lost = list(s.log.lost)
        cost = days_affected(s, bool(lost or s.bad))
    print(f"rebuilt summaries, index and Bloom filter for {n:,} records")
    for line in catalog:
        print(f"catalog: {line}")
    for m, lo, hi in lost:
        print(f"lost: arena {m} bytes {lo}-{hi - 1}")
    for line in cost:
        print(f"LOST {line}")
    if cost:
        print("Some days need blocks that could not be brought back (LOST above); every other day restores whole. "
              "A replica can restore the damaged arenas.")
        return 1
    return 0
