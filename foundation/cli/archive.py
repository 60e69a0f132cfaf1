"""`foundation archive [VM...] [--all]`: the nightly job (paper §2.2, Figure 2).

The store is opened, and its key checked, before any VM is touched: a
store that is missing, not mounted or locked by another run, or a wrong
key, stops the run with no change to any VM. Then each VM is repaired (if
an earlier run was interrupted) and archived in turn; one VM's failure
never stops the others, but a failing store does (every further VM would
only gain an overlay the next run must finish). The exit status is 0 only
if every VM was archived. A summary table ends the run; on a terminal a
progress bar shows each disk, under systemd plain log lines go to the
journal. After the store is closed, the new snapshots are added to
`find`'s file listings (config `list_files`); a failure there only warns,
and `find` adds what is missing when it next runs.
"""

import gc
import logging
import sys

from foundation import warmup
from foundation.cli.common import Progress, after_write, open_store, settings, store_path
from foundation.config import QUIESCE_MODES
from foundation.errors import Error, UsageError
from foundation.notify import record_run
from foundation.vm.archiver import Result

NAME = "archive"
HELP = "archive VMs now: snapshot, store what changed, merge (the nightly job)"
DESCRIPTION = (
    "Snapshot each VM's disks (running or shut off), archive what changed since the last run, "
    "and merge the day's overlay back into the base, repairing first whatever an interrupted "
    "run left. Which VMs: the names given, --all, or the config file's `vms`.")

log = logging.getLogger(__name__)


def add_arguments(p):
    p.add_argument("vms", nargs="*", metavar="VM", help="VMs to archive (default: the config file's `vms`)")
    p.add_argument("--all", action="store_true", help="every VM libvirt knows (except the config's `exclude`)")
    p.add_argument("--check", action="store_true",
                   help="only check that the store is present and the key fits, then exit "
                        "(the systemd service runs this first)")
    p.add_argument("--libvirt-uri", help="libvirt connection (default: config `libvirt_uri`, qemu:///system)")
    p.add_argument("--state-dir",
                   help="journal directory (default: config `state_dir`, /var/lib/foundation; "
                        "env FOUNDATION_STATE_DIR)")
    q = p.add_mutually_exclusive_group()
    q.add_argument("--quiesce", choices=QUIESCE_MODES, metavar="MODE",
                   help="auto: freeze guest file systems through the guest agent when it answers, else "
                        "crash-consistent; always: a running VM whose agent cannot freeze is not archived; "
                        "never (default: config `quiesce`, auto)")
    q.add_argument("--no-quiesce", dest="quiesce", action="store_const", const="never",
                   help="the same as --quiesce never")


def run(args):
    # what the imports made lives as long as the process: the cyclic collector need not walk it
    # again at each of a night's collections
    gc.freeze()
    conf = settings(args).config
    if args.vms and args.all:
        raise UsageError("give VM names or --all, not both")
    # The store first: nothing is touched if it is missing, unmounted, locked or the key is wrong.
    results, beside = [], None
    try:
        with open_store(args, writable=not args.check) as store:
            if args.check:
                how = "encrypted, the key fits" if store.conf.get("encrypted") else "not encrypted"
                print(f"store {store_path(args)} is present ({how})")
                return 0
            beside = _archive_all(args, conf, store, results)
    except Error as e:
        record_run(settings(args).state_dir, results, e)     # for `foundation notify`
        raise
    finally:
        if results:
            print(summary(results), flush=True)
    record_run(settings(args).state_dir, results)
    if results:
        after_write(args)  # configured replicas; a failure there only warns, the status stays
        done = [r.name for r in results if r.status == "ok"]
        if done and conf.list_files and not (beside and beside.listed):
            from foundation.cli.find import update_listings

            update_listings(args, done, settings(args).state_dir)   # only warns, too
    warmup.learn(settings(args).state_dir)  # what this run mapped, for the next one's warm-up
    return 0 if all(r.status in ("ok", "unchanged") for r in results) else 1


