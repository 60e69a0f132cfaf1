"""A deterministic day-by-day disk workload: what a VM's disk does to a backup tool.

Day 0 is a raw image about 64 % full of "files" (extents of 4 KiB to
4 MiB, block-aligned, as a file system allocates them) of three kinds of
content: incompressible (media, archives: random bytes), text-like (a
Zipf-distributed vocabulary, about 3x with zstd) and binary-like (records
of counters, pointers and small integers, about 2x). Each later day
changes about 3 % of the 4 KiB blocks in clustered extents: overwrites in
place, appends (new extents after existing ones), copies of extents to new
offsets, and frees (extents zeroed, as a discard leaves them). The changed
byte ranges of each day are what a hypervisor would report, and become
`--changed` files. Everything derives from one seed, so every run and
every tool sees the same bytes.

    python benchmarks/workload.py DIR [--size 2G] [--days 8] [--seed 1]

writes DIR/day0.raw ... (sparse), DIR/day1.changed.json ... and
DIR/manifest.json (sizes, SHA-256 of each day, blocks changed). As a
module: Workload(size, seed).days(path, n) applies the days to one file in
place and yields (day, changed ranges).
"""

import argparse
import hashlib
import json
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from foundation.config import parse_size  # noqa: E402  (the one size grammar)

BS = 4096
POOL = 16 << 20


def _text_pool(rng, n):
    letters = "etaoinshrdlcumwfgypbvkjxqz"
    vocab = []
    for i in range(6000):
        k = 1 + min(12, int(rng.expovariate(0.35)))
        vocab.append("".join(rng.choices(letters, k=k)))
    vocab += ["\n", "\n", ". ", ", ", "the ", "0", "1", "2024", "=", "{", "}", "(", ")", "/usr/lib/", "<div>"]
    weights = [1.0 / (i + 1) for i in range(len(vocab))]
    out, size = [], 0
    while size < n:
        words = rng.choices(vocab, weights=weights, k=20000)
        s = " ".join(words).encode()
        out.append(s)
        size += len(s)
    return b"".join(out)[:n]


