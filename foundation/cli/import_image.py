"""`foundation import-image NAME IMAGE`: archive a disk image file as a snapshot of NAME.

The image becomes a tree in the store (foundation.image) and a catalog
entry (foundation.catalog), committed with one store sync at the end: a
crash at any point leaves the catalog as it was, and every earlier snapshot
restorable. With `--changed`, only the listed byte ranges are read and the
tree of NAME's previous snapshot (the latest not after --at) is patched;
without it the whole image is read and unchanged blocks dedup away. A NAME
without a previous snapshot refuses --changed: a list of changes relative
to nothing is a caller's bug, and silently reading everything would hide it.
"""

import logging
import os
import sys
import time
from datetime import datetime, timezone

from foundation.catalog import Catalog, DiskEntry, Snapshot, check_name, check_time, format_time, parse_time
from foundation.cli.common import Progress, after_write, open_store
from foundation.errors import BadInput
from foundation.image import load_changed, write_image
from foundation.image.source import Opening

NAME = "import-image"
HELP = "archive a raw or qcow2 disk image file as a snapshot of NAME"
DESCRIPTION = (
    "Archive a disk image file (raw, or qcow2 with its backing chain and compressed clusters) "
    "as a snapshot of NAME. Blocks already in the store cost nothing."
)

log = logging.getLogger(__name__)


class NoPrevious(BadInput):
    """--changed lists changes since the previous snapshot of {!r} (disk {}), but it has none at or before {}. Import the whole image first (without --changed)."""

    code = 35


def add_arguments(p):
    p.add_argument("name", metavar="NAME", help="the VM or image the snapshot belongs to")
    p.add_argument("image", metavar="IMAGE", help="the image file (raw, qcow2, or any format qemu-img reads)")
    p.add_argument("--at", metavar="TIME",
                   help="time of the snapshot, ISO 8601 (default: now); without an offset it is local time, "
                        "and a bare date is that day's midnight")
    p.add_argument("--changed", metavar="RANGES.json",
                   help="JSON list of [offset, length] byte ranges that differ from NAME's previous snapshot; "
                        "only these are read ('-': standard input)")
    p.add_argument("--format", metavar="FMT", help="image format (default: as qemu-img probes it)")
    p.add_argument("--disk", metavar="DISK", default="vda", help="the disk's name in the snapshot (default: vda)")


def run(args):
    check_name(args.name)
    when = check_time(parse_time(args.at)) if args.at else datetime.now(timezone.utc)
    t0 = time.monotonic()
    opening = Opening(args.image, args.format)  # the format probe runs while the store opens
    src = None
    try:
        with open_store(args, writable=True) as store:
            cat = Catalog.load(store)
            src = opening.result()
            changed = load_changed(args.changed, src.size) if args.changed else None
            prev = cat.latest(args.name, when)
            if prev is not None and prev.time == when:
                from foundation.catalog import DuplicateSnapshot

                raise DuplicateSnapshot(args.name, format_time(when), prev.id)
            prev_root = prev.disks[args.disk].root if prev is not None and args.disk in prev.disks else None
            if changed is not None and prev_root is None:
                raise NoPrevious(args.name, args.disk, format_time(when))
            anyprev = cat.latest(args.name)
            before = _log_mark(store)
            progress = Progress(f"{args.name}", src.size)
            root = write_image(store, src, src.size, prev=prev_root, changed=changed, progress=progress)
            progress.finish()
            added = _log_added(store, before)
            snap = Snapshot(
                id=None,
                name=args.name,
                uuid=anyprev.uuid if anyprev is not None else _new_uuid(),
                time=when,
                disks={args.disk: DiskEntry(root, src.size)},
                meta={"how": "import-image",
                      "source": {"path": os.path.abspath(args.image), "format": src.format,
                                 "changed_only": changed is not None}},
                added_bytes=added,
            )
            cat.add(snap)
            cat.commit(store)
    finally:
        opening.close()
        if src is not None:
            src.close()
    dt = time.monotonic() - t0
    msg = (f"{args.name}@{format_time(when)}: snapshot {snap.id}, {src.size / 1e6:,.1f} MB image, "
           f"{added / 1e6:,.1f} MB added, {dt:.1f} s")
    if sys.stderr.isatty():
        print(msg, file=sys.stderr)
    else:
        log.debug(msg)
    after_write(args)  # configured replicas; a failure there only warns
    return 0


def _new_uuid():
    import uuid  # here: only a name's first snapshot needs one (uuid imports platform)

    return str(uuid.uuid4())


def _log_mark(store):
    f = getattr(store, "log_mark", None)
    return f() if f is not None else None


def _log_added(store, mark):
    return store.log_bytes_since(mark) if mark is not None else 0
