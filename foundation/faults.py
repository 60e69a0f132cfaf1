"""Crash points: named places where a crash test kills the process, as a power cut would.

A subsystem marks a point with `crash_point(ENV, "name")`; a test sets
ENV (each subsystem names its own variable) to "name" or "name:N", and
the N-th time the process reaches that point it exits at once with
status 137, as if killed: nothing is unwound, closed or flushed. With
ENV unset a point costs one environment lookup. One mechanism for every
subsystem, so that every crash test means the same thing by a crash.
"""

import os
import sys

_reached = {}       # point -> how often this process reached it while it was armed


def crash_point(env, point):
    """Exit with status 137 here if $env arms this point (and this is its N-th time)."""
    want = os.environ.get(env)
    if not want:
        return
    name, _, count = want.partition(":")
    if name != point:
        return
    _reached[point] = _reached.get(point, 0) + 1
    if _reached[point] >= int(count or 1):
        sys.stderr.write(f"foundation: test crash at {point}\n")
        sys.stderr.flush()
        os._exit(137)
