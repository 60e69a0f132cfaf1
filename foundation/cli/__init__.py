"""The `foundation` command: one module per subcommand in this package.

A subcommand module defines NAME, HELP, add_arguments(parser) and
run(args) -> exit status; dropping a module here adds the command, so the
layers never edit one shared dispatch table. A command line that names a
command (module NAME with - as _) imports that module alone: every other
command's imports would cost more than a night that changed nothing.
"""

import os
import sys

if os.path.basename(sys.argv[0] if sys.argv else "") == "foundation":  # the console script
    from foundation import warmup

    warmup.start(sys.argv[1:])  # before this module's imports, as `python -m foundation` does

import argparse  # noqa: E402
import importlib  # noqa: E402

from foundation import __version__  # noqa: E402
from foundation.cli import logs  # noqa: E402
from foundation.errors import INTERRUPTED, Error  # noqa: E402

_NOT_COMMANDS = {"common", "logs", "manpage"}


_VALUED = {"--store", "--key-file", "--config"}  # the global options that take a value


def _commands(only=None):
    if only is not None:
        return _command(only)
    import pkgutil

    mods = []
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_") or info.name in _NOT_COMMANDS or only and info.name != only:
            continue
        mod = importlib.import_module(f"{__name__}.{info.name}")
        if hasattr(mod, "NAME") and hasattr(mod, "run"):
            mods.append(mod)
    return sorted(mods, key=lambda m: m.NAME)


def _command(name):
    """[the command module called name], imported straight away (no listing of the package), or []."""
    if not name.isidentifier() or name.startswith("_") or name in _NOT_COMMANDS:
        return []
    try:
        mod = importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as e:
        if e.name == f"{__name__}.{name}":
            return []
        raise
    return [mod] if hasattr(mod, "NAME") and hasattr(mod, "run") else []


def _named(argv):
    """The command's module name when argv names one (its first word that is no option
    or option value), else None."""
    skip = False
    for a in argv:
        if skip:
            skip = False
        elif a in _VALUED:
            skip = True
        elif a == "--" or not a.startswith("-"):
            return None if a == "--" else a.replace("-", "_")
    return None


def parser(argv=()):
    """The whole parser, or only the command that argv names (when it exists)."""
    name = _named(argv)
    mods = _commands(name) if name and name not in _NOT_COMMANDS else []
    if len(mods) != 1 or mods[0].NAME.replace("-", "_") != name:
        mods = _commands()
    p = argparse.ArgumentParser(
        prog="foundation",
        description="Keep every day of your virtual machines on one disk, and travel back in time.",
    )
    p.add_argument("--store",
                   help="store directory on the backup disk (env FOUNDATION_STORE)")
    p.add_argument("--key-file",
                   help="key file of an encrypted store (env FOUNDATION_KEY_FILE)")
    p.add_argument("--config",
                   help="config file (default /etc/foundation/foundation.toml; env FOUNDATION_CONFIG)")
    p.add_argument("-v", "--verbose", action="store_true", help="log debugging detail")
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for mod in mods:
        sp = sub.add_parser(mod.NAME, help=mod.HELP, description=getattr(mod, "DESCRIPTION", mod.HELP))
        mod.add_arguments(sp)
        sp.set_defaults(_run=mod.run)
    return p


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parser(argv).parse_args(argv)
    logs.setup(args.verbose)
    try:
        return args._run(args) or 0
    except Error as e:
        logs.error(e)
        return e.code
    except KeyboardInterrupt:
        logs.error("interrupted")
        return INTERRUPTED
    except OSError as e:  # one that no layer named: the store's disk failing under us, mostly
        err = _disk_failure(e, args)
        if err is None:
            raise
        logs.error(err)
        return err.code


def console():
    """The `foundation` command (the console script and `python -m foundation`): main(), then the
    command's objects frozen, so that the collections of the interpreter's exit skip them (they
    would walk every object the command made again, ~10 ms of a night). What the command wrote is
    closed by then: files opened for writing are always in `with` blocks."""
    code = main()
    import gc

    gc.freeze()
    return code


def _disk_failure(e, args):
    from foundation.cli.common import store_path
    from foundation.store.disk import failure

    try:
        root = store_path(args)
    except Error:
        return None
    return failure(e, root) if root else None


if __name__ == "__main__":
    sys.exit(main())
