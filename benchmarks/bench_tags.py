#!/usr/bin/env python3
"""CPU seconds of the record tag: HMAC-SHA256 against Poly1305 (docs/format.md §5.2).

The same blocks packed (runs of 16, zstd:1, encrypted, one thread) and read
back (unpack_blocks, one thread) with a codec of each kind, in alternated
rounds; everything but the tag is the same work, so the difference is the
tag's cost. The blocks are the non-zero 4 KiB blocks of compare_tools.py's
day0.raw (--image), the first --mib MiB of them. Every round's read is
compared with the blocks. Results: stdout and benchmarks/results/tags-<time>.json.

    python benchmarks/bench_tags.py [--image /var/tmp/foundation-compare/days-2147483648-8-1/day0.raw]
                                    [--mib 384] [--rounds 5]
"""

import argparse
import os
import resource
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import foundation.native as N  # noqa: E402
from measure import save  # noqa: E402

BS, MIB = 4096, 1 << 20
IMAGE = "/var/tmp/foundation-compare/days-2147483648-8-1/day0.raw"


def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def data_blocks(path, size):
    """The first size bytes of non-zero blocks of the image."""
    out = bytearray()
    with open(path, "rb") as f:
        while len(out) < size:
            chunk = f.read(64 * MIB)
            if not chunk:
                break
            flags = N.zero_flags(chunk, BS)
            mv = memoryview(chunk)
            out += b"".join(mv[i * BS:(i + 1) * BS] for i in range(len(flags)) if not flags[i])
    return bytes(out[:size - size % BS])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--image", default=IMAGE)
    p.add_argument("--mib", type=int, default=384)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    blocks = data_blocks(args.image, args.mib * MIB)
    n = len(blocks) // BS
    keys = N.scores(blocks, BS, 1)
    iv, enc, mac, tag_key = (os.urandom(k) for k in (16, 32, 32, 32))
    got = {"hmac": [], "poly1305": []}
    for r in range(args.rounds):
        for kind in got:
            c = N.Codec(enc, mac, 1, tag_key if kind == "poly1305" else None)
            t = cpu()
            recs, offs = N.pack(c, 1, iv, 72, 1, blocks, BS, keys, threads=1, run=16)
            packed = cpu() - t
            t = cpu()
            out, _, bad = N.unpack_blocks(c, 1, iv, recs, 72, offs, BS, threads=1)
            read = cpu() - t
            if bad or bytes(out) != blocks:
                sys.exit(f"round {r} {kind}: the blocks did not read back")
            got[kind].append({"pack_cpu_s": round(packed, 4), "unpack_cpu_s": round(read, 4),
                              "stored_bytes": len(recs)})
    summary = {}
    for kind, runs in got.items():
        summary[kind] = {k: {"median": round(statistics.median(x[k] for x in runs), 4),
                             "min": round(min(x[k] for x in runs), 4)} for k in ("pack_cpu_s", "unpack_cpu_s")}
        print(f"{kind:9s} pack {summary[kind]['pack_cpu_s']['median']:.3f} CPU s (min "
              f"{summary[kind]['pack_cpu_s']['min']:.3f}), unpack {summary[kind]['unpack_cpu_s']['median']:.3f}"
              f" CPU s (min {summary[kind]['unpack_cpu_s']['min']:.3f}), {n} records, "
              f"{runs[0]['stored_bytes'] / 1e6:.0f} MB stored")
    per = {k: round((summary["hmac"][k]["median"] - summary["poly1305"][k]["median"]) / n * 1e6, 3)
           for k in ("pack_cpu_s", "unpack_cpu_s")}
    print(f"Poly1305 saves {per['pack_cpu_s']} µs a record packed, {per['unpack_cpu_s']} µs a record read "
          f"(medians, load {os.getloadavg()[0]:.1f})")
    print("results:", save("tags", {"image": args.image, "mib": args.mib, "records": n, "rounds": got,
                                    "summary": summary, "saved_us_per_record": per,
                                    "load1": os.getloadavg()[0]}))


if __name__ == "__main__":
    main()
