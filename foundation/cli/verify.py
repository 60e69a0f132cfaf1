"""`foundation verify`: check every record and MAC; list what is damaged."""

import json

from foundation.cli.common import open_store

NAME = "verify"
HELP = "check every record, arena MAC and the arena chain; exit 1 if anything is damaged"


def add_arguments(p):
    p.add_argument("--json", action="store_true", help="print JSON (schema in docs/operation.md)")


def run(args):
    from foundation.catalog.salvage import days_affected
    from foundation.store.verify import verify

    with open_store(args) as s:
        notes = []
        damage, checked = verify(s, notes=notes)
        arenas = s.log.open.n + 1
        cost = days_affected(s, damage)
    if args.json:
        print(json.dumps({"version": 1, "ok": not damage, "records": checked, "arenas": arenas,
                          "damaged": [{"arena": d.arena, "offset": d.offset, "what": d.what, "record": d.record,
                                       "kind": d.kind.value} for d in damage],
                          "notes": [str(d) for d in notes], "affected": cost}, indent=2, sort_keys=True))
        return 1 if damage else 0
    for d in notes:
        print(f"note: {d}")
    for d in damage:
        print(f"DAMAGED {d}")
    for line in cost:
        print(f"LOST {line}")
    if damage:
        print(f"{len(damage)} damaged place(s) in {arenas} arenas ({checked:,} records checked). "
              "Blocks in damaged records cannot be read; restore the arenas from a replica if you have one.")
        return 1
    print(f"ok: {checked:,} records in {arenas} arenas verified")
    return 0
