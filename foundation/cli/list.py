"""`foundation list [NAME]`: the snapshots in the catalog, oldest first.

One line per snapshot: name, id, time (UTC), logical size, and the bytes
the store grew by when it was archived. --json prints the catalog entries
themselves (with tree roots and metadata) for scripts.
"""

import json
import sys

from foundation.catalog import Catalog, UnknownName, format_time
from foundation.catalog import format_size as human
from foundation.catalog.salvage import newer_catalog_lost
from foundation.cli.common import open_store

NAME = "list"
HELP = "list snapshots with time, size and bytes added"


def add_arguments(p):
    p.add_argument("name", metavar="NAME", nargs="?", help="only the snapshots of this VM or image")
    p.add_argument("--json", action="store_true", help="print JSON (a list of catalog entries)")


def run(args):
    with open_store(args, writable=False) as store:
        cat = Catalog.load(store)
        short = newer_catalog_lost(store) if store.log.lost or store.bad else None
    if short:
        print(f"warning: {short}", file=sys.stderr)
    snaps = cat.snapshots(args.name)
    if args.name is not None and not snaps:
        cat.find(args.name)  # raises UnknownName with the known names
        raise UnknownName(args.name, "")
    if args.json:
        out = []
        for s in snaps:
            d = s.to_json()
            d["size"] = s.size
            out.append(d)
        print(json.dumps(out, indent=2, sort_keys=True))
        return 0
    if not snaps:
        return 0
    rows = [("NAME", "ID", "TIME (UTC)", "SIZE", "ADDED", "DISKS")]
    for s in snaps:
        rows.append((s.name, str(s.id), format_time(s.time)[:19].replace("T", " "), human(s.size),
                     human(s.added_bytes), ",".join(sorted(s.disks))))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    right = {1, 3, 4}
    for r in rows:
        print("  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip())
    return 0
