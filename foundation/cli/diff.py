"""`foundation diff NAME@WHEN NAME@WHEN`: the files that changed inside the guest between two snapshots.

The image trees say which blocks of each disk changed (changes.py), so
only the files whose blocks changed are ever read; a day that changed
nothing but free space lists nothing. Each disk's answer is printed only
once it is complete: a disk whose file systems cannot be read gets one
clear message and no lines, never a partial or wrong list.
"""

import json
import sys

from foundation.catalog import Catalog, format_time
from foundation.cli.common import open_store
from foundation.cli.list import human
from foundation.cli.restore import split_target
from foundation.errors import NotFound
from foundation.snapshotfs.changes import FilesUnreadable, Side, changed_ranges, compare_disks
from foundation.snapshotfs.filesindex import Reader

NAME = "diff"
HELP = "list the files added, removed and modified inside the guest between two snapshots"
DESCRIPTION = (
    "List the files added, removed and modified inside the guest file systems between two snapshots "
    "(NAME@WHEN: the latest snapshot not after WHEN, as `restore` takes it). --json prints one object "
    "per line: disk, partition, path, change (added, removed, modified, type), size_before, size_after."
)

MARK = {"added": "+", "removed": "-", "type": "T"}


def add_arguments(p):
    p.add_argument("before", metavar="NAME@WHEN", help="the earlier snapshot")
    p.add_argument("after", metavar="NAME@WHEN", help="the later snapshot")
    p.add_argument("--disk", metavar="DISK", help="only this disk (e.g. vda)")
    p.add_argument("--json", action="store_true", help="one JSON object per line")


def label(snap):
    return f"{snap.name}@{format_time(snap.time)}"


def disk_changes(store, a, b, disk):
    """[Change] between snapshots a and b of one disk; raises FilesUnreadable."""
    ea, eb = a.disks.get(disk), b.disks.get(disk)
    sa = Side(Reader(store, ea), f"{label(a)} disk {disk}") if ea else None
    sb = Side(Reader(store, eb), f"{label(b)} disk {disk}") if eb else None
    ranges = changed_ranges(store, ea.root, eb.root) if ea and eb else None
    return list(compare_disks(sa, sb, ranges, disk))


def show_path(c):
    return f"{c.disk}/{c.partition}{c.path}" if c.partition else f"{c.disk}{c.path}"


def human_line(c):
    if c.change == "modified":
        mark = "M" if c.content else "U"
    else:
        mark = MARK[c.change]
    path = show_path(c) + ("/" if (c.after or c.before).is_dir else "")
    if c.change == "added":
        what = human(c.to_json()["size_after"])
    elif c.change == "removed":
        what = human(c.to_json()["size_before"])
    elif c.change == "type":
        what = f"{c.to_json()['type_before']} -> {c.to_json()['type_after']}"
    elif c.content:
        what = f"{human(c.before.size)} -> {human(c.after.size)}"
    else:
        what = "metadata only"
    return f"{mark}  {path}  ({what})"


def summary(changes):
    n = {k: sum(1 for c in changes if c.change == k) for k in ("added", "removed", "modified", "type")}
    grew = sum((c.to_json()["size_after"] or 0) - (c.to_json()["size_before"] or 0) for c in changes)
    return (f"{n['added']} added, {n['removed']} removed, {n['modified']} modified, "
            f"{n['type']} changed type; {'+' if grew >= 0 else '-'}{human(abs(grew))}")


def run(args):
    status = 0
    with open_store(args, writable=False) as store:
        cat = Catalog.load(store)
        a = cat.find(*split_target(args.before))
        b = cat.find(*split_target(args.after))
        disks = sorted(set(a.disks) | set(b.disks))
        if args.disk is not None:
            if args.disk not in disks:
                raise NotFound(f"neither {label(a)} nor {label(b)} has a disk {args.disk!r}; "
                               f"their disks: {', '.join(disks)}")
            disks = [args.disk]
        if not args.json:
            print(f"comparing {label(a)} and {label(b)}")
        every = []
        for disk in disks:
            try:
                changes = disk_changes(store, a, b, disk)
            except FilesUnreadable as e:
                sys.stdout.flush()
                print(f"foundation: {e}", file=sys.stderr)
                status = e.code
                continue
            every += changes
            for c in changes:
                print(json.dumps(c.to_json(), ensure_ascii=False) if args.json else human_line(c))
        if not args.json:
            print(summary(every))
    return status
