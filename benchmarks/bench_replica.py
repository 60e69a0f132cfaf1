#!/usr/bin/env python3
"""Replication throughput to each server on loopback, and recovery time, against the size of the store.

For each store size (an encrypted compare-by-hash store, 16 MiB arenas,
one image of mixed random, text-like and zero blocks imported as day 1)
and each server (a directory, FTP and FTPS by pyftpdlib, FTPS by vsftpd,
S3 by MinIO, all started here on loopback as the tests start them; S3
also behind benchmarks/delayproxy.py for each --delays, "s3+20ms" being a
link of 20 ms each way):
  - the first `replicate` (everything goes up): MB/s of bytes sent;
  - a second day changing ~3 % of the blocks, then `replicate` again
    (new arenas and the open arena's new part only);
  - `recover` into an empty directory: download, checks, rebuilding the
    summaries, index and Bloom filter, and the final verify.
Results go to stdout and benchmarks/results/replica-<time>.json. `--code
DIR` measures the foundation package of another tree (e.g. the main
branch, for a before/after) with this tree's servers and proxy; a server
that tree cannot use gets its error in the row instead of numbers.

    python benchmarks/bench_replica.py [--sizes 64,256,1024] [--servers file,ftp,ftps,vsftpd,s3]
                                       [--delays 0,20] [--parallel N] [--code DIR] [--label NAME]
"""

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CODE = ROOT
if "--code" in sys.argv:     # before anything imports foundation
    CODE = os.path.abspath(sys.argv[sys.argv.index("--code") + 1])
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
sys.path.insert(0, CODE)

from foundation.cli import main  # noqa: E402
from foundation.replica.recover import recover  # noqa: E402
from foundation.replica.sync import Local, replicate  # noqa: E402
from foundation.store import Store  # noqa: E402

MIB = 1 << 20
BS = 4096


