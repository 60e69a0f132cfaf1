"""`foundation forget NAME@WHEN... | #ID...`: take snapshots out of the catalog.

Every target is resolved before anything changes (an unknown name, a time
before a name's first snapshot, an unknown id: nothing is forgotten), then
the catalog is written again without them in one commit: a crash leaves
the old catalog or the new one. No block is deleted here; `foundation gc`
gives back what no kept snapshot reaches any more.

Forgetting a VM's newest snapshot is allowed: the archiver looks its
previous snapshot up by run id, finds nothing, and archives the whole disk
next time (blocks already in the store still dedup), since the changes it
tracks are relative to the forgotten snapshot and to no other.
"""

from foundation.catalog import Catalog, format_time, parse_time
from foundation.cli.common import open_store
from foundation.errors import BadInput, NotFound

NAME = "forget"
HELP = "take snapshots out of the catalog (their space comes back with `foundation gc`)"
DESCRIPTION = (
    "Take snapshots out of the catalog: NAME@WHEN is NAME's latest snapshot not after WHEN (as for "
    "restore: a bare date means the end of that day), #ID the snapshot with that id (see `foundation "
    "list`). Nothing is deleted from the store until `foundation gc`; blocks a kept snapshot shares stay."
)


def add_arguments(p):
    p.add_argument("targets", metavar="NAME@WHEN|#ID", nargs="+",
                   help="a snapshot: NAME@DATE, NAME@TIME (ISO 8601; local time without an offset) or #ID "
                        "(quote it in a shell: '#12')")
    p.add_argument("--dry-run", "-n", action="store_true", help="show what would be forgotten; change nothing")


def resolve(cat, target):
    """'NAME@WHEN' or '#ID' -> the Snapshot it names (the catalog's errors otherwise)."""
    if target.startswith("#") and "@" not in target:
        digits = target[1:]
        if not digits.isdigit():
            raise BadInput(f"{target!r}: an id is # followed by digits, e.g. #12")
        return cat.get(int(digits))
    name, at, when = target.partition("@")
    if not at or not name or not when:
        raise BadInput(f"{target!r}: give NAME@WHEN (a date or time) or #ID; "
                       f"`foundation list {name or 'NAME'}` shows the snapshots")
    return cat.find(name, parse_time(when, end_of_day=True))


def describe(snap):
    return f"{snap.name}@{format_time(snap.time)} (#{snap.id})"


def run(args):
    with open_store(args, writable=not args.dry_run) as store:
        cat = Catalog.load(store)
        chosen = {}  # id -> (snapshot, the first target that named it)
        for t in args.targets:
            try:
                snap = resolve(cat, t)
            except NotFound as e:
                if not t.startswith("#"):
                    raise
                raise NotFound(f"{t}: {e}; `foundation list` shows every id") from None
            chosen.setdefault(snap.id, (snap, t))
        snaps = sorted((s for s, _ in chosen.values()), key=lambda s: (s.time, s.id))
        notes = _notes(cat, snaps, args.dry_run)
        if not args.dry_run:
            cat.forget(list(chosen))
            cat.commit(store)
    verb = "would forget" if args.dry_run else "forgot"
    for s in snaps:
        print(f"{verb} {describe(s)}  [{chosen[s.id][1]}]")
    for note in notes:
        print(f"note: {note}")
    if args.dry_run:
        print(f"dry run: {len(snaps)} snapshot(s) would be forgotten; nothing changed")
    else:
        print(f"{len(snaps)} snapshot(s) forgotten. Their space comes back only with `foundation gc` "
              f"(blocks that kept snapshots share stay).")
    return 0


def _notes(cat, snaps, dry_run):
    """What forgetting `snaps` means beyond the list: a VM's newest gone, a name left empty."""
    out = []
    going = {s.id for s in snaps}
    would = "would be" if dry_run else "is"
    for name in sorted({s.name for s in snaps}):
        mine = cat.snapshots(name)
        if mine[-1].id in going and mine[-1].meta.get("run"):
            out.append(f"{name}'s newest snapshot {would} forgotten: its next archive reads its whole disks "
                       f"(blocks already in the store still dedup)")
        if all(x.id in going for x in mine):
            out.append(f"no snapshot of {name} {would} left")
    return out
