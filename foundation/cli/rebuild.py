"""`foundation rebuild`: rebuild summaries, index and Bloom filter from the arenas."""

from foundation.cli.common import open_store

NAME = "rebuild"
HELP = "rebuild the summaries, index and Bloom filter from the arenas (they are derived)"


def add_arguments(p):
    pass


def run(args):
    from foundation.store.rebuild import rebuild

    with open_store(args, writable=True) as s:
        for r in s.repaired:
            print(f"repaired: {r}")
        n = rebuild(s)
    print(f"rebuilt summaries, index and Bloom filter for {n:,} records")
    return 0
