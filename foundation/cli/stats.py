"""`foundation stats`: sizes, counts, dedup and compression ratios."""

import json

from foundation.cli.common import open_store

NAME = "stats"
HELP = "show what the store holds: sizes, counts, dedup and compression ratios"


def add_arguments(p):
    p.add_argument("--json", action="store_true", help="print JSON")


def _mb(n):
    return f"{n / 1e6:,.1f} MB"


def run(args):
    with open_store(args) as s:
        st = s.stats()
    if args.json:
        print(json.dumps(st, indent=1))
        return 0
    print(f"store           {st['store']} ({st['mode']} mode, {'encrypted' if st['encrypted'] else 'not encrypted'})")
    print(f"blocks          {st['block_size']} bytes; arenas of {_mb(st['arena_size'])}: {st['arenas']} ({st['sealed_arenas']} sealed)")
    print(f"records         {st['records']:,}")
    print(f"log             {_mb(st['log_bytes'])} holding {_mb(st['raw_bytes'])} of unique blocks")
    print(f"index           {_mb(st['index_bytes'])} on disk, {st['index_entries']:,} entries, {100 * st['index_load']:.1f}% full")
    print(f"summaries       {_mb(st['summary_bytes'])}; Bloom filter {_mb(st['bloom_bytes'])}")
    print(f"written         {_mb(st['offered_bytes'])}: {st['zero_blocks']:,} zero blocks, {st['dup_blocks']:,} duplicates")
    if st["dedup_ratio"]:
        print(f"dedup ratio     {st['dedup_ratio']:.2f}x (non-zero bytes written / unique bytes stored)")
    if st["compression_ratio"]:
        print(f"compression     {st['compression_ratio']:.2f}x (unique bytes / log bytes)")
    return 0
