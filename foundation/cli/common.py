"""What every subcommand shares: finding the store and its key, progress.

The store path and key file come from --store/--key-file, then the
environment (FOUNDATION_STORE, FOUNDATION_KEY_FILE), then the config file;
a passphrase comes from FOUNDATION_PASSPHRASE or a terminal prompt, never
from the command line (it would show in `ps`).
"""

import os
import sys
import time

from foundation.errors import UsageError


def store_path(args):
    path = getattr(args, "store", None)
    if not path:
        path = _config_value(args, "store")
    if not path:
        raise UsageError("no store given: pass --store DIR or set FOUNDATION_STORE")
    return path


def key_file(args):
    return getattr(args, "key_file", None) or _config_value(args, "key_file")


def _config_value(args, name):
    cfg = getattr(args, "config", None)
    if not cfg and not os.path.exists("/etc/foundation/foundation.toml"):
        return None
    from foundation.config import load_config

    conf = load_config(cfg)
    return getattr(conf, name, None)


def ask_passphrase():
    """The passphrase of a wrapped key file, asked only when one is needed: FOUNDATION_PASSPHRASE,
    else a prompt on the terminal; None without either (the store then says what is missing)."""
    p = os.environ.get("FOUNDATION_PASSPHRASE")
    if p:
        return p
    if sys.stdin.isatty():
        import getpass
        return getpass.getpass("Passphrase for the store key: ")
    return None


def open_store(args, writable=False, **kw):
    """Open the store named by the arguments, with its key if it is encrypted."""
    from foundation.store import Store

    return Store.open(store_path(args), key_file=key_file(args), writable=writable, passphrase=ask_passphrase, **kw)


def open_primary(args):
    """The store's primary files without its caches (replicate, audit), with its key."""
    from foundation.replica.sync import Local

    return Local(store_path(args), key_file(args), passphrase=ask_passphrase)


class Progress:
    """A one-line progress report on a terminal; silent otherwise."""

    def __init__(self, what, total, stream=None):
        self.what, self.total = what, max(total, 1)
        self.stream = stream or sys.stderr
        self.on = self.stream.isatty()
        self.done = 0
        self.start = self.last = time.monotonic()

    def __call__(self, n):
        self.done += n
        now = time.monotonic()
        if self.on and (now - self.last > 0.2 or self.done >= self.total):
            self.last = now
            rate = self.done / max(now - self.start, 1e-6) / 1e6
            pct = 100.0 * self.done / self.total
            self.stream.write(f"\r{self.what}: {pct:5.1f}%  {self.done / 1e6:,.0f} MB  {rate:,.0f} MB/s ")
            self.stream.flush()

    def finish(self):
        if self.on:
            self.stream.write("\n")
            self.stream.flush()
