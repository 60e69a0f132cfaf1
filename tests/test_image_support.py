"""Shared helpers of the image, catalog and CLI tests (no tests here).

Stores are real: `make_store` creates a foundation.store.Store in a temp
directory, unencrypted unless asked, with a small arena (256 KiB) so that
a few MiB of image spans many arenas. `MemStore` is the same interface in
memory; it stands in only where a test needs to count or intercept calls.
"""

import hashlib
import os
import random
import subprocess

BS = 4096


class MemStore:
    """The store interface in memory (by hash or by value); counts calls."""

    def __init__(self, mode="hash", block_size=BS):
        self.mode, self.block_size = mode, block_size
        self.ref_size = 32 if mode == "hash" else 8
        self.null_ref = bytes(self.ref_size)
        self.blocks = {}  # ref -> (btype, data)
        self.log = []  # refs in write order
        self.calls = {"write": 0, "write_blocks": 0, "read": 0, "read_blocks": 0, "read_blocks_in_log_order": 0, "sync": 0}
        self.bytes_written = 0
        self.synced = 0

    def __enter__(self):
        return self

    def __exit__(self, *a):
        pass

    def _put(self, data, btype):
        data = bytes(data)
        if self.mode == "hash":
            ref = hashlib.sha256(bytes([btype]) + data).digest()
            if ref in self.blocks:
                return ref
        else:
            for r, v in self.blocks.items():
                if v == (btype, data):
                    return r
            ref = (len(self.log) + 1).to_bytes(8, "big")
        self.blocks[ref] = (btype, data)
        self.log.append(ref)
        self.bytes_written += len(data)
        return ref

    def write(self, data, btype=1):
        self.calls["write"] += 1
        assert 0 < len(data) <= self.block_size
        return self._put(data, btype)

    def write_blocks(self, buf, btype=1):
        self.calls["write_blocks"] += 1
        bs = self.block_size
        assert len(buf) % bs == 0
        out = []
        for i in range(0, len(buf), bs):
            b = bytes(buf[i:i + bs])
            out.append(self.null_ref if btype == 1 and not any(b) else self._put(b, btype))
        return b"".join(out)

    def read(self, ref):
        self.calls["read"] += 1
        if ref == self.null_ref:
            return bytes(self.block_size)
        return self.blocks[bytes(ref)][1]

    def read_blocks(self, refs, cache=True):
        self.calls["read_blocks"] += 1
        rs = self.ref_size
        out = []
        for i in range(0, len(refs), rs):
            r = bytes(refs[i:i + rs])
            out.append(bytes(self.block_size) if r == self.null_ref else self.blocks[r][1])
        return out

    def _in_log_order(self, refs):
        """One (positions, datas) batch, in write order."""
        rs = self.ref_size
        where = {}
        for i in range(len(refs) // rs):
            r = bytes(refs[i * rs:(i + 1) * rs])
            if r != self.null_ref:
                where.setdefault(r, []).append(i)
        order = {r: k for k, r in enumerate(self.log)}
        placed = [(p, self.blocks[r][1]) for r in sorted(where, key=order.__getitem__) for p in where[r]]
        if placed:
            yield [p for p, _ in placed], [d for _, d in placed]

    def log_order_plan(self, refs):
        """Like Store.log_order_plan: whatever read_blocks_in_log_order takes back as `plan`."""
        return (bytes(refs),)

    def read_blocks_in_log_order(self, refs, alloc=None, plan=None):
        """One batch as one buffer of blocks, in write order, like Store.read_blocks_in_log_order."""
        self.calls["read_blocks_in_log_order"] += 1
        for positions, datas in self._in_log_order(plan[0] if plan else refs):
            yield positions, b"".join(datas)

    def latest(self, btype):
        for r in reversed(self.log[:self.synced]):
            if self.blocks[r][0] == btype:
                return r
        return None

    def sync(self):
        self.calls["sync"] += 1
        self.synced = len(self.log)


def make_store(path, mode="hash", encrypt=False, arena_size=256 << 10, **kw):
    """Create a real store in `path` (created if missing) and return its path."""
    from foundation.store import Store

    os.makedirs(path, exist_ok=True)
    args = dict(mode=mode, block_size=BS, arena_size=arena_size, max_log_size=1 << 30)
    args.update(kw)
    Store.create(str(path), encrypt=encrypt, **args)
    return str(path)


def open_store(path, writable=True, **kw):
    from foundation.store import Store

    return Store.open(str(path), writable=writable, **kw)


# ---- image content ----------------------------------------------------------------
def text_like(rng, n):
    words = [b"the", b"virtual", b"machine", b"archive", b"disk", b"block", b"foundation",
             b"snapshot", b"kernel", b"config", b"\n", b"=", b"0x", b"usr/lib"]
    out = bytearray()
    while len(out) < n:
        out += rng.choice(words) + b" "
    return bytes(out[:n])


def content(rng, n):
    """n bytes mixing random, text-like, zero and repeated blocks."""
    out = bytearray()
    while len(out) < n:
        k = rng.randint(1, 16) * BS
        kind = rng.random()
        if kind < 0.35:
            out += rng.randbytes(k)
        elif kind < 0.65:
            out += text_like(rng, k)
        elif kind < 0.85:
            out += bytes(k)
        else:
            out += (rng.randbytes(64) * (k // 64 + 1))[:k]
    return bytes(out[:n])


def mutate(rng, img, days_ops=6, grow=False):
    """Change a bytearray image in place like a guest would; -> changed [offset, length] list.

    Overwrites (aligned and not), copies of extents to new offsets, zeroed
    ranges and, if `grow`, an append that makes the image longer.
    """
    changed = []
    size = len(img)
    for _ in range(days_ops):
        op = rng.random()
        n = rng.randint(1, 40000)
        off = rng.randrange(0, max(1, size - n))
        n = min(n, size - off)
        if op < 0.4:
            img[off:off + n] = content(rng, n)
        elif op < 0.7:
            src = rng.randrange(0, max(1, size - n))
            img[off:off + n] = bytes(img[src:src + n])
        else:
            img[off:off + n] = bytes(n)
        changed.append([off, n])
    if grow:
        extra = rng.randint(1, 5) * BS + rng.randint(0, 3000)
        start = len(img)
        img += content(rng, extra)
        changed.append([start, extra])
    return changed


def seeded(seed):
    return random.Random(seed)


def qemu(*args):
    """A qemu-img or qemu-io command that must succeed."""
    subprocess.run(args, check=True, capture_output=True)


def scattered(f, size, rng, writes, most):
    """Make open file f a sparse raw disk of `size` bytes holding `writes` random extents of up to `most`
    bytes each."""
    f.truncate(size)
    for _ in range(writes):
        f.seek(rng.randrange(size - most))
        f.write(rng.randbytes(rng.randrange(1, most)))
