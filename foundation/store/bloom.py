"""The Bloom filter in front of the index, sized for the keys it holds and grown with them.

A filter made for the largest log the store might reach costs its full
size on disk and in memory from the first day (118 MB for 256 GiB), and
one made too small loses its use: past its capacity the false-positive
rate climbs towards one. So the filter is made for twice the keys it
starts with and counts what it is given; once the count passes its
capacity it is made again for twice the count, from the index (one
sequential pass) and the write buffer. Each key is added about twice in
all, and the rate stays at ERROR.
"""

import json
import os

import pybloomfilter

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

    def update(self, keys):
        keys = keys if isinstance(keys, list) else list(keys)
        super().update(keys)
        self.count += len(keys)
        if self.count > self.capacity and self.on_full is not None:
            self.on_full()


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
    for lo in range(0, len(buf), batch * step):
        part = bytes(buf[lo:lo + batch * step])  # sliced once: each key is then one slice of bytes
        bf.update([part[i:i + kl] for i in range(0, len(part), step)])
