"""`foundation verify`: check every record and MAC; list what is damaged."""

from foundation.cli.common import open_store

NAME = "verify"
HELP = "check every record, arena MAC and the arena chain; exit 1 if anything is damaged"


def add_arguments(p):
    pass


def run(args):
    from foundation.store.verify import verify

    with open_store(args) as s:
        damage, checked = verify(s)
        arenas = s.log.open.n + 1
    for d in damage:
        print(f"DAMAGED {d}")
    if damage:
        print(f"{len(damage)} damaged place(s) in {arenas} arenas ({checked:,} records checked). "
              "Blocks in damaged records cannot be read; restore the arenas from a replica if you have one.")
        return 1
    print(f"ok: {checked:,} records in {arenas} arenas verified")
    return 0
