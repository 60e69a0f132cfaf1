"""`foundation find PATTERN`: every VM, day and path whose name matches, and where it changed.

Searches the file listings of filesindex.py, brought up to date first:
snapshots archived since the last search are indexed against the day
before them, reading only what changed. A snapshot whose file systems
cannot be read is named on stderr and the exit status says so; it is
never searched as if it were empty.
"""

import json
import logging
import sys

from foundation.catalog import Catalog, format_size, format_time, parse_time
from foundation.cli.common import open_store, settings
from foundation.errors import FilesUnreadable

log = logging.getLogger(__name__)

NAME = "find"
HELP = "find files by name in every archived day of every VM"
DESCRIPTION = (
    "Every VM, day and path whose file name matches PATTERN (a glob: *, ?, [...]; matched against "
    "the whole path inside the guest file system when it holds a slash), with its size and whether "
    "its content changed since the previous day the path was seen. --json prints one object per line: "
    "vm, snapshot (NAME@TIME, as `restore` takes it), day, disk, partition, path, size, changed."
)


def add_arguments(p):
    p.add_argument("pattern", metavar="PATTERN", help="a glob on the file name, or on the path if it holds a /")
    p.add_argument("--vm", metavar="NAME", action="append", help="only this VM or image (repeatable)")
    p.add_argument("--since", metavar="WHEN", help="only snapshots taken on or after this date or time")
    p.add_argument("--until", metavar="WHEN", help="only snapshots taken on or before this date or time")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.add_argument("--rebuild", action="store_true", help="drop the file listings and index every snapshot again")
    p.add_argument("--state-dir", help="where the listings live (default: config `state_dir`; "
                                       "env FOUNDATION_STATE_DIR)")


def run(args):
    from foundation.cli.diff import need_tsk

    need_tsk()
    from foundation.snapshotfs.changes import show_path
    from foundation.snapshotfs.filesindex import FilesIndex

    since = format_time(parse_time(args.since)) if args.since else None
    until = format_time(parse_time(args.until, end_of_day=True)) if args.until else None
    with open_store(args, writable=False) as store:
        cat = Catalog.load(store)
        for vm in args.vm or ():
            cat.find(vm)                  # an unknown name is an error naming the known ones
        idx = FilesIndex(settings(args).state_dir, store.uuid)
        try:
            if args.rebuild:
                idx.clear()
            idx.update(store, cat, args.vm)
            live = {s.id for s in cat.snapshots()}
            rows = idx.search(args.pattern, live, set(args.vm) if args.vm else None, since, until)
            errors = [e for e in idx.errors(set(args.vm) if args.vm else None)]
        finally:
            idx.close()
    status = 0
    out = sys.stdout
    for vm, t, sid, disk, part, path, size, kind, changed in rows:
        if args.json:
            out.write(json.dumps({"vm": vm, "snapshot": f"{vm}@{t}", "day": t[:10], "disk": disk, "partition": part,
                                  "path": path, "size": size, "changed": changed, "type": kind, "id": sid},
                                 ensure_ascii=False) + "\n")
        else:
            out.write(f"{vm}@{t}  {show_path(disk, part, path)}{'/' if kind == 'dir' else ''}  {format_size(size)}"
                      f"{'  changed' if changed else ''}\n")
    for vm, t, sid, disk, msg in errors:
        if sid not in live or since and t < since or until and t > until:
            continue
        sys.stdout.flush()
        print(f"foundation: {msg} (not searched)", file=sys.stderr)
        status = FilesUnreadable.code
    return status


class _StoreOnUse:
    """The store, opened read-only on first use (an attribute asked for), closed on leaving."""

    def __init__(self, args):
        self._args, self._cm, self._store = args, None, None

    def __getattr__(self, name):
        if self._store is None:
            self._cm = open_store(self._args, writable=False)
            self._store = self._cm.__enter__()
        return getattr(self._store, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self._cm is not None:
            return self._cm.__exit__(*exc)
        return False


def update_listings(args, names, state, catalog=None, known=None, uuid=None):
    """Add the new snapshots of `names` to the listings, after `archive`; a failure only warns.

    `archive` passes its catalog (as it committed it), the store's uuid and the
    ranges each new tree changed (`known`, see FilesIndex.update): the store is
    then opened only if a listing has to read it, which a night that changes
    nothing its listings were read from never does.
    """
    try:
        from foundation.snapshotfs.filesindex import FilesIndex

        with _StoreOnUse(args) as store:
            idx = FilesIndex(state, uuid or store.uuid)
            try:
                n = idx.update(store, catalog if catalog is not None else Catalog.load(store), names, known)
            finally:
                idx.close()
        log.info("file listings: %d snapshot disk(s) added", n)
    except Exception as e:
        log.warning("file listings not updated (%s); `foundation find` adds them when next run", e)
