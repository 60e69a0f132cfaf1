"""Foundation against the backup tools a user would pick instead, in one run, each figure a ratio to the best peer.

Three parts, each on the same bytes for every tool, the page cache dropped
(`sync; echo 3 > /proc/sys/vm/drop_caches`) before every timed operation:

1. The standard workload (benchmarks/workload.py: 2 GiB image, 8 days,
   about 3 % of the blocks changed a day). Every tool backs up the same
   file, `WORK/current/disk.raw` (the day's image copied there untimed),
   into a fresh repository of its own, default settings, encrypted (restic
   always; borg `repokey`; kopia always; Foundation's key file). Foundation
   reads only the day's `--changed` ranges after day 0, as its archiver
   knows them; it also imports one day with no change. Then the last day
   and day 0 are restored and checked against their SHA-256.
2. The same days on a 64 GiB sparse disk (the 2 GiB image with 62 GiB of
   hole after it, so the same data and the same daily change): day 0 and
   day 1 by default (`--big-days`), Foundation and restic (`--big-tools`).
3. virtnbdbackup on its own ground (benchmarks/peer_domains.py): two
   identical running domains, one archived by `foundation archive`, the
   other by virtnbdbackup (libvirt refuses checkpoints beside external
   snapshots), the same writes into both each night.

    python benchmarks/compare_tools.py [--tools foundation-hash,restic,borg,kopia] [--size 2G]
        [--days 8] [--nights 5] [--skip-workload] [--skip-big] [--skip-virtnbd] [--reuse] [--work DIR]
    python benchmarks/compare_tools.py --show benchmarks/results/compare-….json

Without `--reuse`, scripts/peers.sh installs what is missing first (kopia is
built from the Go module proxy once, about 4 minutes). Writes
benchmarks/results/compare-SIZE-TIMESTAMP.json and prints the tables, then
each of Foundation's figures as a ratio to the best peer measured in the
same run, beside the aim of issue 18. Run as root (the page cache, libvirt).
The whole default run took about 40 minutes on 2 cores shared with other
work at load average 10-13 (the standard workload alone 11 minutes at 2-5);
restic reading the 64 GiB disk twice is about a quarter of it.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import measure  # noqa: E402
import peer_domains  # noqa: E402
from workload import generate, parse_size, sha256_file, sparse_copy  # noqa: E402

PASSWORD = "benchmark-password"
CACHE_BIN = os.path.join(os.environ.get("FOUNDATION_CACHE", "/var/cache/foundation"), "bin")


def which(exe):
    return shutil.which(exe) or (os.path.join(CACHE_BIN, exe) if os.access(os.path.join(CACHE_BIN, exe), os.X_OK)
                                 else None)


def foundation_cmd(*args):
    return [sys.executable, "-m", "foundation", *args]


class Tool:
    name = "?"
    exe = None
    peer = True

    def available(self):
        return self.exe is None or which(self.exe) is not None

    def bin(self):
        return which(self.exe)

    def version(self):
        return ""

    def env(self, work):
        return {}

    def caches(self, work):
        """Directories of the tool's own cache, removed with its repository."""
        return [v for k, v in self.env(work).items() if k.endswith(("_CACHE_DIR", "_CACHE_DIRECTORY", "_BASE_DIR"))]

    def init(self, repo, work):
        pass

    def backup(self, repo, work, day, image, changed):
        """-> (cmd, cwd)."""
        raise NotImplementedError

    def restore(self, repo, work, day, out_dir):
        """-> (cmd, cwd, path of the restored image)."""
        raise NotImplementedError


