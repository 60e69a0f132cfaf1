"""A later day whose changes copy older data: the runs' first keys are located together, and the
day deduplicates and reads back exactly as before."""

import os
import random

from foundation.image import ImageReader
from foundation.image.tree import BytesSource, write_image
from foundation.store import Store

BS = 4096


def _store(tmp_path):
    p = tmp_path / "s"
    p.mkdir()
    Store.create(str(p), mode="hash", encrypt=False, arena_size=64 * BS)
    return str(p)


def test_copies_of_older_data_dedup_with_their_run_heads_asked_together(tmp_path):
    path = _store(tmp_path)
    rnd = random.Random(7)
    day0 = bytearray(rnd.randbytes(600 * BS))
    with Store.open(path, writable=True) as s:
        root0 = write_image(s, BytesSource(bytes(day0)), len(day0))
        s.flush()  # older data in the index and sealed arenas, no summary loaded at the next open
    day1 = bytearray(day0)
    # two runs copied from far apart, with fresh blocks between them (in the batch too: a batch
    # holds the changed ranges back to back, so only blocks that are no copy part two runs)
    day1[400 * BS:420 * BS] = day0[20 * BS:40 * BS]
    day1[420 * BS:425 * BS] = rnd.randbytes(5 * BS)
    day1[425 * BS:435 * BS] = day0[300 * BS:310 * BS]
    changed = [(400 * BS, 35 * BS)]
    with Store.open(path, writable=True) as s:
        asked = []
        real = s.prefetch
        s.prefetch = lambda keys: (asked.append(list(keys)), real(keys))
        dups = s.counters["dup_blocks"]
        records = s.counters["records"]
        root1 = write_image(s, BytesSource(bytes(day1)), len(day1), prev=root0, changed=changed)
        assert s.counters["dup_blocks"] - dups == 30   # both copied runs found as duplicates
        assert s.counters["records"] - records < 5 + 30  # only the fresh blocks and tree nodes stored
        assert any(len(k) == 2 for k in asked)  # one key per run, both runs at once
        assert not s._ahead  # no lookup kept past the batch
        assert ImageReader(s, root1).read(0, len(day1)) == bytes(day1)
        assert ImageReader(s, root0).read(0, len(day0)) == bytes(day0)


def test_run_heads_are_the_first_key_of_each_run(tmp_path):
    path = _store(tmp_path)
    with Store.open(path, writable=True) as s:
        ks = [bytes([i]) * 32 for i in range(8)]
        unknown = [0, 1, 2, 5, 6, 9, 10, 11]
        assert s._run_heads(ks, ks, unknown) == [ks[0], ks[3], ks[5]]
        assert s._run_heads([ks[1], ks[2], ks[6]], ks, unknown) == [ks[1], ks[6]]
        assert s._run_heads([], ks, unknown) == []
    assert os.path.isdir(path)
