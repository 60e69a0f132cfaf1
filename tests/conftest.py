import os
import random

import pytest

from foundation.store import Store, Tuning
try:  # the replica test servers, as fixtures
    from servers import ftp_server, ftps_server, local_server, s3_server, vsftpd_server  # noqa: F401
except ImportError:  # imported as tests.conftest by a test's helper script: no fixtures needed
    pass

BS = 4096


@pytest.fixture(autouse=True)
def host_state(tmp_path, monkeypatch):
    """The host's state directory (journals, the replicas' last runs) is the test's own, not /var/lib/foundation."""
    d = tmp_path / "host-state"
    monkeypatch.setenv("FOUNDATION_STATE_DIR", str(d))
    return d


def own_host(tmp_path, store):
    """Copies of one store are older copies of each other to a host that saw them all (exit 24):
    each copy gets a host, a state directory, of its own (the host_state fixture restores it)."""
    os.environ["FOUNDATION_STATE_DIR"] = str(tmp_path / f"host-{os.path.basename(store)}")


def blocks(n, seed=0, compressible=0.5, bs=BS):
    """n deterministic blocks: a mix of text-like (compressible) and random bytes."""
    rnd = random.Random(seed)
    out = bytearray()
    words = [b"foundation", b"archive", b"virtual", b"machine", b"snapshot", b"block ", b"\n", b"disk "]
    for _ in range(n):
        if rnd.random() < compressible:
            b = bytearray()
            while len(b) < bs:
                b += rnd.choice(words)
            out += b[:bs]
        else:
            out += rnd.randbytes(bs)
    return bytes(out)


@pytest.fixture
def make_store(tmp_path):
    """make_store(mode="hash", encrypt=False, **create_kw) -> (path, open(**kw))."""
    count = [0]

    def make(mode="hash", encrypt=False, arena_size=256 << 10, max_log_size=64 << 20, **kw):
        count[0] += 1
        path = tmp_path / f"store{count[0]}"
        path.mkdir()
        key_file = str(tmp_path / f"key{count[0]}") if encrypt else None
        Store.create(str(path), mode=mode, arena_size=arena_size, max_log_size=max_log_size,
                     encrypt=encrypt, key_file=key_file, **kw)

        def opener(writable=True, **okw):
            okw.setdefault("tuning", Tuning(write_buffer_bytes=64 << 10, index_cache_bytes=1 << 20,
                                            block_cache_bytes=1 << 20))
            return Store.open(str(path), key_file=key_file, writable=writable, **okw)

        opener.path = str(path)
        opener.key_file = key_file
        return opener

    return make


@pytest.fixture(params=["hash", "value"])
def mode(request):
    return request.param


def arena_files(path):
    d = os.path.join(path, "arenas")
    return [os.path.join(d, x) for x in sorted(os.listdir(d))]


FIRST_PAYLOAD = 72 + 64  # arena header + first record header


def damage(path, offset, data=b"\xff\xfe"):
    """Overwrite bytes of a store file in place, as a failing disk would."""
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)
