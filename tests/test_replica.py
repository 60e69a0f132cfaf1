"""Replicas end to end: replicate, audit, recover and repair against real servers on loopback.

The servers are tests/servers.py's: a directory (file://), pyftpdlib for
FTP and FTPS, vsftpd (Debian's, TLS session reuse demanded) for FTPS, MinIO for S3;
each test gets a fresh replica inside one. The
stores are real and encrypted unless a test says otherwise, and are driven
through the `foundation` command as a user would.
"""

import dataclasses
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
from servers import (NotAvailable, free_port, ftp_server, ftps_server, local_server, s3_server,  # noqa: F401
                     small_disk, start_ftpd, start_minio, vsftpd_server)
from conftest import damage
from test_image_support import BS, content, make_store, seeded

from foundation.cli import main
from foundation.errors import DataCorrupt, WrongKey
from foundation.replica import open_backend, spec_from_url
from foundation.replica import repair as repair_mod
from foundation.replica.recover import PARTIAL, recover
from foundation.replica.sync import Local, replicate
from foundation.store import format as F
from foundation.store import verify as verify_mod
from foundation.store.verify import Damage, Kind

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARKER = b"FOUNDATION-PLAINTEXT-MARKER-5c1e"   # written into every image: must never reach a server
VM = "secret-vm-name"
SERVERS = ("file", "ftp", "ftps", "vsftpd", "s3")
_count = [0]


@pytest.fixture(params=SERVERS)
def srv(request):
    """A fresh, empty replica on each kind of server."""
    return fresh(request, request.param)


def fresh(request, kind):
    base = request.getfixturevalue({"file": "local_server"}.get(kind, f"{kind}_server"))
    _count[0] += 1
    return base.sub(f"{re.sub(r'[^a-z0-9]+', '-', request.node.name.lower())}-{_count[0]}")


class Site:
    """A store with its key, one image imported day by day, and a config file naming replicas."""

    def __init__(self, tmp_path, capsys, mode="hash", encrypt=True, size=3 << 20, arena_size=256 << 10, seed=11,
                 run=None):
        self.tmp, self.capsys = tmp_path, capsys
        self.key = str(tmp_path / "store.key") if encrypt else None
        self.store = make_store(tmp_path / "store", mode=mode, encrypt=encrypt, key_file=self.key,
                                arena_size=arena_size, **({} if run is None else {"run": run}))
        self.rng = seeded(seed)
        self.img = bytearray(content(self.rng, size))
        for off in range(0, size, 64 * BS):      # the marker in many blocks, never at a block start
            self.img[off + 100:off + 100 + len(MARKER)] = MARKER
        self.image = tmp_path / f"{VM}-disk.raw"
        self.history = {}
        self.config = None

    def use(self, srv, name="offsite", **extra):
        """Write a config file whose [replicas.NAME] table is srv (plus extra keys)."""
        lines = [f"[replicas.{name}]", f"url = {json.dumps(srv.url)}"]
        lines += [f"{k} = {json.dumps(v)}" for k, v in {**srv.options, **extra}.items()]
        self.config = self.tmp / f"foundation-{name}.toml"
        self.config.write_text("\n".join(lines) + "\n")
        return self.config

    def cli(self, *args, store=None, config=True):
        """`foundation --store … --key-file … [--config …] ARGS` in-process -> (status, stdout, stderr)."""
        argv = ["--store", str(store or self.store)]
        if self.key:
            argv += ["--key-file", self.key]
        if config and self.config:
            argv += ["--config", str(self.config)]
        self.capsys.readouterr()
        rc = main(argv + [str(a) for a in args])
        out, err = self.capsys.readouterr()
        return rc, out, err

    def day(self, d, changes=6, config=True):
        """Change a few blocks and import the image as day d (the hook replicates when configured)."""
        if d > 1:
            for _ in range(changes):
                off = self.rng.randrange(len(self.img) // BS) * BS
                self.img[off:off + BS] = self.rng.randbytes(BS)
        self.image.write_bytes(self.img)
        rc, _, err = self.cli("import-image", VM, self.image, "--at", f"2024-05-{d:02d}T01:00:00Z", config=config)
        assert rc == 0, err
        self.history[d] = bytes(self.img)

    def restores(self, store=None):
        for d, data in self.history.items():
            out = self.tmp / "restored.raw"
            rc, _, err = self.cli("restore", f"{VM}@2024-05-{d:02d}T01:00:00Z", out, "--force", store=store)
            assert rc == 0, err
            assert out.read_bytes() == data, f"day {d} differs"

    def local(self, store=None):
        return Local(str(store or self.store), self.key)


@pytest.fixture
def site(tmp_path, capsys):
    return Site(tmp_path, capsys)


@pytest.fixture
def site1(tmp_path, capsys):
    """A Site whose records hold one block each (run 1): what repair re-encodes in place."""
    return Site(tmp_path, capsys, run=1)


@dataclasses.dataclass
class Reworded(Damage):
    """A Damage whose message says nothing of what it is."""

    def __post_init__(self):
        self.what = f"reworded ({len(self.what)} characters)"


@pytest.fixture(params=["worded", "reworded"])
def wording(request, monkeypatch):
    """Damage messages as verify words them, or reworded: repair, audit and replicate decide on
    Damage.kind, so every outcome must be the same."""
    if request.param == "reworded":
        monkeypatch.setattr(verify_mod, "Damage", Reworded)
    return request.param


def tree_hashes(path):
    """{relative path: sha256} of every file of a store, to show it was not touched."""
    out = {}
    for d, _, files in os.walk(path):
        for f in files:
            if f in ("lock", "readers"):
                continue
            p = os.path.join(d, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, path)] = hashlib.sha256(fh.read()).hexdigest()
    return out


def objects(srv, prefix="arenas/"):
    return sorted(n for n in srv.stored() if n.startswith(prefix) and ".tmp-" not in n)


def flip(srv, name, at=None):
    data = bytearray(srv.read(name))
    at = len(data) // 2 if at is None else at
    data[at] ^= 0x5A
    srv.write(name, bytes(data))


# ---- replicate, audit, recover: the whole round on each server ---------------------------------

