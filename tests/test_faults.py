"""Crash points: the armed point's N-th passage kills the process with status 137, nothing else does."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PASSES = """
from foundation.faults import crash_point
for i in range(3):
    crash_point("FDN_TEST_CRASH", "a")
    crash_point("FDN_TEST_CRASH", "b")
    print(i, flush=True)
"""


def run(arm):
    env = {k: v for k, v in os.environ.items() if k != "FDN_TEST_CRASH"}
    if arm:
        env["FDN_TEST_CRASH"] = arm
    return subprocess.run([sys.executable, "-c", PASSES], cwd=ROOT, env=env, capture_output=True, text=True)


def test_the_nth_passage_of_the_armed_point_exits_137():
    p = run("b:2")
    assert (p.returncode, p.stdout.split()) == (137, ["0"])
    assert p.stderr == "foundation: test crash at b\n"
    assert run("a").returncode == 137 and run("a").stdout == ""


def test_unarmed_or_other_points_run_through():
    for arm in (None, "c", "a:4"):
        p = run(arm)
        assert (p.returncode, p.stdout.split()) == (0, ["0", "1", "2"]), arm
