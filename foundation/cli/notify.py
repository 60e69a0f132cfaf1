"""`foundation notify`: tell the VM managers' desktops about a failed night or a stale VM.

The archive service runs it after every night (ExecStopPost=, so also
when the store check failed and the archive never started). It reads
what the last `archive` recorded and each VM's health, sends each new
notice once (foundation.notify) and prints to whom. `notify = never` in
the config file turns it off; no desktop session means nobody is told and
nothing fails.
"""

from foundation import access, notify
from foundation.cli.common import settings
from foundation.errors import Error

NAME = "notify"
HELP = "send desktop notifications of a failed night or a stale VM (the archive service runs this)"


def add_arguments(p):
    p.add_argument("--dry-run", action="store_true", help="print the notifications due; send and record nothing")
    p.add_argument("--state-dir",
                   help="journal directory (default: config `state_dir`; env FOUNDATION_STATE_DIR)")


def run(args):
    from foundation.vm import journal

    conf = settings(args).config
    if conf.notify == "never" and not args.dry_run:
        print("notifications are off (notify = \"never\" in the config file)")
        return 0
    state_dir = settings(args).state_dir
    records = {r["name"]: r for r in journal.records(state_dir)}
    due, sent = notify.alerts(conf, state_dir, records, _latest(args))
    group = access.group_name(conf)
    gid = access.group_id(group)
    for a in due:
        if args.dry_run:
            print(f"due: {a.summary}\n     {a.body}")
            continue
        told = notify.send(a, gid)
        print(f"{a.summary}: told {', '.join(told) if told else f'nobody (no desktop session of group {group})'}")
    if not args.dry_run:
        notify.save_sent(state_dir, sent)
    return 0


def _latest(args):
    """{name: newest snapshot time} from the catalog, or None when the store cannot be opened."""
    from foundation.catalog import Catalog
    from foundation.cli.common import open_store

    try:
        with open_store(args, writable=False) as s:
            snaps = Catalog.load(s).snapshots()
    except Error:
        return None
    return {s.name: s.time for s in snaps}      # oldest first: the newest wins