def test_replicate_days_then_recover_everything(srv, site, tmp_path):
    site.use(srv)
    for d in (1, 2, 3):
        site.day(d)                           # import-image replicates at its end
    stored = srv.stored()
    assert {"store.json", "manifest"} <= set(stored) and objects(srv) and objects(srv, "open/")
    assert not [n for n in stored if ".tmp-" in n or n.endswith(".multipart")]
    # A day changes little: only its new arenas and the open arena's new part go up.
    site.day(4, config=False)
    with site.local() as loc, srv.backend() as b:
        res = replicate(loc, b)
    total = sum(srv.stored().values())
    assert 0 < res.bytes_sent < total / 3, (res.bytes_sent, total)
    rc, out, _ = site.cli("audit")
    assert rc == 0 and out.startswith("ok: replica offsite"), out
    # The server holds ciphertext and MACs only: no image bytes, no names.
    for name in srv.stored():
        data = srv.read(name)
        for secret in (MARKER, VM.encode(), site.image.name.encode()):
            assert secret not in data, f"{secret!r} in {name}"
    # The local disk is lost: the replica and the key bring every day back.
    shutil.rmtree(site.store)
    new = tmp_path / "recovered"
    rc, out, err = site.cli("recover", "--from", "offsite", "--store", new)
    assert rc == 0, out + err
    assert "4 snapshot(s)" in out and "ok:" in out
    site.restores(store=new)
    assert site.cli("verify", store=new)[0] == 0
    # The recovered store goes on as the same store, replicating to the same replica.
    site.store = str(new)
    site.day(5)
    rc, out, _ = site.cli("audit")
    assert rc == 0, out


def test_audit_finds_missing_corrupt_stale_and_tampered(srv, site):
    site.use(srv)
    site.day(1)
    site.day(2)
    arenas = objects(srv)
    srv.remove(arenas[0])
    flip(srv, arenas[1])
    site.day(3, config=False)                 # a day the replica has not seen
    rc, out, _ = site.cli("audit")
    assert rc == 1
    assert f"MISSING {arenas[0]}:" in out
    assert f"CORRUPT {arenas[1]}:" in out
    assert "STALE replica: " in out
    rc, out, _ = site.cli("audit", "--fix")
    assert "fixed: replica" in out
    assert site.cli("audit")[0] == 0
    # Someone without the key edits the manifest: caught, and a replicate writes it again.
    m = srv.read("manifest").replace(b'"written":"2', b'"written":"1')
    srv.write("manifest", m)
    rc, out, _ = site.cli("audit")
    assert rc == 1 and "TAMPERED manifest: " in out, out
    rc, out, _ = site.cli("replicate")
    assert rc == 0, out
    assert site.cli("audit")[0] == 0


def test_audit_sample_and_presence_only(request, site):
    srv = fresh(request, "file")
    site.use(srv)
    site.day(1)
    flip(srv, objects(srv)[2])
    rc, out, _ = site.cli("audit", "--sample", "0")       # presence and sizes only: the flip is not seen
    assert rc == 0 and "0 downloaded" in out, out
    rc, out, _ = site.cli("audit", "--sample", "100")
    assert rc == 1 and "CORRUPT" in out


# ---- an upload killed midway resumes ------------------------------------------------------------