def image(path, mb, seed=1):
    """mb MiB: 45 % random blocks, 35 % text-like, 20 % zero (compresses to about 60 %)."""
    rng = random.Random(seed)
    words = [b"virtual ", b"machine ", b"kernel ", b"config ", b"\n", b"usr/lib/", b"0x7f3a "]
    with open(path, "wb") as f:
        for _ in range(mb * MIB // BS):
            r = rng.random()
            if r < 0.45:
                f.write(rng.randbytes(BS))
            elif r < 0.8:
                b = bytearray()
                while len(b) < BS:
                    b += rng.choice(words)
                f.write(b[:BS])
            else:
                f.write(bytes(BS))


def change(path, share, seed=2):
    rng = random.Random(seed)
    n = os.path.getsize(path) // BS
    with open(path, "r+b") as f:
        for _ in range(int(n * share)):
            f.seek(rng.randrange(n) * BS)
            f.write(rng.randbytes(BS))


def run(argv):
    rc = main(argv)
    if rc:
        raise SystemExit(f"foundation {' '.join(argv)} failed ({rc})")


def start(kind, d):
    import servers
    if kind == "file":
        root = os.path.join(d, "root")
        os.makedirs(root)
        return servers.Server("file", f"file://{root}/", {}, root=root)
    if kind in ("ftp", "ftps"):
        return servers.start_ftpd(d, tls=kind == "ftps")
    if kind == "vsftpd":
        return servers.start_vsftpd(d)
    return servers.start_minio(d)


def delayed(srv, delay_ms, proxies):
    """srv (MinIO) reached through a DelayProxy of delay_ms each way."""
    import servers
    from delayproxy import Spawned
    from urllib.parse import urlsplit
    proxy = Spawned(urlsplit(srv.options["endpoint"]).port, delay_ms / 1000)
    proxies.append(proxy)
    out = servers.Server("s3", srv.url, dict(srv.options, endpoint=f"http://127.0.0.1:{proxy.port}"),
                         client=srv.client)
    out.measure = srv.procs     # MinIO's CPU (the proxy stands for the link: not counted)
    return out


def main_(a):
    tmp = tempfile.mkdtemp(prefix="bench-replica-", dir=a.tmp)
    srvs, proxies, started = {}, [], []
    rows = []
    try:
        for kind in a.servers:
            try:
                srv = start(kind, os.path.join(tmp, f"server-{kind}"))
            except Exception as e:  # noqa: BLE001 - a missing server program skips its column
                print(f"{kind}: not measured ({e})", flush=True)
                continue
            started.append(srv)    # stopped at the end even when only its delayed form is measured
            if kind != "s3":
                srvs[kind] = srv
                continue
            if a.parallel:
                srv.options["parallel"] = a.parallel
            for ms in a.delays:
                srvs[f"s3+{ms}ms" if ms else "s3"] = delayed(srv, ms, proxies) if ms else srv
        for mb in a.sizes:
            d = os.path.join(tmp, f"{mb}M")
            os.makedirs(d)
            store, key, img = os.path.join(d, "store"), os.path.join(d, "key"), os.path.join(d, "disk.raw")
            os.makedirs(store)
            Store.create(store, key_file=key)
            image(img, mb)
            g = ["--store", store, "--key-file", key]
            run(g + ["import-image", "vm", img, "--at", "2024-05-01"])
            log_bytes = sum(os.path.getsize(os.path.join(store, "arenas", x))
                            for x in os.listdir(os.path.join(store, "arenas")))
            change(img, 0.03)
            subs = {kind: srv.sub(f"s{mb}-{kind.replace('+', '-')}") for kind, srv in srvs.items()}
            got = {kind: {"size_mb": mb, "server": kind, "log_bytes": log_bytes} for kind in subs}
            for kind, sub in list(subs.items()):    # day 1 everywhere, then day 2 everywhere
                try:
                    with Local(store, key) as loc, sub.backend() as b, Cpu(srvs[kind]) as cpu:
                        r = replicate(loc, b)
                except Exception as e:  # noqa: BLE001 - e.g. the code measured cannot use this server
                    print(f"{mb:6d} MiB image  {kind:9s}  FAILED: {e}", flush=True)
                    rows.append(dict(got[kind], error=str(e)))
                    del subs[kind]
                    continue
                got[kind].update(first_s=r.seconds, first_sent=r.bytes_sent, first_mb_s=r.bytes_sent / r.seconds / 1e6,
                                 **cpu.row("first"))
            run(g + ["import-image", "vm", img, "--at", "2024-05-02"])
            for kind, sub in subs.items():
                with Local(store, key) as loc, sub.backend() as b:
                    r = replicate(loc, b)
                got[kind].update(next_s=r.seconds, next_sent=r.bytes_sent)
            for kind, sub in subs.items():
                target = os.path.join(d, f"recovered-{kind}")
                with sub.backend() as b, Cpu(srvs[kind]) as cpu:
                    rec = recover(b, target, key)
                assert not rec.damage and rec.snapshots == 2, rec
                shutil.rmtree(target)
                row = got[kind]
                row.update(recover_s=rec.seconds, recover_mb_s=rec.downloaded / rec.seconds / 1e6,
                           recovered_bytes=rec.downloaded, **cpu.row("recover"))
                rows.append(row)
                print(f"{mb:6d} MiB image ({log_bytes / 1e6:7.1f} MB of arenas)  {kind:9s}  "
                      f"replicate {row['first_sent'] / 1e6:7.1f} MB in {row['first_s']:6.2f} s = "
                      f"{row['first_mb_s']:6.1f} MB/s (CPU {row['first_cpu_s']:.2f} s + server "
                      f"{row['first_server_cpu_s']:.2f} s, load {row['first_load']:.1f})  next day "
                      f"{row['next_sent'] / 1e6:6.1f} MB in {row['next_s']:5.2f} s  recover {rec.seconds:6.2f} s = "
                      f"{row['recover_mb_s']:6.1f} MB/s (CPU {row['recover_cpu_s']:.2f} s)", flush=True)
            shutil.rmtree(d)
    finally:
        for p in proxies:
            p.stop()
        for s in started:
            s.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    label = f"-{a.label}" if a.label else ""
    out = os.path.join(ROOT, "benchmarks", "results", time.strftime(f"replica{label}-%Y%m%d-%H%M%S.json"))
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump({"benchmark": "bench_replica", "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
                   "cpus": os.cpu_count(), "code": _describe(CODE),
                   "args": {"sizes": a.sizes, "servers": a.servers, "delays_ms": a.delays,
                            "parallel": a.parallel},
                   "units": {"*_s": "seconds", "*_mb_s": "MB/s (10^6 bytes)", "*_sent": "bytes",
                             "*_cpu_s": "CPU seconds (user + sys) of the measured process",
                             "*_server_cpu_s": "CPU seconds of the server's processes (MinIO, vsftpd)",
                             "*_load": "1-minute load average as the step ended"},
                   "rows": rows}, f, indent=1)
    print(f"results: {out}")


class Cpu:
    """CPU seconds (user + sys) of this process and of the server's processes over a `with` block,
    and the load average when it ends: on a shared machine wall time alone says little."""

    def __init__(self, srv):
        self.pids = [p.pid for p in getattr(srv, "measure", srv.procs)]

    def _server(self):
        total = 0.0
        for pid in self.pids:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        return total

    def __enter__(self):
        self.cpu, self.srv = time.process_time(), self._server()
        return self

    def __exit__(self, *exc):
        self.cpu, self.srv = time.process_time() - self.cpu, self._server() - self.srv
        self.load = os.getloadavg()[0]

    def row(self, what):
        return {f"{what}_cpu_s": self.cpu, f"{what}_server_cpu_s": self.srv, f"{what}_load": self.load}


def _describe(tree):
    """The tree measured: its path and git commit."""
    import subprocess
    head = subprocess.run(["git", "-C", tree, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return {"tree": tree, "commit": head.stdout.strip()}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=[64, 256, 1024],
                    help="store sizes: MiB of image imported (default 64,256,1024)")
    ap.add_argument("--servers", type=lambda s: s.split(","), default=["file", "ftp", "ftps", "vsftpd", "s3"])
    ap.add_argument("--delays", type=lambda s: [int(x) for x in s.split(",")], default=[0, 20],
                    help="S3 through a proxy delaying this many ms each way (0: direct; default 0,20)")
    ap.add_argument("--parallel", type=int, help="S3: the replica's `parallel` setting (default: its default)")
    ap.add_argument("--code", help="the tree whose foundation package is measured (default: this one)")
    ap.add_argument("--label", help="added to the result file's name")
    ap.add_argument("--tmp", help="directory for stores and servers (default: the system's temp directory)")
    main_(ap.parse_args())
