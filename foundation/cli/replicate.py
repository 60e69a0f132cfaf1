"""`foundation replicate [--replica NAME | --to URL]`: bring the replicas up to the local store.

Sealed arenas go up once, the open arena's new committed part each time,
the manifest last; then what the manifest no longer names is removed
(foundation.replica.sync). The store is read as a reader reads it, so this
runs beside an archive or the /snapshot tree. `archive`, `import-image`
and `gc` call `common.after_write` when they have committed: a replica
that fails there only warns, and the next run (or this command) catches
up. Every attempt is written down for `foundation status`
(foundation.replica.lastrun).
"""

import sys

from foundation.cli.common import replicas, replicate_one
from foundation.errors import Error

NAME = "replicate"
HELP = "copy the store's new arenas to its replicas (FTP, FTPS, S3, a directory)"
DESCRIPTION = (
    "Upload to each replica what it lacks: sealed arenas once, the open arena's newly committed part, "
    "then the replica's manifest. Without options every [replicas.NAME] table of the config file is "
    "brought up to date. Only ciphertext and MACs leave the machine (an unencrypted store is refused "
    "unless allow_plaintext is set).")


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
