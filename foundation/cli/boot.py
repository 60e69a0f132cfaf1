"""`foundation boot VM WHEN [--start]`: a writable clone of a past day, as a libvirt domain.

Reads only the mounted snapshot tree (never the store), so it needs
`foundation mount` running; see foundation/snapshotfs/clone.py for what
the clone is made of. `--list` shows the clones, `--remove NAME` deletes
one (domain and overlays); neither touches a domain that is not a clone.
"""

import os
import shutil
import time

from foundation.cli.common import settings
from foundation.errors import BadInput, NotFound, UsageError

NAME = "boot"
HELP = "boot a past day of a VM as a new libvirt domain (a writable clone); --list, --remove"
DESCRIPTION = (
    "Define a libvirt domain <vm>@YYYY-MM-DD whose disks are new qcow2 overlays over the archived "
    "raw images of that day (the archive is never written). WHEN is YYYY-MM-DD, YYYY-MM-DDTHH:MM[:SS] "
    "or `latest`; with a time, the VM's latest snapshot that day not after it. Needs the snapshot tree "
    "mounted (foundation mount)."
)


def add_arguments(p):
    p.add_argument("vm", nargs="?", help="the archived VM's name")
    p.add_argument("when", nargs="?", help="YYYY-MM-DD, YYYY-MM-DDTHH:MM[:SS] or latest")
    p.add_argument("--start", action="store_true", help="start the clone once defined")
    p.add_argument("--name", help="name of the new domain (default <vm>@YYYY-MM-DD)")
    p.add_argument("--list", action="store_true", help="list the clones")
    p.add_argument("--remove", metavar="NAME", help="undefine clone NAME and delete its overlays")
    p.add_argument("--force", action="store_true", help="with --remove: stop the clone first if it runs")
    p.add_argument("--mountpoint", dest="snapshot_dir",
                   help="where the snapshot tree is mounted (default /snapshot; env FOUNDATION_SNAPSHOT_DIR)")
    p.add_argument("--clones-dir", default=None,
                   help="where overlays go (default /var/lib/foundation/clones; env FOUNDATION_CLONES_DIR)")
    p.add_argument("--connect", default=None,
                   help="libvirt URI (default: $LIBVIRT_DEFAULT_URI, the config's libvirt_uri, qemu:///system)")


def _uri(args):
    """--connect, $LIBVIRT_DEFAULT_URI, the config's libvirt_uri."""
    s = settings(args)
    return args.connect or s.env["libvirt_uri"] or s.libvirt_uri


def _connect(uri):
    try:
        import libvirt
    except ImportError:
        raise UsageError("libvirt-python is not installed: pip install libvirt-python") from None
    libvirt.registerErrorHandler(lambda *a: None, None)    # errors come back as exceptions
    try:
        return libvirt.open(uri)
    except libvirt.libvirtError as e:
        raise UsageError(f"cannot connect to libvirt at {uri}: {e}; is libvirtd running? (scripts/libvirt.sh)") from None


def run(args):
    if args.list:
        return _list(args)
    if args.remove:
        return _remove(args, args.remove)
    if not args.vm or not args.when:
        raise UsageError("usage: foundation boot VM WHEN [--start] | --list | --remove NAME")
    return _boot(args)


def _boot(args):
    import libvirt

    from foundation.snapshotfs import clone

    mnt = os.path.abspath(settings(args).snapshot_dir)
    snap = clone.find_snapshot(mnt, args.vm, args.when)
    name = args.name or clone.clone_name(snap, mnt)
    if "/" in name or not name.strip():
        raise BadInput(f"{name!r} is not a usable domain name")
    conn = _connect(_uri(args))
    try:
        try:
            conn.lookupByName(name)
            raise UsageError(f"a domain named {name} already exists: remove it with "
                             f"`foundation boot --remove {name}` or choose another --name")
        except libvirt.libvirtError:
            pass
        xml = clone.read_domain_xml(snap)
        cdir, overlays = clone.create_overlays(snap, name, settings(args).clones_dir)
        try:
            nvram = clone.copy_nvram(snap, cdir)
            new_xml = clone.clone_xml(xml, name, snap, overlays, nvram_path=nvram)
            dom = conn.defineXML(new_xml)
        except BaseException as e:
            shutil.rmtree(cdir, ignore_errors=True)
            if isinstance(e, libvirt.libvirtError):
                raise UsageError(f"libvirt refused the clone's domain XML: {e}") from None
            raise
        print(f"defined {name}: {snap.name} as of {snap.path} (overlays in {cdir})")
        if args.start:
            t0 = time.monotonic()
            try:
                dom.create()
            except libvirt.libvirtError as e:
                raise UsageError(f"{name} is defined but did not start: {e}") from None
            print(f"started {name} in {time.monotonic() - t0:.1f} s")
        return 0
    finally:
        conn.close()


def _clones(conn):
    from foundation.snapshotfs import clone

    out = []
    for dom in conn.listAllDomains():
        m = clone.read_marker(dom.XMLDesc(0))
        if m is not None:
            out.append((dom, m))
    return sorted(out, key=lambda x: x[0].name())


def _list(args):
    conn = _connect(_uri(args))
    try:
        rows = _clones(conn)
        if not rows:
            print("no clones")
            return 0
        for dom, m in rows:
            state = "running" if dom.isActive() else "shut off"
            used = sum(os.path.getsize(p) for p in m["overlays"].values() if os.path.exists(p))
            print(f"{dom.name():32} {state:9} {m['vm']} as of {m['path']}  overlays {used / 1e6:,.1f} MB")
        return 0
    finally:
        conn.close()


def _remove(args, name):
    import libvirt

    from foundation.snapshotfs import clone

    conn = _connect(_uri(args))
    try:
        try:
            dom = conn.lookupByName(name)
        except libvirt.libvirtError:
            raise NotFound(f"no domain named {name}") from None
        m = clone.read_marker(dom.XMLDesc(0))
        if m is None:
            raise UsageError(f"{name} is not a Foundation clone; refusing to remove it")
        if dom.isActive():
            if not args.force:
                raise UsageError(f"{name} is running: shut it down first, or pass --force to stop it "
                                 f"(its unsaved state is lost)")
            dom.destroy()
        flags = getattr(libvirt, "VIR_DOMAIN_UNDEFINE_NVRAM", 0)
        try:
            dom.undefineFlags(flags)
        except libvirt.libvirtError:
            dom.undefine()
        dirs = {os.path.dirname(p) for p in m["overlays"].values()}
        for p in m["overlays"].values():
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass
        for d in dirs:
            if os.path.basename(d) == name:
                shutil.rmtree(d, ignore_errors=True)
        print(f"removed {name}")
        return 0
    finally:
        conn.close()

