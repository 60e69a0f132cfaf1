#!/usr/bin/env python3
"""Ways to compress a store's fresh 4 KiB blocks, measured on the OS-disk days (benchmarks/osdisk.py).

The one decision: every way sees the same blocks in the same order the
store would write them: each day's non-zero blocks whose SHA-256 no earlier
block had, in image order. A sample of whole 1 MiB runs (every `--every`th
run) keeps neighbours together, which grouping and dictionaries need.
Reported per way: stored bytes (each block stored raw when compression
does not shrink it; a 64-byte record header per record not counted, it is
the same for every per-block way) as a ratio to the raw bytes, and
compression CPU seconds per MB of raw input on one core (process time;
training time included), and the CPU to read one block back at random.

    python3 benchmarks/codecs.py [--days N] [--every K] [--ways a,b,...]
"""

import argparse
import hashlib
import json
import os
import sys
import time

import zstandard

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import osdisk  # noqa: E402

BS = 4096
RUN = 256           # blocks in a sample run (1 MiB)
ARENA = 16 << 20    # the default arena size


def fresh_blocks(images, every):
    """Per day, the sampled fresh blocks: [[bytes]] in image order (cached beside the images)."""
    cache = os.path.join(os.path.dirname(images[0]), f"fresh-{len(images)}-{every}.bin")
    if os.path.exists(cache):
        with open(cache, "rb") as f:
            counts = json.loads(f.readline())
            return [[f.read(BS) for _ in range(c)] for c in counts]
    days = _fresh_blocks(images, every)
    with open(cache + ".tmp", "wb") as f:
        f.write(json.dumps([len(d) for d in days]).encode() + b"\n")
        for d in days:
            f.write(b"".join(d))
    os.rename(cache + ".tmp", cache)
    return days


def _fresh_blocks(images, every):
    seen, days = set(), []
    for img in images:
        out, zero = [], bytes(BS)
        with open(img, "rb") as f:
            run = 0
            while True:
                chunk = f.read(BS * RUN)
                if not chunk:
                    break
                take = run % every == 0
                run += 1
                for i in range(0, len(chunk), BS):
                    b = chunk[i:i + BS]
                    if b == zero:
                        continue
                    h = hashlib.sha256(b).digest()
                    if h in seen:
                        continue
                    seen.add(h)
                    if take:
                        out.append(b)
        days.append(out)
    return days


def per_block(level, dict_data=None):
    c = zstandard.ZstdCompressor(level=level, dict_data=dict_data, write_content_size=True,
                                 write_dict_id=False, write_checksum=False)

    def way(blocks):
        return [min(len(c.compress(b)), BS) for b in blocks]
    return way


def grouped(level, k):
    """Runs of k neighbouring blocks as one frame: the stored size of the run, given to its first block."""
    c = zstandard.ZstdCompressor(level=level, write_content_size=True)

    def way(blocks):
        out = []
        for i in range(0, len(blocks), k):
            run = blocks[i:i + k]
            out.append(min(len(c.compress(b"".join(run))), BS * len(run)))
            out += [0] * (len(run) - 1)
        return out
    return way


