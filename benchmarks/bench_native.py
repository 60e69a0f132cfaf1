#!/usr/bin/env python3
"""MiB/s of the hot paths of foundation.native, native (1 and 2 threads) and reference.

The data are 4 KiB blocks, half text-like (compressible), half random; every
rate is raw block bytes per second, best of --reps runs. The reference runs
on the first --ref-mib MiB only (it is the specification, not a fast path).
Results go to stdout and to benchmarks/results/native-<timestamp>.json.

    python benchmarks/bench_native.py [--mib 32] [--ref-mib 4] [--reps 3]

unpack in a loop and unpack_many are timed in turn, so their ratio holds
on a busy machine; threads=2 gains only when the second core is idle.
"""

import argparse
import datetime as dt
import json
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import foundation.native as N  # noqa: E402

BS, MIB = 4096, 1 << 20
WORDS = b"the of and backup arena block index bloom summary score venti foundation disk".split()
ARENA_CALL = 16 * MIB // BS  # the store packs at most an arena (16 MiB) per call


def blocks(size, seed=1):
    """size bytes of 4 KiB blocks: text-like and random in turn."""
    rng = random.Random(seed)

    def text(n):
        out = bytearray()
        while len(out) < n:
            out += rng.choice(WORDS) + b" " + str(rng.randrange(10**6)).encode() + b"\n"
        return bytes(out[:n])

    return b"".join(text(BS) if i % 2 == 0 else rng.randbytes(BS) for i in range(size // BS))


def rate(f, size, reps):
    """MiB/s of f over size bytes, best of reps."""
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - t)
    return size / MIB / best


def rates(fs, size, reps):
    """{name: MiB/s} of the functions fs over size bytes each, run in turn, best of reps.

    Taking turns shares out whatever else the machine is doing, so the
    ratios between them hold even when the absolute rates do not.
    """
    best = dict.fromkeys(fs, float("inf"))
    for _ in range(reps):
        for name, f in fs.items():
            t = time.perf_counter()
            f()
            best[name] = min(best[name], time.perf_counter() - t)
    return {name: size / MIB / t for name, t in best.items()}


def run(impl, buf, threads, reps, keys, iv, enc, mac):
    """{row: MiB/s} for one backend at one thread count."""
    n = len(buf) // BS
    keys = keys[:32 * n]
    r = {}
    r["scores sha256"] = rate(lambda: impl.scores(buf, BS, 1, threads=threads), len(buf), reps)
    r["scores hmac"] = rate(lambda: impl.scores(buf, BS, 1, key=mac, threads=threads), len(buf), reps)
    r["weak_hashes"] = rate(lambda: impl.weak_hashes(buf, BS, 1, 7), len(buf), reps)
    r["zero_flags"] = rate(lambda: impl.zero_flags(buf, BS), len(buf), reps)

    def batched(c):
        for i in range(0, n, ARENA_CALL):
            impl.pack(c, 1, iv, 0, 1, buf[i * BS:(i + ARENA_CALL) * BS], BS,
                      keys[i * 32:(i + ARENA_CALL) * 32], threads=threads)

    codecs = {"raw": impl.Codec(None, mac, 0), "zstd3": impl.Codec(None, mac, 3),
              "zstd3+aes": impl.Codec(enc, mac, 3)}
    for name, c in codecs.items():
        r[f"pack {name}, 16 MiB calls"] = rate(lambda: batched(c), len(buf), reps)
    packed = {}
    for name in ("raw", "zstd3+aes"):
        c = codecs[name]
        recs, offs = impl.pack(c, 1, iv, 0, 1, buf, BS, keys, threads=2)
        packed[name] = len(recs)
        mv = memoryview(recs)

        def loop():
            for o in offs:
                impl.unpack(c, 1, iv, o, mv[o:o + 64 + BS])

        def many(per):
            def f():
                for i in range(0, n, per):
                    impl.unpack_many(c, 1, iv, recs, 0, offs[i:i + per], threads=threads)
            return f

        fs = {f"unpack {name}, per record": loop}
        for per in (256, ARENA_CALL):
            fs[f"unpack_many {name}, {per} per call"] = many(per)
        r.update(rates(fs, len(buf), reps))
        r[f"scan {name}"] = rate(lambda: impl.scan(c, 1, iv, recs, 0), len(buf), reps)
    return r, packed


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mib", type=int, default=32, help="MiB of blocks for the native backend")
    p.add_argument("--ref-mib", type=int, default=4, help="MiB of blocks for the reference")
    p.add_argument("--reps", type=int, default=3, help="runs per measurement; the best counts")
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    a = p.parse_args()
    if N.native_impl is None:
        sys.exit("foundation._native is not built: python foundation/native/build.py")
    t0 = time.perf_counter()
    buf = blocks(a.mib * MIB)
    n = len(buf) // BS
    keys, iv, enc, mac = os.urandom(32 * n), os.urandom(16), os.urandom(32), os.urandom(32)
    cols, packed = {}, {}
    for name, impl, threads, size, reps in (
            ("native t=1", N.native_impl, 1, len(buf), a.reps),
            ("native t=2", N.native_impl, 2, len(buf), a.reps),
            ("reference", N.reference_impl, 1, min(a.ref_mib * MIB, len(buf)), 1)):
        cols[name], sizes = run(impl, buf[:size], threads, reps, keys, iv, enc, mac)
        packed.setdefault("ratio", {k: v / size for k, v in sizes.items()})
    elapsed = time.perf_counter() - t0

    load = os.getloadavg()[0]
    print(f"{a.mib} MiB ({n} blocks of {BS} bytes, half text, half random; reference on "
          f"{min(a.ref_mib, a.mib)} MiB); packed zstd3+aes {packed['ratio']['zstd3+aes']:.1%} of raw; "
          f"{os.cpu_count()} cpus, load {load:.1f}")
    print(f"{'MiB/s':34s}" + "".join(f"{c:>12s}" for c in cols))
    for row in cols["native t=1"]:
        print(f"{row:34s}" + "".join(f"{cols[c][row]:12.0f}" for c in cols))
    # each column timed unpack in a loop in turn with its unpack_many calls: compare those
    speedup = {}
    for name in ("raw", "zstd3+aes"):
        line = []
        for c in ("native t=1", "native t=2"):
            loop = cols[c][f"unpack {name}, per record"]
            for per in (256, ARENA_CALL):
                x = cols[c][f"unpack_many {name}, {per} per call"] / loop
                speedup[f"{c}, {name}, {per} per call"] = x
                line.append(f"{c} {per}/call {x:.2f}x")
            line[-2] = f"{line[-2]} (loop {loop * MIB / BS / 1e3:.0f}k rec/s)"
        print(f"unpack_many {name} vs unpack per record: " + ", ".join(line))
    print(f"({elapsed:.0f} s)")

    os.makedirs(a.out, exist_ok=True)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = os.path.join(a.out, f"native-{stamp}.json")
    with open(path, "w") as f:
        json.dump({"benchmark": "bench_native", "time": dt.datetime.now().isoformat(timespec="seconds"),
                   "mib": a.mib, "reference_mib": min(a.ref_mib, a.mib), "block_size": BS,
                   "reps": a.reps, "cpus": os.cpu_count(), "load": load,
                   "packed_ratio": packed["ratio"],
                   "units": "MiB/s of raw block bytes", "results": cols,
                   "unpack_many_speedup_vs_unpack_loop": speedup, "seconds": elapsed},
                  f, indent=2)
    print(path)


if __name__ == "__main__":
    main()
