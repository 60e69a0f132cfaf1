"""`foundation recover --from URL --store DIR`: a whole store again, from a replica and the key alone.

The config, every arena, the open arena's segments and the head come down
and are checked against the replica's manifest; the summaries, index and
Bloom filter are rebuilt; `verify` reads every record. DIR must be absent
or empty; an interrupted recovery leaves `DIR/recovering.json`, and the
same command resumes it (arenas already down are kept).
"""

import sys

from foundation.cli.common import Progress, key_file, passphrase, settings, store_path

NAME = "recover"
HELP = "rebuild a lost store from a replica and its key file"


def add_arguments(p):
    p.add_argument("--from", dest="source", metavar="URL", required=True,
                   help="the replica: a URL (ftp://, ftps://, s3://bucket/prefix, file:///dir) or the name of "
                        "a [replicas.NAME] table of the config file")
    p.add_argument("--store", dest="target", metavar="DIR",
                   help="the new store directory, absent or empty (default: the global --store, "
                        "FOUNDATION_STORE or the config's store)")
    p.add_argument("--key-file", dest="target_key", metavar="FILE",
                   help="the store's key file (default: the global --key-file, FOUNDATION_KEY_FILE, the config's "
                        "key_file or the default path for the replica's store uuid)")


def run(args):
    from foundation.replica import find_replica, open_backend
    from foundation.replica.recover import recover

    spec = find_replica(settings(args).config, args.source)
    dest = args.target or store_path(args)
    bars = []

    def bar(total):
        bars.append(Progress("recover", total))
        return bars[-1]

    with open_backend(spec) as backend:
        try:
            res = recover(backend, dest, args.target_key or key_file(args), progress=bar, passphrase=passphrase(args))
        finally:
            for b in bars:
                b.finish()
    how = "resumed and finished" if res.resumed else "recovered"
    print(f"{how} store {res.path} from {spec.url}: {res.arenas} arenas, {res.bytes / 1e6:,.1f} MB "
          f"({res.downloaded / 1e6:,.1f} MB downloaded) in {res.seconds:.1f} s; {res.snapshots} snapshot(s); "
          f"summaries, index and Bloom filter rebuilt")
    for d in res.damage:
        print(f"DAMAGED {d}")
    if res.damage:
        print(f"{len(res.damage)} damaged place(s): the replica's copy was damaged there; blocks in those records "
              "cannot be read (`foundation repair --image ...` may heal them)", file=sys.stderr)
        return 1
    print(f"ok: {res.records:,} records verified")
    return 0
