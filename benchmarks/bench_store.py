#!/usr/bin/env python3
"""The six cases of the paper's Figure 6, for Venti, compare-by-hash and compare-by-value.

Each case is measured on this machine (MB/s) and priced on the paper's USB
disk model from the disk operations the store counted (13.6 ms per seek,
32.2 MB/s read, 26.5 MB/s write), printed beside the paper's own figures,
and recorded as JSON in benchmarks/results/.

    python benchmarks/bench_store.py [--mb 256] [--block-size 4096] [--encrypt]
"""

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from foundation import native  # noqa: E402
from foundation.store import Store, Tuning  # noqa: E402

# Figure 6 of the paper, kB/s: (expected venti, hash, value), (actual venti, hash, value)
PAPER = {
    "out-of-order read": ((18, 7.4, 37), (15, 4.8, 19)),
    "sequential read": ((18, 29000, 33000), (76, 13000, 16000)),
    "out-of-order duplicate write": ((36, 9.2, 7.4), (79, 6.0, 5.2)),
    "index entry cached": ((39000, 39000, 37), (22000, 22000, 19)),
    "sequential duplicate write": ((36, 39000, 29000), (78, 23000, 16000)),
    "fresh write": ((12, 4000, 8100), (37, 3800, 7100)),
}
SYSTEMS = (("venti", "hash", "venti"), ("by-hash", "hash", "foundation"), ("by-value", "value", "foundation"))
BATCH = 256  # blocks per call in the write cases


def make_data(n, bs, seed):
    """Disk-like blocks: about half compress well, half do not; none are zero."""
    rnd = random.Random(seed)
    words = [b"the ", b"quick ", b"brown ", b"fox ", b"\x00\x01", b"jumps ", b"over ", b"lazy ", b"dog\n"]
    out = bytearray()
    for i in range(n):
        if i % 2:
            out += rnd.randbytes(bs)
        else:
            b = bytearray(i.to_bytes(8, "little"))
            while len(b) < bs:
                b += rnd.choice(words)
            out += b[:bs]
    return bytes(out)


def drop_caches():
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def run_case(store, name, fn, nbytes):
    store.disk.reset()
    t = time.perf_counter()
    fn()
    dt = time.perf_counter() - t
    io = store.disk.totals()
    model = store.disk.model_seconds()
    return {
        "case": name,
        "mb_s": nbytes / dt / 1e6,
        "seconds": dt,
        "seeks": io.seeks,
        "bytes_read": io.bytes_read,
        "bytes_written": io.bytes_written,
        "model_mb_s": (nbytes / model / 1e6) if model else float("inf"),
        "io": store.disk.report(),
    }


