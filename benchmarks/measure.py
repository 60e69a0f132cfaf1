"""Running a command and measuring it: wall time, CPU seconds and peak memory.

Peak memory comes from GNU time: a child forked from a large Python
process (a benchmark holding an image in memory) would otherwise report
the parent's RSS as its own peak, since Linux carries the high-water mark
across fork and exec. GNU time's own child is forked from a small process.
"""

import os
import shutil
import subprocess
import tempfile
import time


def drop_caches():
    """Write back and drop the page cache, so the next command reads from the disk; -> False if not root."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def op(cmd, cwd=None, env=None, cold=True):
    """Run one measured operation, the page cache dropped first when `cold` ->
    {"seconds", "cpu_seconds" (user + sys of the command and its children), "peak_rss" (bytes),
    "sync_seconds" (a `sync` right after: what the command left unwritten, since tools differ in
    whether they fsync before they exit)}."""
    if cold:
        drop_caches()
    dt, peak, _, cpu = _run(cmd, cwd, env)
    t0 = time.perf_counter()
    os.sync()
    return {"seconds": round(dt, 3), "cpu_seconds": round(cpu, 3), "peak_rss": peak,
            "sync_seconds": round(time.perf_counter() - t0, 3)}


def run(cmd, cwd=None, env=None, capture=False, ok=(0,)):
    """Run a command -> (seconds, peak RSS in bytes, stdout bytes if capture); raise on an exit status
    not in `ok`."""
    return _run(cmd, cwd, env, capture, ok)[:3]


def _run(cmd, cwd=None, env=None, capture=False, ok=(0,)):
    e = dict(os.environ, **(env or {}))
    gtime = shutil.which("time") or ("/usr/bin/time" if os.path.exists("/usr/bin/time") else None)
    with tempfile.TemporaryFile() as err, tempfile.TemporaryFile() as out, \
            tempfile.NamedTemporaryFile("r") as rss:
        full = [gtime, "-f", "%M", "-o", rss.name, *map(str, cmd)] if gtime else list(map(str, cmd))
        t0 = time.perf_counter()
        p = subprocess.Popen(full, cwd=cwd, env=e, stdin=subprocess.DEVNULL,
                             stdout=out if capture else subprocess.DEVNULL, stderr=err)
        _, status, ru = os.wait4(p.pid, 0)
        dt = time.perf_counter() - t0
        code = os.waitstatus_to_exitcode(status)
        if code not in ok:
            err.seek(0)
            raise RuntimeError(f"{' '.join(map(str, cmd))} failed ({code}): {err.read().decode()[-2000:]}")
        peak = ru.ru_maxrss * 1024   # an upper bound only (see the module docstring)
        if gtime:
            lines = [x for x in rss.read().split() if x.isdigit()]
            if lines:
                peak = int(lines[-1]) * 1024
        out.seek(0)
        return dt, peak, out.read() if capture else None, ru.ru_utime + ru.ru_stime


def save(name, res):
    """Print a result and write it to benchmarks/results/<name>-<time>.json -> its path."""
    import json
    print(json.dumps(res, indent=1))
    d = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, f"{name}-{time.strftime('%Y%m%d-%H%M%S')}.json")
    with open(path, "w") as f:
        json.dump(res, f, indent=1)
    return path


def timed(cmd, cwd=None, env=None, ok=(0,)):
    """Run a command under GNU time -> (dict(wall_s, cpu_s (user + sys), peak_rss_mib), stdout bytes);
    raise on an exit status not in `ok`."""
    with tempfile.NamedTemporaryFile("r") as out:
        full = ["/usr/bin/time", "-f", "%e %U %S %M", "-o", out.name, *map(str, cmd)]
        p = subprocess.run(full, cwd=cwd, env=dict(os.environ, **(env or {})), capture_output=True)
        if p.returncode not in ok:
            raise RuntimeError(f"{' '.join(map(str, cmd))} failed ({p.returncode}): {p.stderr.decode()[-2000:]}")
        e, u, s, m = out.read().split()[-4:]
    return dict(wall_s=float(e), cpu_s=round(float(u) + float(s), 2), peak_rss_mib=round(int(m) / 1024, 1)), p.stdout


def usage(path):
    """-> (allocated bytes, apparent bytes) of every file under `path`."""
    alloc = apparent = 0
    for d, _, files in os.walk(path):
        for f in files:
            try:
                st = os.lstat(os.path.join(d, f))
            except FileNotFoundError:
                continue
            alloc += st.st_blocks * 512
            apparent += st.st_size
    return alloc, apparent


def table(head, rows):
    """Rows of strings as aligned columns."""
    lines = [head] + rows
    w = [max(len(r[i]) for r in lines) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w[i]) for i, c in enumerate(r)).rstrip() for r in lines)