def _archive_all(args, conf, store, results):
    from foundation.vm import Archiver, StoreSink, connect

    # (connecting in a thread beside the store's open was tried: a cold import of libvirt's ~40
    # libraries holds the GIL while it reads them, and the nights came out slower, not faster;
    # the warm-up asks for them instead, once a run has named them: warmup.learn, below)
    conn = connect(settings(args).libvirt_uri)
    names = _names(args, conf, conn)
    if not names:
        print("no VM to archive (libvirt knows none, or all are excluded)")
        return
    tty = sys.stderr.isatty()
    sink = StoreSink(store)
    archiver = Archiver(conn, sink, settings(args).state_dir,
                        quiesce=args.quiesce or conf.quiesce,
                        progress=(lambda what, total: Progress(what, total)) if tty else None)
    beside = None
    for i, name in enumerate(names):
        log.info("archiving %s (%d of %d)", name, i + 1, len(names))
        if i == len(names) - 1:
            beside = _Beside(args, conf, sink, [r.name for r in results if r.status == "ok"] + [name])
        r = archiver.archive(name, beside_merge=beside)
        results.append(r)
        if r.store_failed:
            for rest in names[i + 1:]:
                results.append(Result(rest, status="not run", error="the store failed; this VM was not touched"))
            log.error("the store failed: the remaining VMs were not touched")
            break
    if beside is not None and beside.error is not None:
        raise beside.error      # what the close would have raised, raised where the close runs
    return beside


class _Beside:
    """What follows the last VM's archive, done while QEMU merges that VM's day (a copy in QEMU's
    process, during which this one only waits): closing the store (its index merge, fsyncs) and
    then the file listings, which open it again read-only. The snapshot is in the catalog before
    the merge starts, and nothing writes the store after it; the VM's journal lock is held until
    its merge and cleanup are done, as before. The close's error is kept and raised after the
    VMs, where the close would have raised it; the listing only warns, as before. The listing
    gets the run's catalog and the ranges each disk's new tree changed: a night whose change
    misses what the listings were read from opens the store no more."""

    def __init__(self, args, conf, sink, names):
        self.args, self.conf, self.sink, self.names = args, conf, sink, names
        self.error, self.listed = None, False

    def __call__(self):
        store = self.sink.store
        try:
            store.close()      # the `with` block's own close then finds it closed
        except BaseException as e:     # noqa: BLE001 -- raised in the main thread afterwards
            self.error = e
            return
        if self.conf.list_files:
            from foundation.cli.find import update_listings
            from foundation.snapshotfs.filesindex import tree_key

            known = {(tree_key(a), tree_key(b)): runs for a, b, runs in self.sink.changes}
            update_listings(self.args, self.names, settings(self.args).state_dir,   # only warns
                            catalog=self.sink.catalog, known=known, uuid=store.uuid)
            self.listed = True


def _names(args, conf, conn):
    from foundation.vm import all_names

    if args.vms:
        return list(dict.fromkeys(args.vms))
    if args.all or conf.vms == "all":
        return [n for n in all_names(conn) if n not in conf.exclude]
    return [n for n in conf.vms if n not in conf.exclude]


def summary(results):
    """The table printed at the end of a run, then one line per error and repair."""
    rows = [("VM", "disks", "changed MB", "time s", "consistency", "status", "repaired")]
    for r in results:
        rows.append((r.name, str(r.disks) if r.disks else "-", f"{r.changed / 1e6:.1f}" if r.disks else "-",
                     f"{r.seconds:.1f}", r.consistency or "-", r.status, str(len(r.repaired)) if r.repaired else "-"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    right = {1, 2, 3}
    lines = ["  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))).rstrip()
             for row in rows]
    for r in results:
        for note in r.repaired:
            lines.append(f"{r.name}: repaired: {note}")
        if r.error:
            lines.append(f"{r.name}: {r.status}: {r.error}")
    ok = sum(r.status in ("ok", "unchanged") for r in results)
    lines.append(f"{ok} of {len(results)} VM(s) archived")
    return "\n".join(lines)