class Foundation(Tool):
    peer = False
    max_log = None

    def __init__(self, mode, changed):
        self.mode, self.use_changed = mode, changed
        self.name = f"foundation-{mode}" + ("" if changed else "-full")

    def _cmd(self, repo, work, *args):
        return foundation_cmd("--store", repo, "--key-file", os.path.join(work, f"{self.name}.key"), *args)

    def env(self, work):
        # Bytecode cached, as an installed package has it: with PYTHONDONTWRITEBYTECODE set (an empty
        # value unsets it) every command compiled ~120 modules again, ~0.1 CPU s of each operation.
        return {"PYTHONPATH": ROOT, "PYTHONDONTWRITEBYTECODE": ""}

    def version(self):
        # the last commit that changed Foundation itself, not the benchmarks
        head = subprocess.run(["git", "-C", ROOT, "log", "-1", "--format=%h", "--", "foundation", "csrc"],
                              capture_output=True, text=True)
        return head.stdout.strip()

    def init(self, repo, work):
        subprocess.run([sys.executable, "-m", "compileall", "-q", "foundation"], cwd=ROOT, check=True,
                       capture_output=True, env=dict(os.environ, **self.env(work)))
        key = os.path.join(work, f"{self.name}.key")
        if os.path.exists(key):
            os.unlink(key)
        extra = ["--max-log-size", self.max_log] if self.max_log else []
        measure.run(self._cmd(repo, work, "init", repo, "--mode", self.mode, *extra), env=self.env(work))

    def backup(self, repo, work, day, image, changed):
        args = ["import-image", "bench", image, "--at", f"2024-01-{day + 1:02d}T03:00:00Z"]
        if changed and self.use_changed:
            args += ["--changed", changed]
        return self._cmd(repo, work, *args), None

    def restore(self, repo, work, day, out_dir):
        out = os.path.join(out_dir, "disk.raw")
        return self._cmd(repo, work, "restore", f"bench@2024-01-{day + 1:02d}T03:00:00Z", out), None, out


class Restic(Tool):
    name = exe = "restic"

    def version(self):
        return subprocess.run([self.bin(), "version"], capture_output=True, text=True).stdout.split()[1]

    def env(self, work):
        return {"RESTIC_PASSWORD": PASSWORD, "RESTIC_CACHE_DIR": os.path.join(work, "restic-cache")}

    def init(self, repo, work):
        measure.run([self.bin(), "-r", repo, "init"], env=self.env(work))

    def backup(self, repo, work, day, image, changed):
        return [self.bin(), "-r", repo, "backup", "--host", "bench", "-q", image], None

    def restore(self, repo, work, day, out_dir):
        listing = subprocess.run([self.bin(), "-r", repo, "snapshots", "--json"], capture_output=True, text=True,
                                 env=dict(os.environ, **self.env(work)), check=True)
        snap = sorted(json.loads(listing.stdout), key=lambda s: s["time"])[day]
        img = os.path.join(work, "current", "disk.raw")
        return ([self.bin(), "-r", repo, "restore", snap["id"], "--target", out_dir, "-q"], None,
                os.path.join(out_dir, img.lstrip("/")))


class Borg(Tool):
    name = exe = "borg"

    def version(self):
        return subprocess.run([self.bin(), "--version"], capture_output=True, text=True).stdout.split()[-1]

    def env(self, work):
        return {"BORG_PASSPHRASE": PASSWORD, "BORG_BASE_DIR": os.path.join(work, "borg-base"),
                "BORG_RELOCATED_REPO_ACCESS_IS_OK": "yes"}

    def init(self, repo, work):
        measure.run([self.bin(), "init", "--encryption=repokey", repo], env=self.env(work))

    def backup(self, repo, work, day, image, changed):
        return [self.bin(), "create", f"{repo}::day{day}", "disk.raw"], os.path.dirname(image)

    def restore(self, repo, work, day, out_dir):
        return [self.bin(), "extract", f"{repo}::day{day}"], out_dir, os.path.join(out_dir, "disk.raw")


class Kopia(Tool):
    name = exe = "kopia"

    def version(self):
        return subprocess.run([self.bin(), "--version"], capture_output=True, text=True).stdout.split()[0]

    def env(self, work):
        return {"KOPIA_PASSWORD": PASSWORD, "KOPIA_CONFIG_PATH": os.path.join(work, "kopia.config"),
                "KOPIA_CACHE_DIRECTORY": os.path.join(work, "kopia-cache"), "KOPIA_CHECK_FOR_UPDATES": "false"}

    def init(self, repo, work):
        measure.run([self.bin(), "repository", "create", "filesystem", "--path", repo], env=self.env(work))

    def backup(self, repo, work, day, image, changed):
        return [self.bin(), "snapshot", "create", image], None

    def restore(self, repo, work, day, out_dir):
        img = os.path.join(work, "current", "disk.raw")
        out = os.path.join(out_dir, "disk.raw")
        listing = subprocess.run([self.bin(), "snapshot", "list", "--json", img], capture_output=True, text=True,
                                 env=dict(os.environ, **self.env(work)), check=True)
        snap = json.loads(listing.stdout)[day]
        return [self.bin(), "snapshot", "restore", snap["id"], out], None, out


