"""`foundation restore NAME[@WHEN] OUTPUT`: one archived disk back to a file.

WHEN is a date or a time (ISO 8601); the snapshot is the latest one not
after it (a bare date: not after the end of that day), or the newest one
without @WHEN. The blocks of each window of the image (64 MiB, growing to
256 MiB) are read in log order, each arena once, front to back (foundation.image.reader);
all-zero blocks become holes, so the raw output is as sparse as the image. The file appears under its name only when
complete; an existing OUTPUT is replaced only with --force.
"""

import os
import sys
import time

from foundation.catalog import Catalog, format_time, parse_time
from foundation.cli.common import Progress, open_store
from foundation.catalog.salvage import line, newer_catalog_lost
from foundation.errors import BadInput, DataCorrupt, NotFound
from foundation.image import restore_image
from foundation.image.lost import lost_ranges

NAME = "restore"
HELP = "write a snapshot's disk image to a raw or qcow2 file"


class OutputExists(BadInput):
    """{} already exists; pass --force to replace it."""

    code = 36


def add_arguments(p):
    p.add_argument("target", metavar="NAME[@WHEN]",
                   help="the VM or image, and optionally a date or time: the latest snapshot not after it")
    p.add_argument("output", metavar="OUTPUT", help="the file to write")
    p.add_argument("--format", choices=("raw", "qcow2"),
                   help="output format (default: qcow2 if OUTPUT ends in .qcow2, else raw)")
    p.add_argument("--disk", metavar="DISK", help="which disk of the snapshot (needed when it has several)")
    p.add_argument("--force", action="store_true", help="replace OUTPUT if it exists")


def split_target(target):
    """'NAME[@WHEN]' -> (name, aware UTC datetime or None)."""
    name, at, when = target.partition("@")
    if not name:
        raise BadInput(f"{target!r}: expected NAME or NAME@WHEN")
    return name, (parse_time(when, end_of_day=True) if at else None)


def raise_lost(store, snap, disk, entry, err):
    """A damaged day: name every byte range that is lost, not just the first bad block."""
    ranges = lost_ranges(store, entry.root)
    if not ranges:
        raise err
    first = err.args[0] if err.args else err
    raise DataCorrupt(f"{line(snap, disk, ranges)}; the first unreadable block: {first}; nothing was written. "
                      "Days that need none of these blocks restore whole (`foundation verify` names them)")


def run(args):
    name, when = split_target(args.target)
    fmt = args.format or ("qcow2" if args.output.endswith(".qcow2") else "raw")
    if os.path.lexists(args.output) and not args.force:
        raise OutputExists(args.output)
    t0 = time.monotonic()
    with open_store(args, writable=False) as store:
        snap = Catalog.load(store).find(name, when)
        short = newer_catalog_lost(store) if store.log.lost or store.bad else None
        if short and (when is None or when > snap.time):
            raise DataCorrupt(f"{short}, so {name!r} at {args.target.partition('@')[2] or 'its newest'} may not be "
                              f"the snapshot found ({format_time(snap.time)}); to restore that one, name its time "
                              f"exactly: {name}@{format_time(snap.time)}")
        if args.disk is not None:
            if args.disk not in snap.disks:
                raise NotFound(f"snapshot {snap.id} of {name!r} ({format_time(snap.time)}) has no disk "
                               f"{args.disk!r}; its disks: {', '.join(sorted(snap.disks))}")
            disk = args.disk
        elif len(snap.disks) == 1:
            (disk,) = snap.disks
        else:
            raise BadInput(f"snapshot {snap.id} of {name!r} has several disks "
                           f"({', '.join(sorted(snap.disks))}): choose one with --disk")
        entry = snap.disks[disk]
        progress = Progress(f"restore {name}", entry.size)
        try:
            restore_image(store, entry.root, args.output, fmt=fmt, progress=progress)
        except (DataCorrupt, NotFound) as e:
            raise_lost(store, snap, disk, entry, e)
        progress.finish()
    if sys.stderr.isatty():
        dt = time.monotonic() - t0
        print(f"{name}@{format_time(snap.time)} disk {disk}: {entry.size / 1e6:,.1f} MB to {args.output} "
              f"({fmt}) in {dt:.1f} s", file=sys.stderr)
    return 0
