"""`foundation verify`: check every record and MAC; list what is damaged."""

import json

from foundation.cli.common import open_store
from foundation.errors import RolledBack

NAME = "verify"
HELP = "check every record, arena MAC and the arena chain; exit 1 if anything is damaged"


def add_arguments(p):
    p.add_argument("--json", action="store_true", help="print JSON (schema in docs/operation.md)")


def run(args):
    from foundation.catalog.salvage import days_affected
    from foundation.store.verify import Kind, verify

    with open_store(args) as s:
        notes = []
        damage, checked = verify(s, notes=notes)
        arenas = s.log.open.n + 1
        rolled_back = s.rolled_back
        cost = days_affected(s, damage)
    if rolled_back:
        # Every MAC of an older copy verifies: only the host's record tells.
        print(f"ROLLED BACK {RolledBack(rolled_back)}")
    failed = RolledBack.code if rolled_back else 1
    if args.json:
        print(json.dumps({"version": 1, "ok": not damage and not rolled_back, "records": checked, "arenas": arenas,
                          "rolled_back": rolled_back or "",
                          "damaged": [{"arena": d.arena, "offset": d.offset, "what": d.what, "record": d.record,
                                       "kind": d.kind.value} for d in damage],
                          "notes": [str(d) for d in notes], "affected": cost}, indent=2, sort_keys=True))
        return failed if damage or rolled_back else 0
    for d in notes:
        print(f"note: {d}")
    for d in damage:
        print(f"DAMAGED {d}")
    for line in cost:
        print(f"LOST {line}")
    if damage and all(d.kind is Kind.HEAD_COPY for d in damage):
        print(f"every record is intact ({checked:,} records in {arenas} arenas); only a head copy is damaged: "
              "run `foundation rebuild` (or any archive) to rewrite it")
        return 1
    if damage:
        print(f"{len(damage)} damaged place(s) in {arenas} arenas ({checked:,} records checked). "
              "Blocks in damaged records cannot be read; restore the arenas from a replica if you have one.")
        return failed
    print(f"{'records intact' if rolled_back else 'ok'}: {checked:,} records in {arenas} arenas verified")
    return failed if rolled_back else 0
