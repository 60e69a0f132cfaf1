"""Serving the tree: mount, run until SIGTERM/SIGINT or an unmount, unmount cleanly.

`serve` blocks in the foreground (systemd runs it as Type=notify: READY=1
is sent once the kernel mount exists). A stale mount left by a killed
server ("Transport endpoint is not connected") is lazily unmounted first;
a live Foundation tree already mounted there is refused.

Who may look (GroupTree): the tree is mounted `allow_other` with the
guests' modes enforced by the kernel (default_permissions), but guest uids
are not host uids: a host account whose uid equals a guest user's would
read that guest user's files. So the tree's own directories belong to
root and the snapshot group (foundation.access): everything under a disk
(vda/, the guests' files) and the snapshot's metadata are for the group
only, the directories above may be passed through but not listed, so that
libvirt's QEMU (group kvm, the raw images' group) still reaches a booted
clone's backing file by its full path.
"""

import errno
import grp
import logging
import os
import signal
import socket
import stat
import subprocess

import pyfuse3
import trio

from foundation.errors import UsageError
from foundation.snapshotfs import MARKER
from foundation.snapshotfs.tree import SnapshotFS

log = logging.getLogger(__name__)


def is_tree(mountpoint):
    """True when a Foundation snapshot tree is mounted and answering at `mountpoint`.

    Lists the directory: unlike stat, a listing is never answered from the
    kernel's cache, so a dead server is not mistaken for a live one.
    """
    try:
        return os.path.ismount(mountpoint) and MARKER in os.listdir(mountpoint)
    except OSError:
        return False


def prepare_mountpoint(mountpoint):
    try:
        os.stat(mountpoint)
        if os.path.ismount(mountpoint):
            os.listdir(mountpoint)
    except OSError as e:
        if e.errno == errno.ENOTCONN:
            log.warning("%s: removing a stale mount left by a server that died", mountpoint)
            subprocess.run(["umount", "-l", mountpoint], check=False,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        elif e.errno == errno.ENOENT:
            os.makedirs(mountpoint, exist_ok=True)
        else:
            raise UsageError(f"cannot use {mountpoint} as a mount point: {e.strerror}")
    if is_tree(mountpoint):
        raise UsageError(f"a Foundation snapshot tree is already mounted on {mountpoint}")
    if os.path.ismount(mountpoint):
        raise UsageError(f"{mountpoint} is already a mount point of something else; unmount it first")
    if not os.path.isdir(mountpoint):
        raise UsageError(f"{mountpoint} is not a directory")


def default_raw_gid():
    """Raw images are group-readable by `kvm`, so libvirt's QEMU can use them as backing files."""
    try:
        return grp.getgrnam("kvm").gr_gid
    except KeyError:
        return 0


class GroupTree(SnapshotFS):
    """The tree with its own directories and metadata owned by root and group `gid`."""

    PASS = ("root", "year", "month", "day", "time", "snap")    # on QEMU's way to <canonical>/vda.raw
    GROUP = ("latest", "disk")                                  # the guests' files are below a disk

    def __init__(self, archive, gid=0, **kw):
        super().__init__(archive, **kw)
        self.gid = gid
        self.mountpoint = None  # its read-ahead is raised at the first open: FUSE_INIT has set it by then

    async def open(self, inode, flags, ctx):
        if self.mountpoint is not None:
            set_readahead(self.mountpoint)
            self.mountpoint = None
        return await super().open(inode, flags, ctx)

    def _attr(self, n):
        a = super()._attr(n)
        if n.kind in self.PASS:
            a.st_mode, a.st_gid = stat.S_IFDIR | 0o751, self.gid
        elif n.kind in self.GROUP:
            a.st_mode, a.st_gid = stat.S_IFDIR | 0o750, self.gid
        elif n.kind in ("blob", "changes") and n.snap is not None:   # domain.xml, ..., changes: guest names
            a.st_mode, a.st_gid = stat.S_IFREG | 0o440, self.gid
        return a


def fuse_options(allow_other=True, source="archive"):
    opts = set(pyfuse3.default_options)        # default_permissions: guest modes are enforced
    source = source.replace(",", "_")
    opts |= {f"fsname=foundation:{source}", "subtype=foundation", "ro"}
    if allow_other:
        opts.add("allow_other")
    return opts


READAHEAD_KB = 1024  # the kernel's read-ahead on the tree: 1 MiB requests (FUSE's most), not 128 KiB


def set_readahead(mountpoint, kb=READAHEAD_KB):
    """Raise the mount's read-ahead, so that a sequential reader (cp, dd, QEMU) asks in 1 MiB
    requests: each request costs the server the same whatever its size. Best effort. Not before
    the kernel's FUSE_INIT is answered: its reply sets the read-ahead (to 128 KiB)."""
    try:
        # from the mount table: a stat of the mount point would wait for this very server
        with open("/proc/self/mountinfo") as f:
            dev = [x.split()[2] for x in f if x.split()[4] == mountpoint][-1]
        with open(f"/sys/class/bdi/{dev}/read_ahead_kb", "w") as f:
            f.write(f"{kb}\n")
    except (OSError, IndexError) as e:
        log.debug("read-ahead of %s left as it was: %s", mountpoint, e)


def _sd_notify(msg):
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr:
        return
    if addr.startswith("@"):
        addr = "\0" + addr[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.connect(addr)
            s.sendall(msg.encode())
    except OSError as e:
        log.debug("sd_notify failed: %s", e)


def serve(archive, mountpoint, tz=None, allow_other=True, handle_signals=True, ready=None, gid=0):
    """Mount `archive` at `mountpoint` for root and group `gid`, serve until terminated; always unmounts."""
    mountpoint = os.path.abspath(mountpoint)
    prepare_mountpoint(mountpoint)
    ops = GroupTree(archive, gid=gid, tz=tz, raw_gid=default_raw_gid())
    source = getattr(archive, "path", None) or getattr(archive, "manifest", "archive")
    pyfuse3.init(ops, mountpoint, fuse_options(allow_other, source))
    ops.mountpoint = mountpoint
    log.info("serving %s on %s", getattr(archive, "description", "archive"), mountpoint)
    _sd_notify("READY=1")
    if ready is not None:
        ready()
    try:
        trio.run(_main, ops, handle_signals)
    finally:
        pyfuse3.close(unmount=True)
        archive.close()
        log.info("unmounted %s", mountpoint)


async def _main(ops, handle_signals):
    async with trio.open_nursery() as nursery:
        ops.nursery = nursery
        if handle_signals:
            nursery.start_soon(_on_signal, nursery.cancel_scope)
        await pyfuse3.main(min_tasks=4, max_tasks=32)
        nursery.cancel_scope.cancel()


async def _on_signal(scope):
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async for sig in signals:
            log.info("signal %s: unmounting", signal.Signals(sig).name)
            _sd_notify("STOPPING=1")
            pyfuse3.terminate()
            return
