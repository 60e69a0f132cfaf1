"""`foundation replicate [--replica NAME | --to URL]`: bring the replicas up to the local store.

Sealed arenas go up once, the open arena's new committed part each time,
the manifest last; then what the manifest no longer names is removed
(foundation.replica.sync). The store is read as a reader reads it, so this
runs beside an archive or the /snapshot tree. `archive` and `import-image`
call `after_write` when they have committed: a replica that fails there
only warns, and the next run (or this command) catches up. Every attempt
is written down for `foundation status` (foundation.replica.lastrun).
"""

import logging
import os
import sys

from foundation.cli.common import Progress, open_primary
from foundation.config import load_config
from foundation.errors import Error, UsageError

NAME = "replicate"
HELP = "copy the store's new arenas to its replicas (FTP, FTPS, S3, a directory)"
DESCRIPTION = (
    "Upload to each replica what it lacks: sealed arenas once, the open arena's newly committed part, "
    "then the replica's manifest. Without options every [replicas.NAME] table of the config file is "
    "brought up to date. Only ciphertext and MACs leave the machine (an unencrypted store is refused "
    "unless allow_plaintext is set).")

log = logging.getLogger(__name__)


def add_arguments(p):
    p.add_argument("--replica", metavar="NAME", action="append",
                   help="only this configured replica (or a URL); may be repeated")
    p.add_argument("--to", metavar="URL", action="append",
                   help="a replica given by URL (ftp://, ftps://, s3://bucket/prefix, file:///dir); may be repeated")
    p.add_argument("--allow-plaintext", action="store_true",
                   help="replicate an unencrypted store (the server sees your data)")
    p.add_argument("--force", action="store_true",
                   help="replicate even to a replica that holds a newer state of this store (the local store was "
                        "restored from an older copy): the replica's newer days are dropped")


def replicas(args, names=None, urls=None):
    """ReplicaSpecs chosen by names/URLs, else every configured replica (UsageError if none)."""
    from foundation.replica import find_replica, replicas_from_config, spec_from_url

    conf = load_config(getattr(args, "config", None))
    out = [spec_from_url(u) for u in urls or ()] + [find_replica(conf, n) for n in names or ()]
    if not names and not urls:
        out = replicas_from_config(conf)
        if not out:
            raise UsageError("no replica is configured: add a [replicas.NAME] table with a url to the config file "
                             "(see docs/operation.md), or give one with --to URL")
    return out


def replicate_one(args, spec, allow=False, progress=True, resend=(), force=False):
    from foundation.replica import lastrun, open_backend
    from foundation.replica.sync import replicate

    bars = []

    def bar(total):
        bars.append(Progress(f"replica {spec.name or spec.url}", total))
        return bars[-1]

    with open_primary(args) as local:
        try:
            with open_backend(spec) as backend:
                res = replicate(local, backend, allow_plaintext=allow or spec.allow_plaintext,
                                progress=bar if progress else None, resend=resend, force=force)
        except Exception as e:
            lastrun.record(state_dir(args), local.uuid, spec, error=e)
            raise
        finally:
            for b in bars:
                b.finish()
        lastrun.record(state_dir(args), local.uuid, spec, res)
        return res


def state_dir(args):
    """Where `status` finds the replicas' last runs: --state-dir, $FOUNDATION_STATE_DIR or the config's."""
    return (getattr(args, "state_dir", None) or os.environ.get("FOUNDATION_STATE_DIR")
            or load_config(getattr(args, "config", None)).state_dir)


def run(args):
    status = 0
    for spec in replicas(args, args.replica, args.to):
        try:
            res = replicate_one(args, spec, args.allow_plaintext, force=args.force)
        except Error as e:
            print(f"foundation: {e}", file=sys.stderr)
            status = status or e.code
            continue
        print(res.summary())
        for n in res.notes:
            print(f"note: {n}")
        for w in res.warnings:
            print(f"WARNING {w}")
        if res.warnings:
            status = status or 1
    return status


def after_write(args):
    """Replicate after `archive`/`import-image` committed. Never raises: a failure is a warning, the
    caller's exit status stays as it is, and the next run (or `foundation replicate`) catches up."""
    try:
        chosen = replicas(args)
    except UsageError:
        return  # no replica configured
    except Error as e:
        log.warning("replicas not updated: %s", e)
        return
    for spec in chosen:
        try:
            res = replicate_one(args, spec, progress=sys.stderr.isatty())
        except Exception as e:  # noqa: BLE001 - whatever happens, the archive stands
            log.warning("replica %s was NOT updated: %s. The snapshot is safe in the local store; the next "
                        "archive or `foundation replicate` tries again.", spec.name or spec.url, e)
            continue
        log.info("%s", res.summary())
        for n in res.notes:
            log.info("replica %s: %s", spec.name or spec.url, n)
        for w in res.warnings:
            log.warning("replica %s: %s", spec.name or spec.url, w)
