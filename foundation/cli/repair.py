"""`foundation repair [--replica NAME] [--image PATH ...] [--vm NAME ...]`: mend damaged arenas.

Every arena is checked as `verify` checks it (the store need not open);
a damaged one is replaced by a replica's copy that verifies and fits the
chain, and records no replica gives back are written again from a disk
image still holding their blocks (foundation.replica.repair). The writer
lock and the readers' lock are held throughout: stop archives and the
/snapshot tree first. Prints what was healed and what is still lost; the
exit status is 1 if anything is.
"""

import sys

from foundation.cli.common import key_file, passphrase, replicas, settings, store_path

NAME = "repair"
HELP = "replace damaged arenas from a replica, and heal damaged records from disk images"


def add_arguments(p):
    p.add_argument("--replica", metavar="NAME", action="append",
                   help="use this configured replica (or URL); may be repeated (default: every configured one)")
    p.add_argument("--no-replica", action="store_true", help="use no replica, only --image/--vm")
    p.add_argument("--image", metavar="PATH", action="append", default=[],
                   help="a disk image (raw, qcow2, ...) that may still hold damaged blocks; may be repeated")
    p.add_argument("--format", metavar="FMT", help="format of the --image files (default: as qemu-img probes it)")
    p.add_argument("--vm", metavar="NAME", action="append", default=[],
                   help="a libvirt VM whose current disks may still hold damaged blocks (shut it down first)")
    p.add_argument("--libvirt-uri", help="libvirt connection for --vm (default: config `libvirt_uri`)")


def run(args):
    from contextlib import ExitStack

    from foundation.errors import UsageError
    from foundation.replica import open_backend
    from foundation.replica.repair import repair

    images = [(p, args.format) for p in args.image] + _vm_images(args)
    with ExitStack() as stack:
        backends = []
        if not args.no_replica:
            try:
                chosen = replicas(args, args.replica)
            except UsageError:
                chosen = []
            backends = [stack.enter_context(open_backend(spec)) for spec in chosen]
        res = repair(store_path(args), key_file(args), backends, images, passphrase=passphrase(args))
    for note in res.notes:
        print(f"note: {note}", file=sys.stderr)
    for h in res.healed:
        print(f"HEALED {h}")
    for d in res.lost:
        print(f"LOST {d}")
    if not res.found:
        print("ok: nothing is damaged")
        return 0
    if res.lost:
        print(f"{len(res.lost)} damaged place(s) remain: the blocks there cannot be read. A replica with a good copy, "
              "or an image still holding the blocks (--image, --vm), may heal them.", file=sys.stderr)
        return 1
    print(f"ok: repaired ({len(res.healed)} repair(s)); `foundation verify` finds no more damage"
          + (" except the records whose blocks were stored again" if res.restored else ""))
    return 0


def _vm_images(args):
    """(path, format) of the current top file of every disk of the --vm domains."""
    if not args.vm:
        return []
    from foundation.vm import connect
    from foundation.vm.domain import Domain

    conn = connect(settings(args).libvirt_uri)
    out = []
    for name in args.vm:
        out += [(d.path, d.format) for d in Domain(conn, name).disks()[0]]
    return out
