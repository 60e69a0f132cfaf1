"""`foundation audit [--sample PCT] [--replica NAME]`: check the replicas against the local store.

Every object the replica's manifest names must be present with its size;
the sampled arenas (all by default) are downloaded and checked like
`verify` checks the local log; the manifest must be authentic and as
recent as the local head. Each problem is printed as MISSING, STALE,
CORRUPT, TAMPERED or FOREIGN with the object it concerns; the exit status
is 1 when there is any. With --fix, a replicate sends the objects that
fail their checks again, in place (nothing the replica's committed
manifest names is deleted first), and whatever is missing or stale.
"""

import random
import sys

from foundation.cli.common import Progress, open_primary, replicas, replicate_one
from foundation.errors import Error

NAME = "audit"
HELP = "check that the replicas hold every arena, whole, authentic and up to date; exit 1 if not"


def add_arguments(p):
    p.add_argument("--replica", metavar="NAME", action="append",
                   help="only this configured replica (or a URL); may be repeated (default: all configured)")
    p.add_argument("--sample", metavar="PCT", type=float, default=100.0,
                   help="download and check this percentage of the arenas, chosen at random (default 100; "
                        "0 checks only presence, sizes and the manifest)")
    p.add_argument("--seed", type=int, help="seed of the random sample (to repeat an audit)")
    p.add_argument("--fix", action="store_true",
                   help="send the objects found corrupt or tampered again, and replicate what is missing or stale")


def run(args):
    from foundation.replica import open_backend
    from foundation.replica.audit import audit

    status = 0
    rng = random.Random(args.seed)
    for spec in replicas(args, args.replica):
        bars = []

        def bar(total, _spec=spec):
            bars.append(Progress(f"audit {_spec.name or _spec.url}", total))
            return bars[-1]

        try:
            with open_primary(args) as local, open_backend(spec) as backend:
                rep = audit(local, backend, args.sample, progress=bar, rng=rng)
                for b in bars:
                    b.finish()
                for p in rep.problems:
                    print(p)
            fixed = None
            if rep.problems and args.fix and not any(p.kind == "foreign" for p in rep.problems):
                # Damaged objects are sent again in place, under the same names: nothing the committed
                # manifest names is ever deleted before a new manifest replaces it.
                fixed = replicate_one(args, spec, resend=rep.bad_objects())
        except Error as e:
            print(f"foundation: {e}", file=sys.stderr)
            status = status or e.code
            continue
        print(_summary(rep, spec))
        if fixed is not None:
            print(f"fixed: {fixed.summary()}")
            print("run `foundation audit` again to check the replica")
        if rep.problems:
            status = status or 1
    return status


def _summary(rep, spec):
    who = f"replica {spec.name + ' ' if spec.name else ''}({rep.url})"
    if rep.problems:
        kinds = {}
        for p in rep.problems:
            kinds[p.kind] = kinds.get(p.kind, 0) + 1
        return f"{who}: {len(rep.problems)} problem(s): " + ", ".join(f"{n} {k}" for k, n in kinds.items())
    return (f"ok: {who}: {rep.arenas} arena(s) present, {rep.checked} downloaded and checked "
            f"({rep.bytes_checked / 1e6:,.1f} MB); up to date at arena {rep.head.arena} offset {rep.head.end} "
            f"(written {rep.written})")