def bench_system(label, mode, policy, args, data, fresh_data):
    bs = args.block_size
    n = len(data) // bs
    root = tempfile.mkdtemp(prefix="fdn-bench-", dir=args.dir)
    path = os.path.join(root, "store")
    os.mkdir(path)
    kf = os.path.join(root, "key") if args.encrypt else None
    Store.create(path, mode=mode, block_size=bs, max_log_size=max(4 * len(data), 1 << 30),
                 encrypt=args.encrypt, key_file=kf)
    # An index cache of about one summary: the paper cached 10 of 6,400 arenas.
    tuning = lambda icache=256 << 10: Tuning(policy=policy, zlevel=args.zlevel,  # noqa: E731
                                             threads=args.threads, block_cache_bytes=1 << 20,
                                             index_cache_bytes=icache, write_buffer_bytes=128 << 20)
    order = list(range(n))
    random.Random(7).shuffle(order)
    results = []

    def open_store(writable, **kw):
        return Store.open(path, key_file=kf, writable=writable, tuning=tuning(**kw))

    # Load the store (not timed as a case) and learn every block's ref.
    with open_store(True) as s:
        refs = b"".join(s.write_blocks(data[i:i + BATCH * bs]) for i in range(0, len(data), BATCH * bs))
        s.flush()  # steady state: the on-disk index covers the whole log
    rs = len(refs) // n
    ref = [refs[i * rs:(i + 1) * rs] for i in range(n)]
    sample = order[: max(1, min(n, args.random_blocks))]

    def cold():
        drop_caches()

    # 1. out-of-order read (a sample: per-block random reads are slow by design)
    cold()
    with open_store(False) as s:
        results.append(run_case(s, "out-of-order read", lambda: [s.read(ref[i]) for i in sample], len(sample) * bs))
    # 2. sequential read, one block at a time in log order
    cold()
    with open_store(False) as s:
        results.append(run_case(s, "sequential read", lambda: [s.read(r) for r in ref], n * bs))
    # 3. out-of-order duplicate write
    cold()
    with open_store(True) as s:
        results.append(run_case(s, "out-of-order duplicate write",
                                lambda: [s.write_blocks(data[i * bs:(i + 1) * bs]) for i in sample], len(sample) * bs))
    # 4. the same writes with their index entries cached (a cache big enough, warmed), blocks not cached
    with open_store(True, icache=256 << 20) as s:
        for i in sample:
            s.write_blocks(data[i * bs:(i + 1) * bs])
        s.blocks.clear()
        results.append(run_case(s, "index entry cached",
                                lambda: [s.write_blocks(data[i * bs:(i + 1) * bs]) for i in sample], len(sample) * bs))
    # 5. sequential duplicate write
    cold()
    with open_store(True) as s:
        results.append(run_case(s, "sequential duplicate write",
                                lambda: [s.write_blocks(data[i:i + BATCH * bs]) for i in range(0, len(data), BATCH * bs)],
                                len(data)))
    # 6. fresh write (including the index flushes it causes and the final sync)
    with open_store(True) as s:
        def fresh():
            for i in range(0, len(fresh_data), BATCH * bs):
                s.write_blocks(fresh_data[i:i + BATCH * bs])
            s.flush()
        results.append(run_case(s, "fresh write", fresh, len(fresh_data)))
    shutil.rmtree(root)
    for r in results:
        r["system"] = label
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=256, help="MB of blocks per case (default 256)")
    ap.add_argument("--block-size", type=int, default=4096)
    ap.add_argument("--random-blocks", type=int, default=4096, help="blocks in the out-of-order cases")
    ap.add_argument("--encrypt", action="store_true", help="encrypt the store (default: off, as in the paper's model)")
    ap.add_argument("--zlevel", type=int, default=1)
    ap.add_argument("--threads", type=int, default=min(4, os.cpu_count() or 1))
    ap.add_argument("--dir", default=None, help="where to make the stores (default: $TMPDIR)")
    ap.add_argument("--systems", default="venti,by-hash,by-value")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = ap.parse_args()
    n = args.mb * 1000000 // args.block_size
    data = make_data(n, args.block_size, 1)
    fresh = make_data(n, args.block_size, 2)
    want = set(args.systems.split(","))
    results = []
    for label, mode, policy in SYSTEMS:
        if label in want:
            print(f"running {label} ...", file=sys.stderr)
            results += bench_system(label, mode, policy, args, data, fresh)
    col = {label: i for i, (label, _, _) in enumerate(SYSTEMS)}
    print(f"\nFigure 6 on this machine: {args.mb} MB of {args.block_size}-byte blocks, backend {native.backend}, "
          f"{'encrypted' if args.encrypt else 'not encrypted'}, zstd level {args.zlevel}")
    print(f"{'case':30} {'system':9} {'here MB/s':>10} {'seeks':>7} {'model MB/s':>11} {'paper exp':>10} {'paper act':>10}")
    for r in results:
        exp, act = PAPER[r["case"]]
        i = col[r["system"]]
        print(f"{r['case']:30} {r['system']:9} {r['mb_s']:10.1f} {r['seeks']:7d} {r['model_mb_s']:11.3f} "
              f"{exp[i] / 1000:10.3f} {act[i] / 1000:10.3f}")
    os.makedirs(args.out, exist_ok=True)
    out = os.path.join(args.out, f"figure6-{time.strftime('%Y%m%d-%H%M%S')}.json")
    with open(out, "w") as f:
        json.dump({"args": vars(args), "backend": native.backend, "results": results}, f, indent=1)
    print(f"\nrecorded {out}")


if __name__ == "__main__":
    main()
