"""`foundation accept-rollback`: take the store as it is now as this host's newest commit.

A store older than the newest commit this host saw of it (a restored
image, a cloned disk) is refused to every writer (exit 26). When that
older copy is what the user means to keep, this command says what is
given up and records the store's own head as the newest: the next archive
writes on from it. A replica that holds the newer days keeps them until
`replicate --force` (its own guard, exit 54).
"""

from foundation.cli.common import open_store, watch

NAME = "accept-rollback"
HELP = "accept a store older than this host last saw (a restored image or cloned disk) as its newest state"


def add_arguments(p):
    pass


def run(args):
    with open_store(args, writable=False, seed=True) as s:
        why, head = s.rolled_back, s.log.head
        if why:
            s.watch = watch(args)
            s.record_head()
    if not why:
        print(f"store {s.path} is not older than this host saw; nothing to accept")
        return 0
    print(f"accepted: {why}.")
    print(f"This host now takes arena {head.arena} offset {head.end} as the newest commit of store {s.path}; "
          "commits after it are given up here (a replica that holds them keeps them until `replicate --force`).")
    return 0