@pytest.mark.parametrize("kind", ["file", "ftp", "vsftpd", "s3"])
def test_killed_upload_resumes(request, tmp_path, capsys, kind):
    """kill -9 midway; S3 sends two objects and two parts of each at once, and keeps the parts that
    were up (a 32 MiB arena: four parts, so that two are up while two are in flight)."""
    srv = fresh(request, kind)
    mib = 32 if kind == "s3" else 16
    site = Site(tmp_path, capsys, size=4 << 20, arena_size=mib << 20)
    site.img = bytearray(site.rng.randbytes((mib + 4) << 20))   # incompressible: arena 0 seals
    site.day(1)
    site.use(srv, bandwidth="8M", **({"parallel": 2} if kind == "s3" else {}))
    env = dict(os.environ, PYTHONPATH=ROOT)
    p = subprocess.Popen([sys.executable, "-m", "foundation", "--store", site.store, "--key-file", site.key,
                          "--config", str(site.config), "replicate"], env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    partial = 0
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and p.poll() is None:
        partial = max([s for n, s in srv.stored().items() if ".tmp-" in n or n.endswith(".multipart")], default=0)
        if partial >= 8 << 20:
            break
        time.sleep(0.05)
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert partial >= 8 << 20, "the upload was not caught midway"
    assert "manifest" not in srv.stored()
    with site.local() as loc, srv.backend() as b:
        res = replicate(loc, b)
    total = sum(srv.stored().values())
    assert res.bytes_sent <= total - (8 << 20), (res.bytes_sent, total)
    assert not [n for n in srv.stored() if ".tmp-" in n or n.endswith(".multipart")]
    rc, out, _ = site.cli("audit")
    assert rc == 0, out


def test_parallel_replicate_commits_the_manifest_last(request, tmp_path, capsys):
    """S3 puts several objects at once; the manifest goes up only after every one of them, and not at
    all when one of them fails; the next replicate then sends only what is missing."""
    import threading

    from foundation.replica.backend import Permanent, Wrapper

    srv = fresh(request, "s3")
    site = Site(tmp_path, capsys, size=4 << 20, arena_size=512 << 10)
    site.img = bytearray(site.rng.randbytes(4 << 20))     # incompressible: eight sealed arenas
    site.day(1)
    log, lock = [], threading.Lock()

    class Recorder(Wrapper):
        fail = None

        def put(self, name, *args, **kw):
            with lock:
                log.append(("start", name))
            time.sleep(0.05)                               # long enough for the others to start
            if name == self.fail:
                raise Permanent(self.url, "injected refusal")
            self.inner.put(name, *args, **kw)
            with lock:
                log.append(("end", name))

        def get(self, name, *args, **kw):
            return self.timed(f"get {name}", self.inner.get, name, *args, **kw)

        def list(self, prefix=""):
            return self.timed("list", self.inner.list, prefix)

        def timed(self, what, fn, *args, **kw):
            with lock:
                log.append(("start", what))
            time.sleep(0.05)
            try:
                return fn(*args, **kw)
            finally:
                with lock:
                    log.append(("end", what))

    names = []

    class Names(Recorder):
        def put(self, name, *args, **kw):
            names.append(name)
            return super().put(name, *args, **kw)
    with site.local() as loc, srv.backend() as b:
        rec = Names(b)
        res = replicate(loc, rec)
    assert rec.concurrent == 4 and res.arenas_sent >= 8
    inflight = top = 0
    for what, _ in log:
        inflight += 1 if what == "start" else -1
        top = max(top, inflight)
    assert top >= 2, "the objects went up one at a time"
    manifest_at = [i for i, (what, name) in enumerate(log) if name == "manifest" and what == "start"]
    last_object_end = max(i for i, (what, name) in enumerate(log) if what == "end" and name.startswith(("arenas/", "open/")))
    assert manifest_at and manifest_at[0] > last_object_end
    # The replica's state is read in one round trip, and store.json is up before any arena starts.
    assert sorted(log[:3]) == [("start", x) for x in ("get manifest", "get store.json", "list")], log[:6]
    claim_end = log.index(("end", "store.json"))
    first_object = min(i for i, (what, name) in enumerate(log) if name.startswith(("arenas/", "open/")))
    assert claim_end < first_object

    # Day 2 on a fresh replica, with one arena refused while the others are in flight: no manifest.
    srv2 = fresh(request, "s3")
    victim = sorted(n for n in names if n.startswith("arenas/"))[3]
    log.clear()
    with site.local() as loc, srv2.backend() as b:
        rec = Recorder(b)
        rec.fail = victim
        with pytest.raises(Permanent, match="injected refusal"):
            replicate(loc, rec)
    assert "manifest" not in srv2.stored() and victim not in srv2.stored()
    objects = [n for n in names if n.startswith(("arenas/", "open/"))]
    done = [n for what, n in log if what == "end" and n in objects]
    assert done, "no other object was in flight"
    with site.local() as loc, srv2.backend() as b:
        res = replicate(loc, b)
    assert res.arenas_sent + res.parts_sent == len(objects) - len(done)     # the rest were kept
    site.use(srv2)
    rc, out, _ = site.cli("audit")
    assert rc == 0, out


def test_replicate_sends_only_committed_bytes(request, site, tmp_path):
    """An archive writing beside replicate: what is past the head is not replicated."""
    from foundation.store import Store

    srv = fresh(request, "file")
    site.day(1)
    with Store.open(site.store, key_file=site.key, writable=True) as s:
        s.write_blocks(site.rng.randbytes(8 * BS))     # appended, not yet committed
        with site.local() as loc, srv.backend() as b:
            res = replicate(loc, b)
        end = s.log.open.end
        assert res.head.end < end
    new = tmp_path / "recovered"
    with srv.backend() as b:
        recover(b, str(new), site.key)
    with open(os.path.join(new, "head"), "rb") as f:
        assert f.read() == res.head.pack(Local(site.store, site.key).keys.mac)
    site.restores(store=new)


# ---- repair -----------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["file", "ftps", "vsftpd", "s3"])
def test_repair_from_replica(request, site, kind):
    srv = fresh(request, kind)
    site.use(srv)
    site.day(1)
    site.day(2)
    arenas = os.path.join(site.store, "arenas")
    with open(os.path.join(arenas, F.arena_name(1)), "r+b") as f:   # bit rot in a sealed arena
        f.seek(72 + 64 + 10)
        f.write(b"\xff\xfe\xfd")
    os.unlink(os.path.join(arenas, F.arena_name(3)))                   # and a lost one
    assert site.cli("verify")[0] != 0
    rc, out, err = site.cli("repair")
    assert rc == 0, out + err
    assert "HEALED arena 1: replaced by the replica's copy" in out
    assert "HEALED arena 3: replaced by the replica's copy" in out
    rc, out, _ = site.cli("verify")
    assert rc == 0, out
    site.restores()


def test_repair_open_arena_from_replica(request, site):
    srv = fresh(request, "file")
    site.use(srv)
    site.day(1)
    _, head = site.local().read_head()
    path = os.path.join(site.store, "arenas", F.arena_name(head.arena))
    damage(path, 72 + 64 + 3, b"\x00\x01")
    assert site.cli("verify")[0] == 1
    rc, out, err = site.cli("repair")
    assert rc == 0 and "(open): bytes up to offset" in out, out + err
    assert site.cli("verify")[0] == 0
    site.restores()


def _damage(store, n, at):
    """Flip the byte of arena n at offset `at` (a constant written there is the byte already there
    once in 256 runs: the payloads are encrypted under each run's new key)."""
    with open(os.path.join(store, "arenas", F.arena_name(n)), "r+b") as f:
        f.seek(at)
        c = f.read(1)[0]
        f.seek(at)
        f.write(bytes([c ^ 0xee]))


def zstd_data_records(store, n, count, codecs=(1,)):
    """Offsets of the first `count` DATA records of arena n compressed with zstd (codec 1; or codecs)."""
    with open(os.path.join(store, "arenas", F.arena_name(n)), "rb") as f:
        buf = f.read()
    out, off = [], 72
    while len(out) < count and buf[off:off + 4] == b"FDNr":
        stored = int.from_bytes(buf[off + 8:off + 12], "little")
        if buf[off + 4] == F.DATA and buf[off + 5] in codecs:
            out.append(off)
        off += 64 + stored
    return out


@pytest.mark.parametrize("mode", ["hash", "value"])
def test_repair_from_image_without_replica(tmp_path, capsys, mode, wording):
    """Damaged records healed in place from the disk image: the arena MAC verifies again."""
    site = Site(tmp_path, capsys, mode=mode, run=1)
    site.day(1)
    a, b = zstd_data_records(site.store, 1, 2)
    with open(os.path.join(site.store, "arenas", F.arena_name(1)), "r+b") as f:
        f.seek(a + 64 + 7)
        f.write(b"\x13\x37")                   # the payload
        f.seek(b + 16 + 3 if mode == "hash" else b + 64 + 1)
        c = f.read(1)[0]
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([c ^ 0x42]))             # the score in the header (hash), the payload (value): flipped,
                                               # as a byte written over it is already there once in 256 runs
    rc, out, _ = site.cli("verify")
    assert rc == 1 and f"arena 1 offset {a}" in out and f"arena 1 offset {b}" in out
    rc, out, _ = site.cli("repair", "--no-replica")
    assert rc == 1 and f"LOST arena 1 offset {a}" in out
    rc, out, err = site.cli("repair", "--no-replica", "--image", site.image)
    assert rc == 0, out + err
    assert f"HEALED arena 1 offset {a}: record written again in place" in out
    assert f"HEALED arena 1 offset {b}: record written again in place" in out
    assert site.cli("verify")[0] == 0
    site.restores()