ALL = [Foundation("hash", True), Foundation("value", True), Foundation("hash", False),
       Foundation("value", False), Restic(), Borg(), Kopia()]
DEFAULT_TOOLS = "foundation-hash,restic,borg,kopia"


def gib(size):
    return f"{size / (1 << 30):g} GiB"


def say(msg):
    print(msg, file=sys.stderr, flush=True)


def place(src, image, size):
    """The day's image at `image` (untimed): a sparse copy, extended with a hole to `size`."""
    if os.path.exists(image):
        os.unlink(image)
    sparse_copy(src, image)
    if size > os.path.getsize(image):
        os.truncate(image, size)


def bench_tool(tool, man, days_dir, work, size, ndays=None, restores=True):
    """Back up the days of `man` with `tool`, restore the last day and day 0 -> result dict."""
    repo = os.path.join(work, "repo-" + tool.name)
    shutil.rmtree(repo, ignore_errors=True)
    os.makedirs(repo)
    cur_dir = os.path.join(work, "current")
    os.makedirs(cur_dir, exist_ok=True)
    image = os.path.join(cur_dir, "disk.raw")
    tool.init(repo, work)
    res = {"tool": tool.name, "version": tool.version(), "size": size, "days": [], "restores": []}
    days = man["day"][:ndays or len(man["day"])]
    for d, entry in enumerate(days):
        place(os.path.join(days_dir, entry["image"]), image, size)
        changed = os.path.join(days_dir, entry["changed"]) if "changed" in entry else None
        cmd, cwd = tool.backup(repo, work, d, image, changed)
        m = measure.op(cmd, cwd=cwd, env=tool.env(work))
        m["store_bytes"], m["store_apparent"] = measure.usage(repo)
        m.update(day=d, mb_s=round(size / 1e6 / m["seconds"], 1), load=os.getloadavg()[0])
        res["days"].append(m)
        say(f"  {tool.name} day {d}: {m['seconds']:.2f} s ({m['cpu_seconds']:.2f} CPU s), "
            f"store {m['store_bytes'] / 1e6:,.0f} MB, {m['peak_rss'] / 1e6:,.0f} MB RSS")
    if isinstance(tool, Foundation) and tool.use_changed:
        # A day that changes nothing: what a night costs past its fixed costs.
        empty = os.path.join(work, "empty.changed.json")
        with open(empty, "w") as f:
            f.write("[]")
        cmd, cwd = tool.backup(repo, work, len(days), image, empty)
        res["idle_day"] = measure.op(cmd, cwd=cwd, env=tool.env(work))
        # the aim counts the work past the process's start: the same interpreter started cold alone
        res["idle_day"]["start"] = measure.op([sys.executable, "-c", "pass"], env=tool.env(work))["seconds"]
        say(f"  {tool.name} idle day: {res['idle_day']['seconds']:.2f} s ({res['idle_day']['cpu_seconds']:.2f} CPU s; "
            f"the interpreter's cold start alone {res['idle_day']['start']:.2f} s)")
    if os.path.exists(image):
        os.unlink(image)
    for d in ([len(days) - 1, 0] if restores else []):
        out_dir = os.path.join(work, "restore-" + tool.name)
        shutil.rmtree(out_dir, ignore_errors=True)
        os.makedirs(out_dir)
        cmd, cwd, path = tool.restore(repo, work, d, out_dir)
        m = measure.op(cmd, cwd=cwd or out_dir, env=tool.env(work))
        m.update(day=d, mb_s=round(size / 1e6 / m["seconds"], 1), correct=sha256_file(path) == days[d]["sha256"],
                 load=os.getloadavg()[0])
        res["restores"].append(m)
        say(f"  {tool.name} restore day {d}: {m['seconds']:.2f} s ({m['cpu_seconds']:.2f} CPU s), "
            f"correct={m['correct']}")
        shutil.rmtree(out_dir, ignore_errors=True)
    return res, repo


