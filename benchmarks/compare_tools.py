"""Foundation against the backup tools a user would pick instead, on the same disk days.

Every tool backs up the same file, `WORK/current/disk.raw`, once per day of
benchmarks/workload.py (copied there, untimed, before each run, so every
tool finds it in the page cache alike), into its own fresh repository,
with its default settings and encryption on (restic always encrypts; borg
`repokey`; Foundation's default key file). Reported per tool: day-0 MB/s,
later-day MB/s (image bytes / wall time), repository size on disk after
each day, restore MB/s of the last day (checked against its SHA-256), and
peak memory (maximum RSS, measured by GNU time). Foundation runs four
ways: by-hash and by-value, each reading only `--changed` ranges on later
days, and each reading the whole image every day. restic, borg and kopia
run only when they are on PATH; the others are skipped with a note.

    python benchmarks/compare_tools.py [--size 2G] [--days 8] [--work DIR] [--tools a,b]

Writes benchmarks/results/compare-SIZE-TIMESTAMP.json and prints a table.
Foundation's store size counts its derived index and Bloom filter, which
are sized by `--max-log-size` in advance; "log GB" is the arenas alone.
Reference figures (2 GiB, 8 days, from the issue): restic 178 MB/s day 0,
~320 later, 2.64 GB; borg 282/~385, 4.09 GB; kopia 297/~365, 6.79 GB;
restore 260-690 MB/s; unique data 1.66 GB (1.14 GB zstd).
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import measure  # noqa: E402
from workload import generate, parse_size, sha256_file, sparse_copy  # noqa: E402

PASSWORD = "benchmark-password"


def run(cmd, cwd=None, env=None):
    """Run a command -> (seconds, peak RSS in bytes); raise on failure."""
    return measure.run(cmd, cwd, env)[:2]


def disk_usage(path):
    total = 0
    for d, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(d, f)).st_blocks * 512
            except FileNotFoundError:
                pass
    return total


class Tool:
    name = "?"
    exe = None

    def available(self):
        return self.exe is None or shutil.which(self.exe) is not None

    def init(self, repo, work):
        pass

    def backup(self, repo, work, day, image, changed):
        raise NotImplementedError

    def restore(self, repo, work, day, out_dir):
        """-> (cmd, cwd, env, path of the restored image)."""
        raise NotImplementedError

    def env(self, work):
        return {}


class Foundation(Tool):
    def __init__(self, mode, changed):
        self.mode, self.use_changed = mode, changed
        self.name = f"foundation-{mode}" + ("" if changed else "-full")

    def _cmd(self, repo, work, *args):
        return [sys.executable, "-m", "foundation", "--store", repo, "--key-file",
                os.path.join(work, f"{self.name}.key"), *args]

    def env(self, work):
        return {"PYTHONPATH": ROOT}

    max_log = "16G"

    def init(self, repo, work):
        key = os.path.join(work, f"{self.name}.key")
        if os.path.exists(key):
            os.unlink(key)
        run(self._cmd(repo, work, "init", repo, "--mode", self.mode, "--max-log-size", self.max_log),
            env=self.env(work))

    def backup(self, repo, work, day, image, changed):
        args = ["import-image", "bench", image, "--at", f"2024-01-{day + 1:02d}T03:00:00Z"]
        if changed and self.use_changed:
            args += ["--changed", changed]
        return self._cmd(repo, work, *args), None

    def restore(self, repo, work, day, out_dir):
        out = os.path.join(out_dir, "disk.raw")
        return (self._cmd(repo, work, "restore", f"bench@2024-01-{day + 1:02d}T03:00:00Z", out), None, out)


class Restic(Tool):
    name = exe = "restic"

    def env(self, work):
        return {"RESTIC_PASSWORD": PASSWORD, "RESTIC_CACHE_DIR": os.path.join(work, "restic-cache")}

    def init(self, repo, work):
        run(["restic", "-r", repo, "init"], env=self.env(work))

    def backup(self, repo, work, day, image, changed):
        return ["restic", "-r", repo, "backup", "--host", "bench", "-q", image], None

    def restore(self, repo, work, day, out_dir):
        img = os.path.join(work, "current", "disk.raw")
        return (["restic", "-r", repo, "restore", "latest", "--target", out_dir, "-q"], None,
                os.path.join(out_dir, img.lstrip("/")))


class Borg(Tool):
    name = exe = "borg"

    def env(self, work):
        return {"BORG_PASSPHRASE": PASSWORD, "BORG_BASE_DIR": os.path.join(work, "borg-base"),
                "BORG_RELOCATED_REPO_ACCESS_IS_OK": "yes"}

    def init(self, repo, work):
        run(["borg", "init", "--encryption=repokey", repo], env=self.env(work))

    def backup(self, repo, work, day, image, changed):
        return ["borg", "create", f"{repo}::day{day}", "disk.raw"], os.path.dirname(image)

    def restore(self, repo, work, day, out_dir):
        return (["borg", "extract", f"{repo}::day{day}"], out_dir, os.path.join(out_dir, "disk.raw"))


class Kopia(Tool):
    name = exe = "kopia"

    def env(self, work):
        return {"KOPIA_PASSWORD": PASSWORD, "KOPIA_CONFIG_PATH": os.path.join(work, "kopia.config"),
                "KOPIA_CACHE_DIRECTORY": os.path.join(work, "kopia-cache"), "KOPIA_CHECK_FOR_UPDATES": "false"}

    def init(self, repo, work):
        run(["kopia", "repository", "create", "filesystem", "--path", repo], env=self.env(work))

    def backup(self, repo, work, day, image, changed):
        return ["kopia", "snapshot", "create", image], None

    def restore(self, repo, work, day, out_dir):
        img = os.path.join(work, "current", "disk.raw")
        out = os.path.join(out_dir, "disk.raw")
        listing = subprocess.run(["kopia", "snapshot", "list", "--json", img], capture_output=True, text=True,
                                 env=dict(os.environ, **self.env(work)), check=True)
        snap = json.loads(listing.stdout)[-1]
        return (["kopia", "snapshot", "restore", snap["id"], out], None, out)


ALL = [Foundation("hash", True), Foundation("value", True), Foundation("hash", False),
       Foundation("value", False), Restic(), Borg(), Kopia()]


def bench_tool(tool, man, days_dir, work, size):
    repo = os.path.join(work, "repo-" + tool.name)
    shutil.rmtree(repo, ignore_errors=True)
    os.makedirs(repo)
    cur_dir = os.path.join(work, "current")
    os.makedirs(cur_dir, exist_ok=True)
    image = os.path.join(cur_dir, "disk.raw")
    tool.init(repo, work)
    res = {"tool": tool.name, "days": []}
    for d, entry in enumerate(man["day"]):
        if os.path.exists(image):
            os.unlink(image)
        sparse_copy(os.path.join(days_dir, entry["image"]), image)
        changed = os.path.join(days_dir, entry["changed"]) if "changed" in entry else None
        cmd, cwd = tool.backup(repo, work, d, image, changed)
        dt, rss = run(cmd, cwd=cwd, env=tool.env(work))
        res["days"].append({"day": d, "seconds": dt, "mb_s": size / 1e6 / dt, "store_bytes": disk_usage(repo),
                            "peak_rss": rss})
        if os.path.isdir(os.path.join(repo, "arenas")):  # Foundation: the log alone, without derived files
            res["days"][-1]["log_bytes"] = disk_usage(os.path.join(repo, "arenas"))
        print(f"  {tool.name} day {d}: {dt:.2f} s, {size / 1e6 / dt:,.0f} MB/s, "
              f"store {res['days'][-1]['store_bytes'] / 1e6:,.0f} MB, {rss / 1e6:,.0f} MB RSS", file=sys.stderr)
    last = len(man["day"]) - 1
    out_dir = os.path.join(work, "restore-" + tool.name)
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    cmd, cwd, path = tool.restore(repo, work, last, out_dir)
    dt, rss = run(cmd, cwd=cwd or out_dir, env=tool.env(work))
    ok = sha256_file(path) == man["day"][last]["sha256"]
    res["restore"] = {"day": last, "seconds": dt, "mb_s": size / 1e6 / dt, "peak_rss": rss, "correct": ok}
    print(f"  {tool.name} restore: {dt:.2f} s, {size / 1e6 / dt:,.0f} MB/s, correct={ok}", file=sys.stderr)
    shutil.rmtree(out_dir, ignore_errors=True)
    if image and os.path.exists(image):
        os.unlink(image)
    return res, repo


def summarize(r):
    days = r["days"]
    later = [x["mb_s"] for x in days[1:]] or [days[0]["mb_s"]]
    return {
        "tool": r["tool"],
        "day0_mb_s": days[0]["mb_s"],
        "later_mb_s_median": statistics.median(later),
        "later_mb_s_best": max(later),
        "store_gb_by_day": [round(x["store_bytes"] / 1e9, 3) for x in days],
        "log_gb_last": round(days[-1]["log_bytes"] / 1e9, 3) if "log_bytes" in days[-1] else None,
        "restore_mb_s": r["restore"]["mb_s"],
        "restore_correct": r["restore"]["correct"],
        "peak_rss_mb": max([x["peak_rss"] for x in days] + [r["restore"]["peak_rss"]]) / 1e6,
    }


def table(rows):
    head = ["tool", "day0 MB/s", "later MB/s (median)", "store GB after each day", "log GB", "restore MB/s",
            "peak MB"]
    lines = [head]
    for s in rows:
        lines.append([s["tool"], f"{s['day0_mb_s']:,.0f}", f"{s['later_mb_s_median']:,.0f}",
                      " ".join(f"{g:.2f}" for g in s["store_gb_by_day"]),
                      "-" if s["log_gb_last"] is None else f"{s['log_gb_last']:.2f}",
                      f"{s['restore_mb_s']:,.0f}" + ("" if s["restore_correct"] else " WRONG"),
                      f"{s['peak_rss_mb']:,.0f}"])
    w = [max(len(r[i]) for r in lines) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w[i]) for i, c in enumerate(r)) for r in lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=parse_size, default=2 << 30, help="image size (default 2G)")
    p.add_argument("--days", type=int, default=8)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "foundation-bench"),
                   help="scratch directory (needs about days x 0.7 x size, plus the repositories)")
    p.add_argument("--tools", default=",".join(t.name for t in ALL), help="comma-separated subset")
    p.add_argument("--keep", action="store_true", help="keep the repositories")
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    p.add_argument("--max-log-size", default="16G",
                   help="Foundation's `init --max-log-size` (sizes its index and Bloom filter; default 16G)")
    a = p.parse_args(argv)
    Foundation.max_log = a.max_log_size
    want = a.tools.split(",")
    days_dir = os.path.join(a.work, f"days-{a.size}-{a.days}-{a.seed}")
    print(f"generating the workload in {days_dir} ...", file=sys.stderr)
    man = generate(days_dir, a.size, a.days, a.seed)
    results, skipped = [], []
    for tool in ALL:
        if tool.name not in want:
            continue
        if not tool.available():
            skipped.append(tool.name)
            print(f"{tool.name}: not installed, skipped", file=sys.stderr)
            continue
        print(f"{tool.name}:", file=sys.stderr)
        r, repo = bench_tool(tool, man, days_dir, a.work, a.size)
        results.append(r)
        if not a.keep:
            shutil.rmtree(repo, ignore_errors=True)
    rows = [summarize(r) for r in results]
    print(table(rows))
    if skipped:
        print(f"skipped (not on PATH): {', '.join(skipped)}")
    os.makedirs(a.out, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = os.path.join(a.out, f"compare-{a.size >> 20}M-{stamp}.json")
    machine = {"cpus": os.cpu_count(), "python": sys.version.split()[0]}
    with open(path, "w") as f:
        json.dump({"size": a.size, "days": a.days, "seed": a.seed, "machine": machine, "skipped": skipped,
                   "summary": rows, "runs": results,
                   "changed_fraction": [d.get("changed_fraction") for d in man["day"]]}, f, indent=1)
    print(f"results: {path}")


if __name__ == "__main__":
    main()
