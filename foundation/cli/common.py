"""What every subcommand shares: its settings, resolved once, and the helpers more than one command needs.

A setting comes from the command line, then the environment, then the
config file, then a default. `settings(args)` resolves them once per
command, reading the environment here and nowhere else in the CLI and the
config file at most once, and only when the command line and the
environment leave a setting open. A passphrase comes from
FOUNDATION_PASSPHRASE or a terminal prompt, never from the command line
(it would show in `ps`).
"""

import argparse
import functools
import logging
import os
import sys
import time

from foundation.config import parse_size
from foundation.errors import Error, UsageError

log = logging.getLogger(__name__)

# Every environment variable the CLI reads: setting -> variable.
ENVIRONMENT = {
    "store": "FOUNDATION_STORE",
    "key_file": "FOUNDATION_KEY_FILE",
    "config": "FOUNDATION_CONFIG",
    "state_dir": "FOUNDATION_STATE_DIR",
    "snapshot_dir": "FOUNDATION_SNAPSHOT_DIR",
    "clones_dir": "FOUNDATION_CLONES_DIR",
    "libvirt_uri": "LIBVIRT_DEFAULT_URI",
    "passphrase": "FOUNDATION_PASSPHRASE",
}
SNAPSHOT_DIR = "/snapshot"


class Settings:
    """One command's settings: its options, then the environment, then the config file (read once, if needed)."""

    def __init__(self, args, environ=os.environ):
        self.args = args
        self.env = {name: environ.get(var) or None for name, var in ENVIRONMENT.items()}

    def given(self, name):
        """The command line's value of a setting, else the environment's, else None."""
        return getattr(self.args, name, None) or self.env[name]

    @functools.cached_property
    def config(self):
        """The config file (foundation.config.Config): --config, $FOUNDATION_CONFIG or the default."""
        from foundation.config import load_config

        return load_config(self.given("config"))

    @property
    def store(self):
        path = self.given("store") or self.config.store
        if not path:
            raise UsageError("no store given: pass --store DIR or set FOUNDATION_STORE")
        return path

    @property
    def key_file(self):
        return self.given("key_file") or self.config.key_file

    @property
    def state_dir(self):
        """Where the archiver's journal and the replicas' last runs are kept."""
        return self.given("state_dir") or self.config.state_dir

    @property
    def libvirt_uri(self):
        """--libvirt-uri, then the config's libvirt_uri (libvirt's own $LIBVIRT_DEFAULT_URI only for `boot`)."""
        return getattr(self.args, "libvirt_uri", None) or self.config.libvirt_uri

    @property
    def snapshot_dir(self):
        """Where the /snapshot tree is mounted."""
        return self.given("snapshot_dir") or SNAPSHOT_DIR

    @property
    def clones_dir(self):
        """Where `boot` puts clone overlays: the config's clones_dir, else <state_dir>/clones."""
        return self.given("clones_dir") or self.config.clones_dir or os.path.join(self.config.state_dir, "clones")

    @property
    def passphrase(self):
        return self.env["passphrase"]


def settings(args):
    """The command's Settings, made at the first call and kept on args."""
    s = getattr(args, "settings", None)
    if s is None:
        s = args.settings = Settings(args)
    return s


def store_path(args):
    return settings(args).store


def key_file(args):
    return settings(args).key_file


def passphrase(args):
    """What the store calls for the passphrase of a wrapped key file, only when it needs one (the store
    itself never prompts): FOUNDATION_PASSPHRASE, else a prompt on the terminal; None without either,
    and the store then says what is missing."""
    given = settings(args).passphrase

    def ask():
        if given:
            return given
        if sys.stdin.isatty():
            import getpass
            return getpass.getpass("Passphrase for the store key: ")
        return None
    return ask