def test_repair_stores_again_what_does_not_fit(site1, monkeypatch):
    """Compare-by-hash: a block that re-encodes to another length is stored at the log's end instead."""
    site = site1
    site.day(1)
    (a,) = zstd_data_records(site.store, 0, 1)
    _damage(site.store, 0, a + 64 + 2)
    assert site.cli("restore", VM, site.tmp / "x.raw")[0] == 20       # the damage is seen
    monkeypatch.setattr(repair_mod, "ZLEVELS", (0,))                   # as if the store's level were unknown
    monkeypatch.setattr(repair_mod.primary, "store_level", lambda conf: 0)
    res = repair_mod.repair(site.store, site.key, images=[(str(site.image), None)])
    assert res.restored == [(0, a)] and not res.lost
    site.restores()
    rc, out, _ = site.cli("verify")
    assert rc == 1 and f"arena 0 offset {a}" in out                    # the old record stays damaged


def test_repair_re_encodes_at_the_store_compression_level(site1):
    """A store set to a level repair would not otherwise try (7) is healed in place, not stored again."""
    site = site1
    conf_path = os.path.join(site.store, F.CONFIG)
    with open(conf_path) as f:
        conf = json.load(f)
    conf["compression"] = "zstd:7"
    with open(conf_path, "w") as f:
        json.dump(conf, f)
    assert 7 not in repair_mod.ZLEVELS
    site.day(1)
    (a,) = zstd_data_records(site.store, 0, 1)
    _damage(site.store, 0, a + 64 + 2)
    res = repair_mod.repair(site.store, site.key, images=[(str(site.image), None)])
    assert not res.restored and not res.lost
    assert any(f"arena 0 offset {a}: record written again in place" in h for h in res.healed), res.healed
    assert site.cli("verify")[0] == 0
    site.restores()


@pytest.mark.parametrize("mode", ["hash", "value"])
def test_repair_of_a_damaged_run(tmp_path, capsys, mode):
    """One damaged record of a run (codec 2) loses its whole run; a member cannot be re-encoded
    alone in place, so compare-by-hash stores the run's blocks again from the image, and
    compare-by-value says what it cannot heal."""
    site = Site(tmp_path, capsys, mode=mode, run=16)
    site.day(1)
    (a,) = zstd_data_records(site.store, 1, 1, (2,))
    path = os.path.join(site.store, "arenas", F.arena_name(1))
    with open(path, "rb") as f:
        f.seek(a)
        head = f.read(64)
    j, k, S = head[6], head[7], int.from_bytes(head[8:12], "little")
    first = a - j * (64 + S)
    damage(path, a + 64 + 1, b"\x13\x37")
    rc, out, _ = site.cli("verify")
    assert rc == 1
    for m in range(k):   # the damaged record and every other record of its run
        assert f"arena 1 offset {first + m * (64 + S)}" in out, out
    rc, out, err = site.cli("repair", "--no-replica", "--image", site.image)
    if mode == "hash":
        assert rc == 0, out + err
        site.restores()
    else:
        assert "does not re-encode to the same record" in out + err, out + err


# ---- refusals and errors leave the store untouched ---------------------------------------------

def test_errors_leave_the_store_untouched(request, site, tmp_path):
    site.day(1)
    before = tree_hashes(site.store)
    ftp = fresh(request, "ftp")
    # wrong credentials
    site.use(ftp, password="wrong")
    rc, _, err = site.cli("replicate")
    assert rc == 44 and "refused the credentials" in err
    s3 = fresh(request, "s3")
    site.use(s3, secret_key="wrong-secret")
    rc, _, err = site.cli("replicate")
    assert rc == 44 and "refused the credentials" in err and "wrong-secret" not in err
    # a server that is not there
    spec = spec_from_url(f"ftp://u@127.0.0.1:{free_port()}/x", password="p", timeout=2)
    with site.local() as loc, open_backend(spec, attempts=2, backoff=0.01) as b:
        with pytest.raises(Exception) as e:
            replicate(loc, b)
    assert e.value.code == 42 and "cannot be reached" in str(e.value)
    # a full server
    full = start_ftpd(str(tmp_path / "full"), quota=300_000)
    try:
        site.use(full)
        rc, _, err = site.cli("replicate")
        assert rc == 45 and "is full" in err
    finally:
        full.stop()
    # a replica of another store, and a prefix holding other files
    (tmp_path / "other").mkdir()
    other = Site(tmp_path / "other", site.capsys, seed=3)
    other.day(1)
    srv = fresh(request, "ftp")
    other.use(srv)
    assert other.cli("replicate")[0] == 0
    stored = srv.stored()
    site.use(srv)
    rc, _, err = site.cli("replicate")
    assert rc == 48 and "not this store" in err
    assert srv.stored() == stored
    junk = fresh(request, "s3")
    junk.write("holiday.jpg", b"not a replica")
    site.use(junk)
    rc, _, err = site.cli("replicate")
    assert rc == 49 and "holiday.jpg" in err
    assert set(junk.stored()) == {"holiday.jpg"}
    assert tree_hashes(site.store) == before
    site.restores()


def test_full_s3_server_then_room_again(tmp_path, capsys):
    """MinIO on a small tmpfs fills up for real: a clear error, the store untouched; with room, replicate goes on."""
    with small_disk(tmp_path / "minio", "40m") as disk:
        try:
            srv = start_minio(str(disk))
        except NotAvailable as e:
            pytest.skip(str(e))
        try:
            site = Site(tmp_path, capsys, arena_size=4 << 20)
            site.img = bytearray(site.rng.randbytes(64 << 20))      # incompressible: 64 MB of arenas
            site.day(1)
            before = tree_hashes(site.store)
            site.use(srv.sub("full"))
            rc, _, err = site.cli("replicate")
            assert rc == 45 and "is full" in err, err
            assert tree_hashes(site.store) == before
            subprocess.run(["mount", "-o", "remount,size=256m", str(disk)], check=True)
            deadline = time.monotonic() + 60
            while True:            # MinIO looks at its free space again only every few seconds
                rc, out, err = site.cli("replicate")
                if rc != 45 or time.monotonic() > deadline:
                    break
                time.sleep(1)
            assert rc == 0, out + err
            rc, out, _ = site.cli("audit", "--sample", "100")
            assert rc == 0, out
        finally:
            srv.stop()


def test_unencrypted_store_is_refused_unless_allowed(request, tmp_path, capsys):
    site = Site(tmp_path, capsys, encrypt=False)
    site.day(1)
    srv = fresh(request, "file")
    site.use(srv)
    rc, _, err = site.cli("replicate")
    assert rc == 51 and "not encrypted" in err
    assert srv.stored() == {}
    rc, _, err = site.cli("replicate", "--to", srv.url, "--allow-plaintext", config=False)
    assert rc == 0, err
    site.use(srv, allow_plaintext=True)
    site.day(2)
    rc, out, _ = site.cli("audit")
    assert rc == 0, out


