"""The Bloom filter in front of the index, sized for the keys it holds and grown with them.

A filter made for the largest log the store might reach costs its full
size on disk and in memory from the first day (118 MB for 256 GiB), and
one made too small loses its use: past its capacity the false-positive
rate climbs towards one. So the filter is made for twice the keys it
starts with and counts what it is given; once the count passes its
capacity it is made again for twice the count, from the index (one
sequential pass) and the write buffer. Each key is added about twice in
all, and the rate stays at ERROR.

Keys are added a batch at a time by the C core (native.bloom_add), which
sets in the filter's file the very bits pybloomfiltermmap3's add() sets,
with the GIL released: its own add is one Python call per key. They are
tested the same way (native.bloom_test: a batch a call, its answers those
of the filter's own `in`), through the one map of the file the adds use: a
test through the filter's own map touched every page of the file a second
time, and the process counted each page once per map (a night's peak
held the filter twice). Its file format is used unchanged.
"""

import json
import mmap
import os
import struct

import pybloomfilter

from foundation import native
from foundation.native.checks import bloom_bytes
from foundation.faults import crash_point
from foundation.store import format as F
from foundation.store.disk import atomic_write
from foundation.store.index import CRASH_ENV, INITIAL

ERROR = 0.001  # the false-positive rate: one index seek per 1000 fresh blocks


class Bloom(pybloomfilter.BloomFilter):
    """pybloomfiltermmap3's filter with a count of the keys given to it (an upper bound: a key
    given twice counts twice) and a callback once the count passes the capacity."""

    count = 0
    on_full = None
    _words = None   # the bit array in a map of our own: None not yet made, False not to be had

    def update(self, keys):
        keys = keys if isinstance(keys, list) else list(keys)
        super().update(keys)
        self._added(len(keys))

    def add_keys(self, keys, kl, step=None):
        """Add the kl-byte key at the start of every `step` bytes (default kl) of the buffer keys."""
        step = step or kl
        words = self._bits()
        if words:
            native.bloom_add(words, self.num_bits, self._seeds, keys, kl, step)
        else:  # the reference backend, or a filter file laid out otherwise: its own add
            b = bytes(keys)
            super().update([b[i:i + kl] for i in range(0, len(b), step)])
        self._added(memoryview(keys).nbytes // step)

    def maybe(self, keys, kl):
        """Which of the kl-byte keys end to end in `keys` the filter may hold: bytes, 1 for each such
        key, 0 for each it surely does not hold (its `in`, for all of them at once)."""
        words = self._bits()
        if words:
            return native.bloom_test(words, self.num_bits, self._seeds, keys, kl)
        b = bytes(keys)
        return bytes(super(Bloom, self).__contains__(b[i:i + kl]) for i in range(0, len(b), kl))

    def __contains__(self, key):
        return bool(self.maybe(key, len(key))[0])

    def _added(self, n):
        self.count += n
        if self.count > self.capacity and self.on_full is not None:
            self.on_full()

    def _bits(self):
        """The filter's bit array (u32 words after the file's preamble, as pybloomfiltermmap3 lays it
        out: magic, u64 bits, i32 header length, header, padded to 256 bytes), mapped shared: what
        is set there is set in the filter; False where the C core or the layout is not there."""
        if self._words is None:
            self._words = False
            if native.backend != "native":
                return False
            try:
                with open(self.filename, "r+b") as f:
                    m = mmap.mmap(f.fileno(), 0)
            except (OSError, ValueError):
                return False
            if len(m) >= 21:
                bits, hl = struct.unpack_from("=Qi", m, 9)
                pre = -(-(21 + hl) // 256) * 256
                if m[:9] == b"MBITARRAY" and bits == self.num_bits and 0 <= hl and \
                        pre + bloom_bytes(bits) <= len(m):
                    self._map, self._words, self._seeds = m, memoryview(m)[pre:], list(self.hash_seeds)
                    return self._words
            m.close()
        return self._words

    def close(self):
        if self._words:
            self._words.release()
            self._map.close()
        self._words = False
        super().close()


def size_for(count):
    """The capacity a filter holding `count` keys is made with."""
    return max(INITIAL, 2 * count)


def create(path, capacity):
    """A new, empty filter file at `path` (replacing any)."""
    if os.path.exists(path):
        os.unlink(path)
    return Bloom(capacity, ERROR, path)


def build(store, extra=b"", expect=0):
    """A filter over every key of the store's index and of `extra` (index entries: key and u64
    addr each), with room for `expect` keys more, written beside the old one and renamed over it;
    `bloom.json` says it covers what the index covers."""
    path = os.path.join(store.path, F.BLOOM)
    kl = store.keylen
    bf = create(path + ".new", size_for(store.index.h.entries + len(extra) // (kl + 8) + expect))
    for part in store.index.scan():
        _add(bf, part, kl, kl + 8)
    _add(bf, extra, kl, kl + 8)
    bf.sync()
    crash_point(CRASH_ENV, "bloom.grow")
    os.replace(path + ".new", path)
    atomic_write(os.path.join(store.path, F.BLOOM_STATE), json.dumps({"covered": store.index.h.covered}).encode())
    return bf


def add_entries(bf, entries, kl):
    """Add the key of every index entry (key and u64 addr) of `entries`."""
    _add(bf, entries, kl, kl + 8)


def _add(bf, buf, kl, step, batch=1 << 16):
    """Add the key at the start of every `step` bytes of buf, a batch at a time (a list of every
    key at once would cost ~70 bytes of memory a key)."""
    if isinstance(bf, Bloom):
        bf.add_keys(buf, kl, step)
        return
    for lo in range(0, len(buf), batch * step):
        part = bytes(buf[lo:lo + batch * step])  # sliced once: each key is then one slice of bytes
        bf.update([part[i:i + kl] for i in range(0, len(part), step)])
