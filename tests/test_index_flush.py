"""A flush merges the write buffer into the index in place, region by region through one reused
buffer: every entry is found afterwards, whether the pass is dense (every region read) or sparse
(seeks to clusters), over many regions and a shorter last one."""

import pytest

from foundation.store import Tuning
from foundation.store import index as index_mod
from tests.conftest import blocks

N = 3000


@pytest.mark.parametrize("region", [3, 1024])
@pytest.mark.parametrize("dense", [True, False])
def test_a_flush_in_regions_finds_every_entry(make_store, monkeypatch, region, dense):
    monkeypatch.setattr(index_mod, "REGION", region)   # 3: many regions, the last one shorter
    if not dense:
        monkeypatch.setattr(index_mod, "GAP", 0)      # n * GAP < nfile: a sparse pass, one seek per cluster
    op = make_store("hash", max_log_size=64 << 20)    # an index larger than the entries need
    data = blocks(N, seed=11)
    with op(tuning=Tuning(write_buffer_bytes=1 << 30)) as s:
        nfile = s.index.h.nfile
        refs = s.write_blocks(data[:N // 2 * 4096])
        s.flush()
        refs += s.write_blocks(data[N // 2 * 4096:])  # a second flush merges into buckets written by the first
        s.flush()
        assert s.index.h.nfile == nfile and s.index.h.entries == N  # merged in place, no grow
        for i in range(N):
            assert s.index.lookup(refs[i * 32:(i + 1) * 32]), i
    with op() as s:                                   # a fresh open: the index alone answers
        assert b"".join(s.read_blocks(refs)) == data
