"""`python -m foundation.vm --dir DIR VM...`: archive VMs into plain raw files, no store.

For debugging a chain and for the archiver's own tests: the same runs,
journal and repairs as `foundation archive`, with each snapshot kept as
DIR/<id>/<disk>.raw (see sink.DirSink). Prints one JSON result per VM.
"""

import argparse
import json
import logging
import sys

from foundation.config import QUIESCE_MODES
from foundation.vm import Archiver, DirSink, connect


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m foundation.vm")
    p.add_argument("--dir", required=True, help="directory of raw snapshots")
    p.add_argument("--state-dir", required=True, help="journal directory")
    p.add_argument("--uri", default="qemu:///system")
    p.add_argument("--quiesce", choices=QUIESCE_MODES, default="auto")
    p.add_argument("vms", nargs="+")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    arch = Archiver(connect(a.uri), DirSink(a.dir), a.state_dir, quiesce=a.quiesce)
    ok = True
    for name in a.vms:
        r = arch.archive(name)
        ok &= r.status in ("ok", "unchanged")
        print(json.dumps(r.to_json()), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