def open_store(args, writable=False, seed=None, **kw):
    """Open the store named by the arguments, with its key if it is encrypted; the host's record of
    its newest commit (in the state directory) catches a store rolled back to an older copy. A
    writer (or `seed`) on a host without that record first takes it from the replicas."""
    from foundation.store import Store

    w = watch(args)
    master = _seed(args, w) if (writable if seed is None else seed) else None
    s = Store.open(store_path(args), key_file=key_file(args), writable=writable, passphrase=passphrase(args),
                   watch=w, master=master, **kw)
    if s.rolled_back:
        print(f"WARNING: {s.rolled_back}; reading it as it is (`foundation accept-rollback` takes it as the "
              "newest)", file=sys.stderr)
    return s


def watch(args):
    """The host's record of the newest commit of each store (foundation.store.rollback)."""
    from foundation.store.rollback import Watch

    return Watch(settings(args).state_dir)


def _seed(args, w):
    """Before the first open of the store on this host, with replicas configured: the newest
    commit they hold becomes the host's record (foundation.replica.seed). Returns the master key
    it loaded (None if none), so a passphrase is asked once."""
    from foundation.store.primary import read_config

    try:
        uuid = read_config(store_path(args))[0]["uuid"]
        if w.seen(uuid) is not None:
            return None
        specs = replicas(args)
    except Error:
        return None   # no store (the open says so), no replica configured
    from foundation.replica.seed import seed

    with open_primary(args) as local:
        if seed(w, local, specs):
            log.info("this host had no record of store %s: it takes its replicas' newest commit", local.path)
        return local.master


def open_primary(args):
    """The store's primary files without its caches (replicate, audit), with its key."""
    from foundation.replica.sync import Local

    return Local(store_path(args), key_file(args), passphrase=passphrase(args))


# ---- sizes ---------------------------------------------------------------------------------

def size(text):
    """A command-line size: 4096, 16M, 16MiB, 2G, 1T (foundation.config.parse_size); argparse
    reports a bad one as a usage error (status 2)."""
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


# ---- replicas ------------------------------------------------------------------------------

def replicas(args, names=None, urls=None):
    """ReplicaSpecs chosen by names/URLs, else every configured replica (UsageError if none)."""
    from foundation.replica import find_replica, replicas_from_config, spec_from_url

    conf = settings(args).config
    out = [spec_from_url(u) for u in urls or ()] + [find_replica(conf, n) for n in names or ()]
    if not names and not urls:
        out = replicas_from_config(conf)
        if not out:
            raise UsageError("no replica is configured: add a [replicas.NAME] table with a url to the config file "
                             "(see docs/operation.md), or give one with --to URL")
    return out


def replicate_one(args, spec, allow=False, progress=True, resend=(), force=False):
    """Bring one replica up to the store; its outcome is written down for `foundation status`."""
    from foundation.replica import lastrun, open_backend
    from foundation.replica.sync import replicate

    bars = []

    def bar(total):
        bars.append(Progress(f"replica {spec.name or spec.url}", total))
        return bars[-1]

    state_dir = settings(args).state_dir
    with open_primary(args) as local:
        _refuse_rollback(args, local)
        try:
            with open_backend(spec) as backend:
                res = replicate(local, backend, allow_plaintext=allow or spec.allow_plaintext,
                                progress=bar if progress else None, resend=resend, force=force)
        except Exception as e:
            lastrun.record(state_dir, local.uuid, spec, error=e)
            raise
        finally:
            for b in bars:
                b.finish()
        lastrun.record(state_dir, local.uuid, spec, res)
        return res


def _refuse_rollback(args, local):
    """A store older than this host saw sends nothing: the replica keeps the newer days."""
    from foundation.errors import RolledBack
    from foundation.store.primary import check_rollback

    why = check_rollback(local.path, local.uuid, local.keys.mac, watch(args))
    if why:
        raise RolledBack(why)


def after_write(args):
    """Replicate after `archive`/`import-image`/`gc` committed. Never raises: a failure is a warning, the
    caller's exit status stays as it is, and the next run (or `foundation replicate`) catches up."""
    if settings(args).config.section("replicas") == {}:
        return  # no replica configured: the replica modules (ssl, ftplib) are not even imported
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