def test_recover_refusals_and_resume(request, site, tmp_path):
    srv = fresh(request, "ftp")
    site.use(srv)
    site.day(1)
    site.day(2)
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "photo.jpg").write_bytes(b"x")
    rc, _, err = site.cli("recover", "--from", "offsite", "--store", busy)
    assert rc == 53 and "not empty" in err
    # the key of another store: refused before anything is written
    (tmp_path / "o").mkdir()
    other = Site(tmp_path / "o", site.capsys)
    target = tmp_path / "target"
    rc, _, err = site.cli("recover", "--from", "offsite", "--store", target, "--key-file", other.key)
    assert rc == WrongKey.code and not target.exists()
    # interrupted after two arenas, then resumed
    calls = [0]

    class Cut(Exception):
        pass

    with srv.backend() as b:
        get_file = b.get_file

        def cut(name, path, progress=None):
            calls[0] += 1
            if calls[0] > 2:
                raise Cut()
            return get_file(name, path, progress)

        b.get_file = cut
        with pytest.raises(Cut):
            recover(b, str(target), site.key)
    assert (target / PARTIAL).exists() and not (target / "foundation.json").exists()
    assert site.cli("list", store=target)[0] == 10                   # not a store yet, and says so
    rc, out, err = site.cli("recover", "--from", "offsite", "--store", target)
    assert rc == 0 and out.startswith("resumed and finished"), out + err
    site.restores(store=target)


def test_replica_failure_does_not_fail_the_import(site, tmp_path, caplog):
    share = tmp_path / "share"
    site.config = tmp_path / "foundation.toml"
    site.config.write_text(f'[replicas.nas]\nurl = "file://{share}"\n')
    site.day(1)                                                        # the share is not mounted
    assert "was NOT updated" in caplog.text
    share.mkdir()
    site.day(2)
    rc, out, _ = site.cli("audit")
    assert rc == 0, out


# ---- gc: rewritten arenas replace the old ones remotely ------------------------------------------

@pytest.mark.parametrize("mode", ["hash", "value"])
def test_replica_follows_gc(request, tmp_path, capsys, mode, monkeypatch):
    site = Site(tmp_path, capsys, mode=mode, size=2 << 20)
    srv = fresh(request, "file")
    site.use(srv)
    checks, real = [], verify_mod.verify_arena

    def seen(store, n, buf, sealed, chain, committed=None, full=True):
        checks.append((sealed, full))
        return real(store, n, buf, sealed, chain, committed, full)
    monkeypatch.setattr(verify_mod, "verify_arena", seen)
    for d in range(1, 5):
        site.day(d)
        big = site.rng.randbytes(1 << 20) if d % 2 else bytes(1 << 20)   # a large file comes and goes
        site.img[1 << 20:2 << 20] = big
    # A sealed arena the replica holds nothing of goes up checked by its tags alone (its decoding
    # and scores could change nothing that goes up); the open arena is checked whole, and so is a
    # sealed one the replica holds as segments of the arena that was open.
    assert (True, False) in checks and (False, True) in checks and (False, False) not in checks
    old = set(objects(srv))
    rc, out, err = site.cli("forget", f"{VM}@2024-05-01T01:00:00Z", f"{VM}@2024-05-03T01:00:00Z")
    assert rc == 0, out + err
    checks.clear()
    rc, out, err = site.cli("gc", "--min-garbage", "1")               # replicates at its end
    assert rc == 0 and "rewrote" in out, out + err
    if mode == "hash":     # an arena rewritten in place of one the replica holds: checked whole
        assert (True, True) in checks, checks
    now = set(objects(srv))
    assert now != old and any(".1." in n for n in now), now            # new generations went up
    rc, out, _ = site.cli("audit")
    assert rc == 0, out
    del site.history[1], site.history[3]
    new = tmp_path / "recovered"
    assert site.cli("recover", "--from", "offsite", "--store", new)[0] == 0
    site.restores(store=new)


@pytest.mark.parametrize("mode,point", [("hash", "gc.swapped:2"), ("value", "gc.journaled")])
def test_replica_keeps_what_kept_snapshots_need_when_gc_is_cut(request, tmp_path, capsys, mode, point):
    """gc killed midway: the replica as it stands, and after each later replicate, recovers every kept day."""
    site = Site(tmp_path, capsys, mode=mode, size=2 << 20)
    srv = fresh(request, "file")
    site.use(srv)
    for d in range(1, 6):
        site.day(d)
        site.img[1 << 20:2 << 20] = site.rng.randbytes(1 << 20) if d % 2 else bytes(1 << 20)
    rc, out, err = site.cli("forget", f"{VM}@2024-05-01T01:00:00Z", f"{VM}@2024-05-03T01:00:00Z")
    assert rc == 0, out + err
    del site.history[1], site.history[3]
    before = set(objects(srv))
    argv = ["--store", site.store, "--key-file", site.key, "--config", str(site.config),
            "gc", "--min-garbage", "0"]
    p = subprocess.run([sys.executable, "-m", "foundation", *argv], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=ROOT, FOUNDATION_GC_CRASH=point))
    assert p.returncode == 137 and "test crash" in p.stderr, p.stderr
    assert set(objects(srv)) == before                   # gc died before its replicate: nothing remote moved

    def recovers(k):
        new = tmp_path / f"recovered-{k}"
        rc, out, err = site.cli("recover", "--from", "offsite", "--store", new)
        assert rc == 0, out + err
        site.restores(store=new)

    recovers(1)                                         # the replica as gc left it
    rc, out, err = site.cli("replicate")                # a journaled log switch is finished first, and said
    assert rc == 0, out + err
    assert ("finished the switch of an interrupted gc" in out) == (mode == "value"), out
    assert set(objects(srv)) != before and any(".1." in n for n in objects(srv))   # rewritten arenas went up
    recovers(2)
    rc, out, err = site.cli("gc", "--min-garbage", "0")  # finishes, then replicates
    assert rc == 0, out + err
    rc, out, _ = site.cli("audit", "--sample", "100")
    assert rc == 0, out
    recovers(3)
    site.restores()


