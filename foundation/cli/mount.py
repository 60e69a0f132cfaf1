"""`foundation mount [MOUNTPOINT]`: serve the /snapshot tree until unmounted.

Runs in the foreground (systemd: systemd/foundation-snapshot.service);
`--daemon` detaches once the tree answers. Stop it with SIGTERM, Ctrl-C
or `umount MOUNTPOINT`; it always unmounts on the way out. Only root and
the snapshot group (`--group`, config `snapshot_group`, by default
libvirt's group: foundation.access) may list the tree and read its files.
"""

import datetime as dt
import logging
import os
import sys
import time

from foundation.cli import common
from foundation.errors import UsageError

NAME = "mount"
HELP = "serve every archived day read-only under MOUNTPOINT (default /snapshot)"
DESCRIPTION = (
    "Serve the snapshot tree: MOUNTPOINT/YYYY/MM/DD/<vm>/ holds each disk as a raw image "
    "(vda.raw), its files (vda/p1/...), and the domain XML. A day without a snapshot "
    "resolves to the latest one before it. See docs/snapshot-tree.md."
)

log = logging.getLogger(__name__)


def add_arguments(p):
    p.add_argument("mountpoint", nargs="?", default="/snapshot", help="where to mount (default /snapshot)")
    p.add_argument("--daemon", action="store_true", help="detach once the tree is mounted")
    p.add_argument("--utc", action="store_true", help="name days and times in UTC instead of local time")
    p.add_argument("--group", help="the group that may read the tree (default: config `snapshot_group`, "
                                   "else libvirt's group, `libvirt`)")
    p.add_argument("--no-allow-other", action="store_true",
                   help="only root may read the tree (libvirt's QEMU then cannot boot from it)")
    p.add_argument("--log-file", help="with --daemon: append log lines here (default: syslog-less, discarded)")
    p.add_argument("--images", metavar="MANIFEST", help=argparse_suppress())


def argparse_suppress():
    import argparse

    return argparse.SUPPRESS      # --images: serve loose raw images from a JSON manifest (tests)


def _archive(args):
    from foundation.snapshotfs.archive import ImageFilesArchive, StoreArchive

    if args.images:
        return ImageFilesArchive(args.images)
    path = common.store_path(args)
    if not os.path.isdir(path):
        from foundation.errors import StoreMissing

        raise StoreMissing(path)
    return StoreArchive(path, key_file=common.key_file(args), passphrase=common.passphrase(args))


def run(args):
    if os.geteuid() != 0:
        raise UsageError("mounting needs root (/dev/fuse is root-only here); run with sudo")
    try:
        import pyfuse3  # noqa: F401
    except ImportError:
        raise UsageError("pyfuse3 is not installed: pip install pyfuse3 (needs libfuse3-dev, pkg-config)")
    from foundation.snapshotfs import server

    tz = dt.timezone.utc if args.utc else None
    mnt = os.path.abspath(args.mountpoint)
    kw = dict(tz=tz, allow_other=not args.no_allow_other, gid=_group(args))
    if not args.daemon:
        server.serve(_archive(args), mnt, **kw)
        return 0
    server.prepare_mountpoint(mnt)
    pid = os.fork()
    if pid == 0:
        os.setsid()
        if os.fork():
            os._exit(0)
        _detach(args.log_file)
        try:
            server.serve(_archive(args), mnt, **kw)
        except Exception as e:      # nobody to tell but the log
            logging.getLogger(__name__).error("mount failed: %s", e)
            os._exit(1)
        os._exit(0)
    os.waitpid(pid, 0)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if server.is_tree(mnt):
            print(f"snapshot tree mounted on {mnt}")
            return 0
        time.sleep(0.1)
    raise UsageError(f"the snapshot tree did not come up on {mnt} within 60 s; see {args.log_file or 'the log'}")


def _group(args):
    """The gid that may read the tree; root's (0) when the group does not exist."""
    from foundation import access

    conf = common.settings(args).config
    name = args.group or access.group_name(conf)
    gid = access.group_id(name)
    if gid is None and (args.group or conf.snapshot_group):
        raise UsageError(f"there is no group {name} on this machine: create it (groupadd {name}) "
                         "or name another with --group / snapshot_group")
    if gid is None:
        log.warning("group %s does not exist: only root may read the snapshot tree "
                    "(create it, or set snapshot_group in the config file)", name)
        return 0
    log.info("the snapshot tree is readable by root and group %s", name)
    return gid


def _detach(log_file):
    fd = os.open(os.devnull, os.O_RDWR)
    out = os.open(log_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640) if log_file else fd
    os.dup2(fd, 0)
    os.dup2(out, 1)
    os.dup2(out, 2)
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    h = logging.StreamHandler(sys.stderr)
    h.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(h)