def slices(level, k):
    """The run-slice design of benchmarks/README.md, record headers included (64 bytes a record):
    flat blocks alone and raw, as the store does; each run of up to k other neighbours one frame,
    cut into k equal zero-padded slices, one a record; a run that does not shrink goes block by
    block. Compare with "z1h", the store's way with headers."""
    from foundation.native.reference import flat
    c = zstandard.ZstdCompressor(level=level, write_content_size=True)

    def alone(b):
        return 64 + (BS if flat(b) else min(len(c.compress(b)), BS))

    def way(blocks):
        out, run = [], []

        def close():
            if len(run) > 1:
                s = -(-len(c.compress(b"".join(run))) // len(run))
                if s < BS:
                    out.extend([64 + s] * len(run))
                    run.clear()
                    return
            out.extend(alone(b) for b in run)
            run.clear()
        for b in blocks:
            if flat(b):
                close()
                out.append(64 + BS)
                continue
            run.append(b)
            if len(run) == k:
                close()
        close()
        return out
    return way


def arena_dict(level, size):
    """A dictionary trained on each arena's worth of fresh blocks, stored once per arena."""
    def way(blocks):
        out, per = [], ARENA // BS
        for i in range(0, len(blocks), per):
            part = blocks[i:i + per]
            try:
                d = zstandard.train_dictionary(size, part, level=level, threads=1)
            except zstandard.ZstdError:
                out += per_block(level)(part)
                continue
            sizes = per_block(level, d)(part)
            sizes[0] += len(d.as_bytes())
            out += sizes
        return out
    return way


def store_dict(level, size, sample_mb=16):
    """One dictionary trained on the store's first sample_mb of fresh blocks, stored once."""
    state = {}

    def way(blocks):
        if "d" not in state:
            state["d"] = zstandard.train_dictionary(size, blocks[:sample_mb << 8], level=level, threads=1)
            sizes = per_block(level, state["d"])(blocks)
            sizes[0] += len(state["d"].as_bytes())
            return sizes
        return per_block(level, state["d"])(blocks)
    return way


WAYS = {
    "z1h": lambda: slices(1, 1), "s16z1": lambda: slices(1, 16), "s64z1": lambda: slices(1, 64),
    "s64z3": lambda: slices(3, 64),
    "z1": lambda: per_block(1), "z2": lambda: per_block(2), "z3": lambda: per_block(3),
    "z6": lambda: per_block(6), "z9": lambda: per_block(9), "z19": lambda: per_block(19),
    "g4z1": lambda: grouped(1, 4), "g8z1": lambda: grouped(1, 8), "g16z1": lambda: grouped(1, 16),
    "g16z3": lambda: grouped(3, 16), "g64z1": lambda: grouped(1, 64), "g64z3": lambda: grouped(3, 64), "g256z3": lambda: grouped(3, 256),
    "arena-d16k-z1": lambda: arena_dict(1, 16 << 10), "arena-d32k-z3": lambda: arena_dict(3, 32 << 10),
    "store-d64k-z1": lambda: store_dict(1, 64 << 10), "store-d64k-z3": lambda: store_dict(3, 64 << 10),
}


def native_levels(days, levels):
    """The C core's pack (one thread, encrypted, flat blocks stored raw as the store does) of the
    sampled blocks at each level: record bytes (headers included) and MB/s per core."""
    from foundation import native
    codec_for = lambda lvl: native.Codec(bytes(range(32)), bytes(range(32, 64)), lvl)  # noqa: E731
    iv, out = bytes(16), {}
    blocks = [b for d in days for b in d]
    batches = [b"".join(blocks[i:i + 4096]) for i in range(0, len(blocks), 4096)]   # 16 MiB, as the store packs
    for lvl in levels:
        codec, stored = codec_for(lvl), []
        best = None
        for _ in range(3):   # best of three: the machine is shared
            t0, size = time.process_time(), 0
            for b in batches:
                recs, _ = native.pack(codec, 0, iv, 72, 1, b, BS, bytes(32 * (len(b) // BS)))
                size += len(recs)
            cpu = time.process_time() - t0
            best = cpu if best is None else min(best, cpu)
            stored = size
        out[f"native-z{lvl}"] = {"stored": stored, "cpu_s": round(best, 2),
                                 "mb_per_cpu_s": round(len(blocks) * BS / 1e6 / best, 1)}
        print(f"native z{lvl:>3}: ratio {len(blocks) * BS / stored:.3f} (64-byte headers included)  "
              f"{len(blocks) * BS / 1e6 / best:7.1f} MB/s per core", flush=True)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--days", type=int, default=len(osdisk.DAYS) + 1)
    p.add_argument("--every", type=int, default=4)
    p.add_argument("--ways", default=",".join(WAYS))
    p.add_argument("--native", default="", help="zstd levels to time in the C core's pack, e.g. 1,2,3")
    args = p.parse_args(argv)
    d = osdisk.build(args.days)
    days = fresh_blocks([os.path.join(d, f"day{i}.raw") for i in range(args.days)], args.every)
    raw = [len(b) * BS for b in days]
    print(f"sampled fresh bytes per day (1 in {args.every} runs): " + " ".join(f"{r / 1e6:.0f}" for r in raw) + " MB")
    result = {"every": args.every, "raw": raw, "ways": {}, "loadavg": os.getloadavg()}
    if args.native:
        result["native"] = native_levels(days, [int(x) for x in args.native.split(",")])
    for name in filter(None, args.ways.split(",")):
        way = WAYS[name]()
        t0 = time.process_time()
        stored = [sum(way(b)) for b in days]
        cpu = time.process_time() - t0
        mb = sum(raw) / 1e6
        result["ways"][name] = {"stored": stored, "cpu_s": round(cpu, 2), "mb_per_cpu_s": round(mb / cpu, 1)}
        print(f"{name:>14}: ratio {sum(raw) / sum(stored):.3f}  day0 {raw[0] / stored[0]:.3f}  "
              f"later {sum(raw[1:]) / max(1, sum(stored[1:])):.3f}  {mb / cpu:7.1f} MB/s per core", flush=True)
    out = os.path.join(HERE, "results", f"codecs-{time.strftime('%Y%m%d-%H%M%S')}.json")
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"recorded {out}")


if __name__ == "__main__":
    main()