def test_status_shows_each_replicas_last_run(request, site):
    good, ftp = fresh(request, "file"), fresh(request, "ftp")
    site.use(good)
    table = {"url": ftp.url, **ftp.options, "password": "pw-5ecret"}
    bad = "\n".join(f"{k} = {json.dumps(v)}" for k, v in table.items())
    site.config.write_text(site.config.read_text() + f"[replicas.broken]\n{bad}\n")
    rc, out, _ = site.cli("status")
    assert rc == 0
    assert f"replica offsite ({good.url}): never replicated from this host" in out, out
    assert f"replica broken ({ftp.url}): never replicated from this host" in out
    site.day(1)                                 # replicates at its end: one replica works, one refuses us
    _, head = site.local().read_head()
    rc, out, _ = site.cli("status")
    assert f"replica offsite ({good.url}): replicated 20" in out, out
    assert f"up to arena {head.arena} offset {head.end}" in out
    assert f"replica broken ({ftp.url}): FAILED 20" in out and "(never succeeded)" in out
    assert "refused the credentials" in out and "pw-5ecret" not in out
    site.config.write_text(site.config.read_text().replace('password = "pw-5ecret"',
                                                           f'password = {json.dumps(ftp.options["password"])}'))
    rc, out, err = site.cli("replicate", "--replica", "broken")
    assert rc == 0, out + err
    rc, out, _ = site.cli("status")
    assert f"replica broken ({ftp.url}): replicated 20" in out, out


# ---- what review found: rollbacks, local rot, audit --fix, a forged store.json ---------------------

def test_a_store_rolled_back_sends_its_new_bytes(request, site, tmp_path):
    """Recovered from an older replica B, the store grows past where replica A was: A must get the new
    bytes of the open arena, not keep its segments of the lost timeline."""
    a, b = fresh(request, "file"), fresh(request, "file")
    site.day(1, config=False)
    for srv in (a, b):
        with site.local() as loc, srv.backend() as be:
            replicate(loc, be)
    site.day(2, config=False)
    with site.local() as loc, a.backend() as be:
        replicate(loc, be)
    shutil.rmtree(site.store)                          # the disk dies; only B answers
    with b.backend() as be:
        recover(be, str(tmp_path / "rolled-back"), site.key)
    site.store = str(tmp_path / "rolled-back")
    del site.history[2]
    rc, _, err = site.cli("import-image", VM, site.image, "--at", "2024-05-03T01:00:00Z", config=False)
    assert rc == 26 and "older copy" in err, err        # this host saw day 2
    assert site.cli("accept-rollback", config=False)[0] == 0
    site.day(3, changes=10, config=False)
    site.use(a)
    stored = a.stored()
    rc, out, err = site.cli("replicate")
    assert rc == 54 and a.stored() == stored, out + err   # A's day 2 is kept unless forced
    rc, out, err = site.cli("replicate", "--force")
    assert rc == 0, out + err
    rc, out, _ = site.cli("audit", "--sample", "100")
    assert rc == 0, out
    with a.backend() as be:
        recover(be, str(tmp_path / "from-a"), site.key)
    site.restores(store=tmp_path / "from-a")


def rot_open_arena(site):
    _, head = site.local().read_head()
    with open(os.path.join(site.store, "arenas", F.arena_name(head.arena)), "r+b") as f:
        f.seek(72 + 64 + 3)                            # the first record's payload
        f.write(b"\x00\x01")
    return head


@pytest.mark.parametrize("how", ["seal", "merge"])
def test_local_rot_never_replaces_the_replicas_good_copy(request, tmp_path, capsys, how, wording):
    """Bit rot in open-arena bytes already replicated; then the arena seals (or its segments would merge):
    the damaged bytes never replace the replica's, and `repair` mends the arena from them."""
    site = Site(tmp_path, capsys, arena_size=(256 << 10) if how == "seal" else (4 << 20))
    srv = fresh(request, "file")
    site.use(srv)
    site.day(1)
    first = rot_open_arena(site)
    before = None
    for d in range(2, 40):
        site.day(d, changes=40 if how == "seal" else 1)
        _, head = site.local().read_head()
        parts = objects(srv, "open/")
        if how == "seal" and head.arena > first.arena:
            before = srv.stored()
            rc, out, err = site.cli("replicate")      # the sealed arena is damaged: nothing goes up
            assert rc == DataCorrupt.code and "run `foundation repair`" in err, out + err
            assert srv.stored() == before
            break
        if how == "merge" and len(parts) > 17:       # more segments than a merge allows: not merged
            break
    else:
        raise AssertionError("the scenario did not happen")
    rc, out, _ = site.cli("audit", "--sample", "100")
    assert "CORRUPT" not in out and "TAMPERED" not in out, out
    rc, out, err = site.cli("repair")
    assert rc == 0 and f"HEALED arena {first.arena}" in out and "replica's segments of it" in out, out + err
    assert site.cli("verify")[0] == 0
    rc, out, err = site.cli("replicate")
    assert rc == 0, out + err
    assert site.cli("audit", "--sample", "100")[0] == 0
    site.restores()


def test_audit_fix_sends_a_corrupt_segment_again_without_deleting_first(request, site, monkeypatch):
    from foundation.replica import sync

    srv = fresh(request, "file")
    site.use(srv)
    site.day(1)
    site.day(2)
    parts = objects(srv, "open/")
    assert len(parts) >= 2
    flip(srv, parts[0], at=200)
    rc, out, _ = site.cli("audit")
    assert rc == 1 and f"CORRUPT {parts[0]}: does not hold the bytes the manifest names" in out, out
    stored = srv.stored()
    real = sync.replicate

    def cut(local, backend, *a, **kw):                # the network drops as --fix begins to replicate
        raise OSError("network is unreachable")
    monkeypatch.setattr(sync, "replicate", cut)
    with pytest.raises(OSError):
        site.cli("audit", "--fix")
    assert srv.stored() == stored                      # nothing the manifest names was deleted
    monkeypatch.setattr(sync, "replicate", real)
    rc, out, err = site.cli("audit", "--fix")
    assert "fixed: replica" in out, out + err
    assert site.cli("audit", "--sample", "100")[0] == 0