def summarize(r):
    days = r["days"]
    later = days[1:] or days
    s = {
        "tool": r["tool"], "version": r["version"],
        "day0_s": days[0]["seconds"], "day0_cpu_s": days[0]["cpu_seconds"], "day0_mb_s": days[0]["mb_s"],
        "later_s": statistics.median(x["seconds"] for x in later),
        "later_cpu_s": statistics.median(x["cpu_seconds"] for x in later),
        "store_bytes": days[-1]["store_bytes"], "store_apparent": days[-1]["store_apparent"],
        "peak_rss": max(x["peak_rss"] for x in days + r["restores"]),
    }
    if r["restores"]:
        s["restore_s"] = statistics.median(x["seconds"] for x in r["restores"])
        s["restore_cpu_s"] = statistics.median(x["cpu_seconds"] for x in r["restores"])
        if all("sync_seconds" in x for x in r["restores"]):
            s["restore_sync_s"] = statistics.median(x["seconds"] + x["sync_seconds"] for x in r["restores"])
        s["restore_mb_s"] = round(r["size"] / 1e6 / s["restore_s"], 1)
        s["restore_correct"] = all(x["correct"] for x in r["restores"])
    if "idle_day" in r:
        s["idle_s"], s["idle_cpu_s"] = r["idle_day"]["seconds"], r["idle_day"]["cpu_seconds"]
        s["idle_start_s"] = r["idle_day"].get("start")
    return s


def workload_table(rows):
    head = ["tool", "day 0 s (CPU)", "day 0 MB/s", "later day s (CPU), median", "restore s (CPU), median (MB/s)",
            "store GB (apparent)", "peak MB"]
    out = []
    for s in rows:
        restore = "-" if "restore_s" not in s else (
            f"{s['restore_s']:.2f} ({s['restore_cpu_s']:.2f}) ({s['restore_mb_s']:,.0f})"
            + ("" if s["restore_correct"] else " WRONG")
            + (f"; {s['restore_sync_s']:.2f} with sync" if "restore_sync_s" in s else ""))
        out.append([f"{s['tool']} {s['version']}", f"{s['day0_s']:.2f} ({s['day0_cpu_s']:.2f})",
                    f"{s['day0_mb_s']:,.0f}", f"{s['later_s']:.2f} ({s['later_cpu_s']:.2f})", restore,
                    f"{s['store_bytes'] / 1e9:.2f} ({s['store_apparent'] / 1e9:.2f})", f"{s['peak_rss'] / 1e6:,.0f}"])
    return measure.table(head, out)


def ratios(rows, standard):
    """Foundation's figures against the best peer of the same run, each as "how many times better" (above 1:
    Foundation better), with issue 18's aim -> {foundation tool: {figure: {ratio, peer, aim, reached}}}.
    The aims of store size and memory are absolute, and set for the standard workload only."""
    peers = [s for s in rows if not s["tool"].startswith("foundation")]
    out = {}
    for s in rows:
        if s in peers or not peers:
            continue

        def entry(key, aim, pool=peers, cpu=None):
            b = min(pool, key=lambda p: p[key])
            ratio = round(b[key] / s[key], 2)
            e = {"ratio": ratio, "peer": b["tool"], "aim": f">= {aim:g}x", "reached": ratio >= aim}
            if cpu:
                e["cpu_ratio"] = round(b[cpu] / s[cpu], 2)
            return e

        r = {"day 0": entry("day0_s", 2, cpu="day0_cpu_s"), "later day": entry("later_s", 10, cpu="later_cpu_s")}
        restic = [p for p in peers if p["tool"] == "restic" and "restore_s" in p]
        if "restore_s" in s and restic:
            r["restore (vs restic)"] = entry("restore_s", 1.5, restic, cpu="restore_cpu_s")
        for fig, key, limit, unit in (("store", "store_bytes", 1.2e9, "GB"), ("peak memory", "peak_rss", 150e6, "MB")):
            e = entry(key, 1)
            if standard:
                e["aim"] = f"<= {limit / (1e9 if unit == 'GB' else 1e6):g} {unit}"
                e["reached"] = s[key] <= limit
            else:
                e["aim"], e["reached"] = "-", None
            r[fig] = e
        out[s["tool"]] = r
    return out


