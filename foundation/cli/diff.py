"""`foundation diff NAME[@WHEN] NAME[@WHEN]`: the files that changed inside the guest between two snapshots.

The image trees say which blocks of each disk changed (changes.py), so
only the files whose blocks changed are ever read; a day that changed
nothing but free space lists nothing. Each disk's answer is printed only
once it is complete: a disk whose file systems cannot be read gets one
clear message and no lines, never a partial or wrong list.
"""

import json
import sys

from foundation.catalog import Catalog
from foundation.cli.common import open_store
from foundation.cli.restore import split_target
from foundation.errors import FilesUnreadable, NotFound, UsageError

NAME = "diff"
HELP = "list the files added, removed and modified inside the guest between two snapshots"
DESCRIPTION = (
    "List the files added, removed and modified inside the guest file systems between two snapshots "
    "(NAME@WHEN: the latest snapshot not after WHEN, as `restore` takes it). --json prints one object "
    "per line: disk, partition, path, change (added, removed, modified, type), size_before, size_after."
)


def add_arguments(p):
    p.add_argument("before", metavar="NAME[@WHEN]", help="the earlier snapshot (NAME alone: the newest)")
    p.add_argument("after", metavar="NAME[@WHEN]", help="the later snapshot (NAME alone: the newest)")
    p.add_argument("--disk", metavar="DISK", help="only this disk (e.g. vda)")
    p.add_argument("--json", action="store_true", help="one JSON object per line")


def need_tsk():
    """The guest file systems are read with pytsk3 (the `fuse` extra): say so if it is missing."""
    try:
        import pytsk3  # noqa: F401
    except ImportError:
        raise UsageError("reading guest files needs pytsk3: pip install pytsk3 (the `fuse` extra)") from None


def run(args):
    need_tsk()
    from foundation.snapshotfs.changes import TreeSource, human_line, label, snapshot_changes, summary

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
                changes = snapshot_changes(lambda s, d: TreeSource(store, s.disks[d]), a, b, disk, store)
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