def test_value_gc_then_growth_is_stale_not_tampered(request, tmp_path, capsys):
    site = Site(tmp_path, capsys, mode="value", size=2 << 20)
    srv = fresh(request, "file")
    site.use(srv)
    for d in range(1, 5):
        site.day(d)
        site.img[1 << 20:2 << 20] = site.rng.randbytes(1 << 20) if d % 2 else bytes(1 << 20)
    _, was = site.local().read_head()
    assert site.cli("forget", f"{VM}@2024-05-01T01:00:00Z", f"{VM}@2024-05-03T01:00:00Z")[0] == 0
    del site.history[1], site.history[3]
    assert site.cli("gc", "--min-garbage", "1", "--no-replicate")[0] == 0
    for d in range(5, 30):                             # the log grows past where the replica was
        site.img[1 << 20:2 << 20] = site.rng.randbytes(1 << 20)
        site.day(d, config=False)
        if site.local().read_head()[1].arena > was.arena:
            break
    rc, out, _ = site.cli("audit", "--sample", "0")
    assert rc == 1 and "STALE" in out and "another version of arena" in out and "TAMPERED" not in out, out
    rc, out, err = site.cli("audit", "--fix")
    assert "fixed: replica" in out, out + err
    assert site.cli("audit", "--sample", "100")[0] == 0
    new = tmp_path / "recovered"
    assert site.cli("recover", "--from", "offsite", "--store", new)[0] == 0
    site.restores(store=new)


@pytest.mark.parametrize("field,value", [("mode", "value"), ("max_log_size", 1 << 40), ("arena_size", 128 << 10)])
def test_a_forged_store_json_is_refused(request, site, tmp_path, field, value):
    srv = fresh(request, "file")
    site.use(srv)
    site.day(1)
    conf = json.loads(srv.read("store.json"))
    conf[field] = value
    srv.write("store.json", json.dumps(conf).encode())
    target = tmp_path / "recovered"
    rc, _, err = site.cli("recover", "--from", "offsite", "--store", target)
    assert rc == 50 and "store.json is not the config its manifest names" in err, err
    assert not (target / "foundation.json").exists()
    rc, out, _ = site.cli("audit", "--sample", "0")
    assert rc == 1 and "TAMPERED store.json" in out
    assert site.cli("replicate")[0] == 0                # written again from the local store
    assert site.cli("recover", "--from", "offsite", "--store", target)[0] == 0
    site.restores(store=target)