def ratio_table(title, rat):
    out = []
    for tool, r in rat.items():
        for fig, v in r.items():
            met = {True: "yes", False: "NO", None: "-"}[v["reached"]]
            cpu = f"{v['cpu_ratio']:.2f}x" if "cpu_ratio" in v else "-"
            out.append([tool, fig, f"{v['ratio']:.2f}x", cpu, v["peer"], v["aim"], met])
    return f"{title}\n" + measure.table(["", "figure", "ratio", "by CPU s", "best peer", "aim", "reached"], out)


def run_workload(a, tools, man, days_dir, size, ndays=None, restores=True):
    results = []
    for tool in tools:
        say(f"{tool.name} ({gib(size)}):")
        r, repo = bench_tool(tool, man, days_dir, a.work, size, ndays, restores)
        results.append(r)
        if not a.keep:
            shutil.rmtree(repo, ignore_errors=True)
            for cache in tool.caches(a.work):
                shutil.rmtree(cache, ignore_errors=True)
    return results


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tools", default=DEFAULT_TOOLS,
                   help=f"comma-separated, of {', '.join(t.name for t in ALL)} (default {DEFAULT_TOOLS})")
    p.add_argument("--size", type=parse_size, default=2 << 30, help="image size (default 2G)")
    p.add_argument("--days", type=int, default=8)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--big-size", type=parse_size, default=64 << 30, help="the sparse disk's size (default 64G)")
    p.add_argument("--big-days", type=int, default=2,
                   help="days of the sparse disk (default 2: day 0 and one later day; restic reads all of it each day)")
    p.add_argument("--big-tools", default="foundation-hash,restic")
    p.add_argument("--skip-big", action="store_true", help="no sparse-disk row")
    p.add_argument("--nights", type=int, default=5, help="nights of the virtnbdbackup comparison (default 5)")
    p.add_argument("--vm-size", type=parse_size, default=2 << 30, help="the domains' disk (default 2G)")
    p.add_argument("--vm-data", type=parse_size, default=1536 << 20, help="data on it (default 1536M)")
    p.add_argument("--night-change", type=parse_size, default=64 << 20, help="written each night (default 64M)")
    p.add_argument("--skip-virtnbd", action="store_true", help="no virtnbdbackup comparison")
    p.add_argument("--skip-workload", action="store_true",
                   help="not the standard image workload (the sparse disk's row still runs unless --skip-big)")
    p.add_argument("--reuse", action="store_true",
                   help="use the peers already installed or built (kopia in the cache); skip scripts/peers.sh install")
    p.add_argument("--work", default=os.path.join("/var/tmp", "foundation-compare"),
                   help="scratch directory (about days x 0.7 x size, plus the repositories)")
    p.add_argument("--keep", action="store_true", help="keep the repositories")
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    p.add_argument("--max-log-size", default=None, help="Foundation's `init --max-log-size` (default: its own)")
    p.add_argument("--show", metavar="JSON", help="print the tables of a saved result again, and run nothing")
    a = p.parse_args(argv)
    if a.show:
        with open(a.show) as f:
            print(render(json.load(f)))
        return
    Foundation.max_log = a.max_log_size
    t_start = time.monotonic()
    cold = measure.drop_caches()
    if not cold:
        say("warning: cannot drop the page cache (not root): the figures are warm-cache ones")
    if not a.reuse and os.geteuid() == 0:
        subprocess.run([os.path.join(ROOT, "scripts", "peers.sh"), "install"], check=False)
    want = a.tools.split(",")
    unknown = set(want) - {t.name for t in ALL}
    if unknown:
        sys.exit(f"compare_tools: unknown tool {', '.join(sorted(unknown))}")
    tools, skipped = [], []
    for tool in ALL:
        if tool.name in want:
            (tools if tool.available() else skipped).append(tool)
    for t in skipped:
        say(f"{t.name}: not installed (scripts/peers.sh install), skipped")
    report = {"machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0], "load_start": os.getloadavg()},
              "cold_cache": cold, "skipped": [t.name for t in skipped], "args": {k: v for k, v in vars(a).items()}}
    os.makedirs(a.work, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = os.path.join(a.out, f"compare-{a.size >> 20}M-{stamp}.json")

    def save():
        report["machine"]["load_end"] = os.getloadavg()
        report["run_seconds"] = round(time.monotonic() - t_start)
        os.makedirs(a.out, exist_ok=True)
        with open(path, "w") as f:
            json.dump(report, f, indent=1)

    big = [t for t in tools if t.name in a.big_tools.split(",")] if not a.skip_big else []
    if (tools and not a.skip_workload) or big:
        days_dir = os.path.join(a.work, f"days-{a.size}-{a.days}-{a.seed}")
        say(f"generating the workload in {days_dir} ...")
        fresh = not os.path.exists(os.path.join(days_dir, "manifest.json"))
        man = generate(days_dir, a.size, a.days, a.seed)
        if fresh:  # ~10 GB just written: the first tool's day 0 would read beside their writeback
            peer_domains.settle()
    if tools and not a.skip_workload:
        report["workload"] = {"size": a.size, "days": a.days, "seed": a.seed,
                              "changed_bytes": [d.get("changed_bytes") for d in man["day"]],
                              "runs": run_workload(a, tools, man, days_dir, a.size)}
        save()
        print(render(report, ["workload"]), flush=True)
    if big:
        report["big"] = {"size": a.big_size, "days": a.big_days,
                         "runs": run_workload(a, big, man, days_dir, a.big_size, a.big_days, restores=False)}
        save()
        print(render(report, ["big"]), flush=True)
    if not a.skip_virtnbd:
        report["virtnbd"] = peer_domains.compare(a.work, a.nights, a.vm_size, a.vm_data, a.night_change, say)
        save()
        print(render(report, ["virtnbd"]), flush=True)
    save()
    print(f"run time {report['run_seconds']} s; load average {report['machine']['load_start'][0]:.1f} at the "
          f"start, {report['machine']['load_end'][0]:.1f} at the end")
    print(f"results: {path}")


def render(report, parts=("workload", "big", "virtnbd")):
    """The tables of a run's parts, summaries and ratios worked out again from its measurements."""
    out = []
    w = report.get("workload")
    if w and "workload" in parts:
        rows = [summarize(r) for r in w["runs"]]
        out.append(f"{gib(w['size'])} image, {w['days']} days (later days: median; restore: median of the last day "
                   f"and day 0; store after the last day)\n" + workload_table(rows))
        rat = ratios(rows, w["size"] == 2 << 30 and w["days"] == 8)
        if rat:
            out.append(ratio_table("Foundation against the best peer of this run (above 1: Foundation better)", rat))
        out += [f"{s['tool']}: a day with no change {s['idle_s']:.2f} s ({s['idle_cpu_s']:.2f} CPU s)"
                + ("" if s.get("idle_start_s") is None else
                   f"; past the interpreter's start (alone, cold: {s['idle_start_s']:.2f} s) "
                   f"{s['idle_s'] - s['idle_start_s']:.2f} s; aim: well under 0.2 s")
                for s in rows if "idle_s" in s]
    b = report.get("big")
    if b and "big" in parts:
        rows = [summarize(r) for r in b["runs"]]
        out.append(f"{gib(b['size'])} sparse disk, the same data and daily change, {b['days']} days\n"
                   + workload_table(rows))
        rat = ratios(rows, False)
        if rat:
            out.append(ratio_table("Foundation against the best peer on the sparse disk", rat))
        small = {s["tool"]: s for s in map(summarize, w["runs"])} if w else {}
        out += [f"{s['tool']}: a later day on {gib(b['size'])} takes {s['later_s'] / small[s['tool']]['later_s']:.2f}x "
                f"its time on {gib(w['size'])} ({s['later_cpu_s'] / small[s['tool']]['later_cpu_s']:.2f}x the CPU "
                f"seconds; aim: the same)" for s in rows if s["tool"] in small]
        out += [f"{s['tool']}: a day with no change on {gib(b['size'])} {s['idle_s']:.2f} s ({s['idle_cpu_s']:.2f} "
                f"CPU s)" for s in rows if "idle_s" in s]
    if report.get("virtnbd") and "virtnbd" in parts:
        out.append(peer_domains.table(report["virtnbd"]))
    return "\n\n".join(out) + "\n"


if __name__ == "__main__":
    main()