def _binary_pool(rng, n):
    recs = []
    base = 0x00007F3A00000000
    for i in range(n // 64 + 1):
        recs.append(
            (i * 16).to_bytes(8, "little")
            + (base + rng.randrange(1 << 24) * 8).to_bytes(8, "little")
            + rng.randbytes(12)
            + bytes([rng.randrange(4)]) * 4
            + rng.randrange(1000).to_bytes(4, "little")
            + bytes(12)
            + rng.randrange(1 << 16).to_bytes(8, "little")
            + b"\xff\xff\xff\xff\x00\x00\x00\x00"
        )
    return b"".join(recs)[:n]


class Workload:
    """The image's content and its daily changes, all derived from `seed`."""

    def __init__(self, size, seed=1, change=0.03, fill=0.64):
        if size % BS:
            raise ValueError("the image size must be a multiple of 4096")
        self.size, self.seed, self.change, self.fill = size, seed, change, fill
        self.nblocks = size // BS
        rng = random.Random(f"pools-{seed}")
        self.pools = {"text": _text_pool(rng, POOL), "binary": _binary_pool(rng, POOL)}

    # ---- content ------------------------------------------------------------------
    def _content(self, rng, n, kind=None):
        kind = kind or rng.choices(["random", "text", "binary"], weights=[40, 30, 30])[0]
        if kind == "random":
            return rng.randbytes(n)
        pool = self.pools[kind]
        parts, got = [], 0
        while got < n:
            m = min(n - got, POOL // 4)
            o = rng.randrange(0, POOL - m)
            parts.append(pool[o:o + m])
            got += m
        return b"".join(parts)

    def _extent_blocks(self, rng, lo=1, hi=1024):
        """Log-uniform extent length in blocks."""
        import math

        return max(lo, min(hi, int(math.exp(rng.uniform(math.log(lo), math.log(hi + 1))))))

    # ---- day 0 -----------------------------------------------------------------------
    def create(self, path):
        """Write day 0 to `path` (sparse); -> bitmap of allocated blocks."""
        rng = random.Random(f"day0-{self.seed}")
        alloc = bytearray(self.nblocks)
        with open(path, "wb") as f:
            f.truncate(self.size)
        fd = os.open(path, os.O_WRONLY)
        try:
            b = 0
            while b < self.nblocks:
                n = min(self._extent_blocks(rng), self.nblocks - b)
                if rng.random() < self.fill:
                    data = self._content(rng, n * BS)
                    tail = rng.randrange(0, BS) if rng.random() < 0.5 else 0
                    if tail:  # a file's last block is partly zero
                        data = data[:n * BS - tail] + bytes(tail)
                    os.pwrite(fd, data, b * BS)
                    alloc[b:b + n] = b"\1" * n
                b += n
        finally:
            os.close(fd)
        self.alloc = alloc
        return alloc

    # ---- later days -------------------------------------------------------------------
    def _free_run(self, rng, start):
        """First free block at or after start (wrapping), or None."""
        i = self.alloc.find(0, start)
        if i < 0:
            i = self.alloc.find(0)
        return None if i < 0 else i

    def _used_block(self, rng):
        for _ in range(64):
            b = rng.randrange(self.nblocks)
            if self.alloc[b]:
                return b
        return rng.randrange(self.nblocks)

    def step(self, path, day):
        """Apply day `day` (>= 1) to the image in place; -> changed [offset, length] ranges."""
        rng = random.Random(f"day{day}-{self.seed}")
        budget = int(self.nblocks * self.change)
        changed = []
        fd = os.open(path, os.O_RDWR)
        try:
            while budget > 0:
                op = rng.choices(["overwrite", "append", "copy", "free"], weights=[45, 20, 15, 20])[0]
                n = min(self._extent_blocks(rng, 1, 512), budget)
                if op == "overwrite":
                    b = min(self._used_block(rng), self.nblocks - n)
                    data = bytearray(self._content(rng, n * BS))
                    if rng.random() < 0.3:  # a partial write: only part of the first block changes
                        keep = rng.randrange(1, BS)
                        data[:keep] = os.pread(fd, keep, b * BS)
                    os.pwrite(fd, data, b * BS)
                elif op in ("append", "copy"):
                    f = self._free_run(rng, self._used_block(rng))
                    if f is None:
                        continue
                    end = f
                    while end < self.nblocks and end - f < n and not self.alloc[end]:
                        end += 1
                    b, n = f, end - f
                    if op == "append":
                        data = self._content(rng, n * BS)
                    else:
                        src = min(self._used_block(rng), self.nblocks - n)
                        data = os.pread(fd, n * BS, src * BS)
                    os.pwrite(fd, data, b * BS)
                else:
                    b = min(self._used_block(rng), self.nblocks - n)
                    os.pwrite(fd, bytes(n * BS), b * BS)
                self.alloc[b:b + n] = (b"\0" if op == "free" else b"\1") * n
                changed.append([b * BS, n * BS])
                budget -= n
        finally:
            os.close(fd)
        return _merge(changed)

    def days(self, path, ndays):
        """Create day 0 at `path`, then change it in place: yields (day, changed ranges or None)."""
        self.create(path)
        yield 0, None
        for d in range(1, ndays):
            yield d, self.step(path, d)


def _merge(ranges):
    out = []
    for o, n in sorted(ranges):
        if out and o <= out[-1][0] + out[-1][1]:
            out[-1][1] = max(out[-1][1], o + n - out[-1][0])
        else:
            out.append([o, n])
    return out


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(16 << 20)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


def sparse_copy(src, dst):
    """Copy a file keeping its holes (SEEK_DATA/SEEK_HOLE)."""
    size = os.path.getsize(src)
    with open(src, "rb") as fi, open(dst, "wb") as fo:
        fo.truncate(size)
        ifd, ofd = fi.fileno(), fo.fileno()
        off = 0
        while off < size:
            try:
                data = os.lseek(ifd, off, os.SEEK_DATA)
            except OSError:
                break
            hole = os.lseek(ifd, data, os.SEEK_HOLE)
            pos = data
            while pos < hole:
                n = os.copy_file_range(ifd, ofd, hole - pos, pos, pos)
                if n <= 0:
                    break
                pos += n
            off = hole


def generate(out, size, ndays, seed=1):
    """Write every day's image and changed ranges into `out`; -> manifest dict."""
    os.makedirs(out, exist_ok=True)
    man_path = os.path.join(out, "manifest.json")
    want = {"size": size, "days": ndays, "seed": seed, "block_size": BS, "version": 1}
    if os.path.exists(man_path):
        with open(man_path) as f:
            man = json.load(f)
        if {k: man.get(k) for k in want} == want and all(
                os.path.exists(os.path.join(out, f"day{d}.raw")) for d in range(ndays)):
            return man
    wl = Workload(size, seed)
    cur = os.path.join(out, "current.raw")
    man = dict(want, day=[])
    t0 = time.time()
    for d, changed in wl.days(cur, ndays):
        day_path = os.path.join(out, f"day{d}.raw")
        sparse_copy(cur, day_path)
        entry = {"image": f"day{d}.raw", "sha256": sha256_file(day_path),
                 "allocated_blocks": sum(wl.alloc)}
        if changed is not None:
            cpath = os.path.join(out, f"day{d}.changed.json")
            with open(cpath, "w") as f:
                json.dump(changed, f)
            entry["changed"] = f"day{d}.changed.json"
            entry["changed_bytes"] = sum(n for _, n in changed)
            entry["changed_fraction"] = entry["changed_bytes"] / size
        man["day"].append(entry)
        print(f"day {d}: {time.time() - t0:.1f} s", file=sys.stderr)
    os.unlink(cur)
    with open(man_path, "w") as f:
        json.dump(man, f, indent=1)
    return man


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", help="directory for the day images")
    p.add_argument("--size", type=parse_size, default=2 << 30, help="image size (default 2G)")
    p.add_argument("--days", type=int, default=8)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args(argv)
    man = generate(a.out, a.size, a.days, a.seed)
    print(json.dumps({k: v for k, v in man.items() if k != "day"}))
    for d in man["day"]:
        print(d["image"], d.get("changed_fraction", 1.0), d["sha256"][:16])


if __name__ == "__main__":
    main()

__all__ = ["Workload", "generate", "sha256_file", "sparse_copy", "parse_size"]