@pytest.mark.parametrize("at", [20, 60])
def test_repair_open_arena_whose_header_is_damaged(request, site, at, wording):
    """A flipped byte in the open arena's header, its tag included (bytes 56..63): mended from the replica."""
    srv = fresh(request, "file")
    site.use(srv)
    site.day(1)
    _, head = site.local().read_head()
    with open(os.path.join(site.store, "arenas", F.arena_name(head.arena)), "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0x40]))
    rc, out, err = site.cli("repair")
    assert rc == 0 and f"HEALED arena {head.arena} (open)" in out, out + err
    assert site.cli("verify")[0] == 0
    site.restores()


def test_a_replica_ahead_of_a_restored_store_is_kept_unless_forced(request, site, tmp_path):
    """The store comes back from an older copy: replicating would drop the replica's newer days."""
    srv = fresh(request, "file")
    site.use(srv)
    site.day(1)
    older = tmp_path / "older-copy"
    shutil.copytree(site.store, older)
    site.day(2)
    site.day(3)
    stored = srv.stored()
    newer = dict(site.history)
    shutil.rmtree(site.store)
    shutil.copytree(older, site.store)
    rc, _, err = site.cli("replicate")
    assert rc == 26 and "older copy" in err and "accept-rollback" in err, err   # this host saw day 3
    assert srv.stored() == stored
    assert site.cli("accept-rollback")[0] == 0
    rc, _, err = site.cli("replicate")
    assert rc == 54 and "holds a newer state of this store" in err and "--force" in err, err
    assert srv.stored() == stored
    rc, out, _ = site.cli("status")
    assert "FAILED" in out and "newer state" in out
    site.history = newer                                  # the newer days are still on the replica
    assert site.cli("recover", "--from", "offsite", "--store", tmp_path / "newer")[0] == 0
    site.restores(store=tmp_path / "newer")
    site.history = {1: newer[1]}
    assert site.cli("replicate", "--force")[0] == 26      # this host has just read the newer copy
    assert site.cli("accept-rollback")[0] == 0
    rc, out, err = site.cli("replicate", "--force")
    assert rc == 0, out + err
    assert site.cli("audit", "--sample", "100")[0] == 0


def test_recover_checks_every_record_once(request, site, tmp_path, monkeypatch):
    """Arenas come down several at once (S3) and each record is checked once: as its arena comes down,
    or by the final verify (the open arena); a damaged record is named as a verify of the store names it."""
    from foundation import native
    from foundation.store import Store
    srv = fresh(request, "s3")
    site.use(srv)
    site.day(1)
    site.day(2)
    sealed = objects(srv)
    assert len(sealed) >= 4
    flip(srv, sealed[2])
    checked, calls = {}, []
    real = native.check_span

    def counting(codec, n, *args, **kw):
        got = real(codec, n, *args, **kw)
        for off in got[0].offs:
            checked[n, off] = checked.get((n, off), 0) + 1
        return got
    monkeypatch.setattr(native, "check_span", counting)
    gets = []
    with srv.backend() as b:
        real_get = b.inner.get_file

        def get_file(name, *args, **kw):
            gets.append(("start", name))
            time.sleep(0.05)
            real_get(name, *args, **kw)
            gets.append(("end", name))
        monkeypatch.setattr(b.inner, "get_file", get_file)
        res = recover(b, str(tmp_path / "recovered"), site.key)
    assert res.snapshots == 2 and set(checked.values()) == {1}
    assert {n for n, _ in checked} == set(range(len(sealed) + 1))     # every arena, the open one too
    assert [what for what, _ in gets[:4]] == ["start"] * 4                       # at once
    with Store.open(str(tmp_path / "recovered"), key_file=site.key) as s:
        again = verify_mod.verify(s)
    assert res.damage and [str(d) for d in res.damage] == [str(d) for d in again[0]] and res.records == again[1]
    assert {d.arena for d in res.damage} == {2}


def test_recover_names_a_damaged_segment_and_resumes(request, site, tmp_path):
    srv = fresh(request, "file")
    site.use(srv)
    site.day(1)
    site.day(2)
    (part, *_) = objects(srv, "open/")
    good = srv.read(part)
    flip(srv, part, at=80)
    target = tmp_path / "recovered"
    rc, _, err = site.cli("recover", "--from", "offsite", "--store", target)
    assert rc == 50 and part in err and "does not hold the bytes its manifest names" in err, err
    assert (target / PARTIAL).exists() and not (target / "foundation.json").exists()
    srv.write(part, good)                                 # the server's copy is put right
    rc, out, err = site.cli("recover", "--from", "offsite", "--store", target)
    assert rc == 0 and out.startswith("resumed and finished"), out + err
    assert not (target / PARTIAL).exists()
    site.restores(store=target)


def test_repair_from_image_after_the_summary_was_rebuilt(site1):
    """`rebuild` leaves a damaged record out of its arena's summary: repair must still find it."""
    site = site1
    site.day(1)
    (a,) = zstd_data_records(site.store, 1, 1)
    damage(os.path.join(site.store, "arenas", F.arena_name(1)), a + 64 + 7, b"\x13\x37")
    rc, out, _ = site.cli("rebuild")
    assert rc == 1 and "LOST" in out  # the days that need the damaged block are named
    rc, out, err = site.cli("repair", "--no-replica", "--image", site.image)
    assert rc == 0 and f"HEALED arena 1 offset {a}" in out, out + err
    assert site.cli("verify")[0] == 0
    site.restores()


# ---- third review ---------------------------------------------------------------------------------

def test_repair_from_replica_after_the_summary_was_rebuilt(request, site):
    """A summary rebuilt around a damaged record leaves it out: once the replica's copy is back,
    the record must be found again (summary and index rebuilt)."""
    srv = fresh(request, "file")
    site.use(srv)
    site.day(1)
    site.day(2)
    (a,) = zstd_data_records(site.store, 1, 1, (1, 2))
    damage(os.path.join(site.store, "arenas", F.arena_name(1)), a + 64 + 7, b"\x13\x37")
    rc, out, _ = site.cli("rebuild")
    assert rc == 1 and "LOST" in out  # the days that need the damaged block are named
    rc, out, err = site.cli("repair")
    assert rc == 0 and "HEALED arena 1: replaced by the replica's copy" in out, out + err
    assert site.cli("verify")[0] == 0
    site.restores()


def test_repair_never_takes_another_timelines_record(request, tmp_path, capsys):
    """The store came back from an older copy and went on; the first record written since rots. The
    replica's record at that offset is of the lost timeline, valid on its own: it must not be used."""
    site = Site(tmp_path, capsys, mode="value", arena_size=4 << 20, size=1 << 20)
    srv = fresh(request, "file")
    site.day(1, config=False)
    older = tmp_path / "older"
    shutil.copytree(site.store, older)
    _, h0 = site.local().read_head()
    site.day(2, config=False)
    with site.local() as loc, srv.backend() as be:
        replicate(loc, be)
    shutil.rmtree(site.store)
    shutil.copytree(older, site.store)
    del site.history[2]
    assert site.cli("accept-rollback", config=False)[0] == 0    # going on from the older copy, deliberately
    site.day(3, config=False)
    path = os.path.join(site.store, "arenas", F.arena_name(h0.arena))
    with open(path, "rb") as f:
        mine = f.read()
    theirs = b"".join(srv.read(x) for x in objects(srv, "open/"))
    x = h0.end                                         # the first record the two timelines differ in
    while mine[x:x + 64 + int.from_bytes(mine[x + 8:x + 12], "little")] == \
            theirs[x:x + 64 + int.from_bytes(mine[x + 8:x + 12], "little")]:
        x += 64 + int.from_bytes(mine[x + 8:x + 12], "little")
    with open(path, "r+b") as f:
        f.seek(x + 64 + 100)
        f.write(b"\x00\x01\x02")
    site.use(srv)
    rc, out, err = site.cli("repair")
    assert rc == 1 and f"LOST arena {h0.arena} offset {x}" in out, out + err
    assert "another version of it" in err
    rc, _, err = site.cli("restore", f"{VM}@2024-05-03T01:00:00Z", tmp_path / "r.raw")
    assert rc == 20 and f"offset {x}" in err            # loudly, never other bytes
    site.history = {1: site.history[1]}
    site.restores()


def test_an_unfinished_recovery_is_not_opened_as_a_store(request, site, tmp_path, monkeypatch):
    from foundation.store import verify as V

    srv = fresh(request, "file")
    site.use(srv)
    site.day(1)
    target = tmp_path / "recovered"
    real = V.verify

    def cut(*a, **kw):                                 # a power cut during the final verify
        raise KeyboardInterrupt
    monkeypatch.setattr(V, "verify", cut)
    with srv.backend() as be, pytest.raises(KeyboardInterrupt):
        recover(be, str(target), site.key)
    monkeypatch.setattr(V, "verify", real)
    assert (target / "foundation.json").exists() and (target / PARTIAL).exists()
    rc, _, err = site.cli("import-image", VM, site.image, store=target, config=False)
    assert rc == 10 and "recovery from a replica has not finished" in err, err
    rc, out, err = site.cli("recover", "--from", "offsite", "--store", target)
    assert rc == 0 and out.startswith("resumed and finished"), out + err
    site.restores(store=target)


def test_repair_decides_on_the_damage_kind_not_its_words(site):
    """Past a record whose length is lost (Kind.UNPARSABLE), whatever its message says, a local
    record that differs from the replica's but keeps its header is the replica's to give back, and
    every record is wanted from the images; a damaged record alone (Kind.RECORD) cuts neither."""
    from foundation.replica.sync import own_prefix

    site.day(1)
    with site.local() as loc:
        _, head = loc.read_head()
        n = 0
        theirs = open(loc.arena_path(n), "rb").read()
        recs = repair_mod._records(loc, head, n, theirs)
        (x, *_), (y, _, _, length) = recs[1], recs[3]
        mine = bytearray(theirs)
        mine[y + 64 + 5] ^= 0xFF                      # a payload byte: the header stays the same
        for what in ("record is damaged (magic); the rest of the arena cannot be parsed", "", "ends before"):
            cut = [Damage(n, x, Kind.UNPARSABLE, what)]
            one = [Damage(n, x, Kind.RECORD, what + " cannot be parsed missing")]
            assert own_prefix(loc, n, bytes(mine), theirs, 0, cut) == len(theirs) - F.TRAILER_SIZE
            assert own_prefix(loc, n, bytes(mine), theirs, 0, one) == y
            wanted = {w.offset for w in repair_mod._damaged_records(loc, head, n, cut)}
            assert wanted == {r[0] for r in recs if r[0] >= x}
            assert {w.offset for w in repair_mod._damaged_records(loc, head, n, one)} == {x}
