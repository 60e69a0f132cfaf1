"""`foundation init`: create a store on the backup disk."""

import os
import sys

from foundation.cli.common import key_file, settings, size, store_path
from foundation.errors import StoreMissing, UsageError

NAME = "init"
HELP = "create a new store in an empty directory (the mounted backup disk)"


class NoParent(StoreMissing):
    """Cannot create the store {}: its parent directory {} does not exist. Mount the backup disk (or create the parent directory), then run `foundation init` again."""


def _make_dir(path):
    """The store's own directory is made here; its parent must exist (the mounted disk)."""
    if os.path.lexists(path):
        return
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise NoParent(path, parent)
    os.mkdir(path, 0o700)


def add_arguments(p):
    p.add_argument("directory", nargs="?", help="store directory (default: --store)")
    p.add_argument("--mode", choices=["hash", "value"], default="hash",
                   help="compare-by-hash (names are scores) or compare-by-value (names are log addresses, every duplicate compared byte for byte)")
    p.add_argument("--block-size", type=size, default=4096, help="block size (default 4096)")
    p.add_argument("--arena-size", type=size, default=16 << 20, help="arena size (default 16M)")
    p.add_argument("--max-log-size", type=size, default=256 << 30,
                   help="expected largest log; kept in the config (the index and Bloom filter grow with "
                        "the store; default 256G)")
    p.add_argument("--no-encrypt", action="store_true", help="store blocks in the clear (still checksummed)")
    p.add_argument("--compression", metavar="SETTING",
                   help="how blocks are compressed: zstd:N (a zstd level), zstd (= zstd:1, the default) or none")
    p.add_argument("--run", type=int, metavar="N",
                   help="compress up to N neighbouring new blocks together as one run (1: each block "
                        "alone; default 16; docs/format.md §5.2)")
    p.add_argument("--tag", choices=("poly1305", "hmac"),
                   help="how each record is authenticated: poly1305 (the default) or hmac (slower; for "
                        "a store that Foundations older than Poly1305 tags must read; docs/format.md §5.2)")
    p.add_argument("--passphrase", action="store_true",
                   help="protect the key file with a passphrase (asked, or FOUNDATION_PASSPHRASE)")


def run(args):
    from foundation.store import Store

    path = args.directory or store_path(args)
    _make_dir(path)
    pw = None
    if args.passphrase:
        pw = settings(args).passphrase
        if not pw:
            if not sys.stdin.isatty():
                raise UsageError("--passphrase needs a terminal or FOUNDATION_PASSPHRASE")
            import getpass
            pw = getpass.getpass("New passphrase: ")
            if pw != getpass.getpass("Again: "):
                raise UsageError("the passphrases differ")
    kf = Store.create(path, mode=args.mode, block_size=args.block_size, arena_size=args.arena_size,
                      max_log_size=args.max_log_size, encrypt=not args.no_encrypt,
                      key_file=key_file(args), passphrase=pw, compression=args.compression, run=args.run,
                      tag=args.tag)
    print(f"created {args.mode} store in {path}")
    if kf:
        print(f"key file: {kf}")
        print("Keep a copy of the key file somewhere safe, away from the backup disk: without it the archive cannot be read.")
    return 0
