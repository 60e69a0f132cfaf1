"""The replica backends against real servers: a directory, FTP, FTPS (pyftpdlib, vsftpd) and S3 (MinIO).

One set of tests runs on every backend (restic's way): round trips,
atomic and resumable puts (a failure injected in the chunk loop, and a
real kill -9 of the uploading process), replacement, cleanup, and the
bandwidth limit; then each kind of failure the rules name, and the
parsing of the [replicas.NAME] tables.
"""

import ftplib
import json
import os
import subprocess
import sys
import time

import pytest

from foundation.config import Config, ConfigError
from foundation.replica.backend import (
    AuthFailed, BadReplicaURL, Limiter, Permanent, RemoteFull, RemoteMissing, Retrying, Transient,
    Unreachable, check_name)
from foundation.replica.config import find_replica, parse_bandwidth, replicas_from_config, spec_from_url
from servers import PASSWORD, S3_SECRET, free_port, small_disk, start_ftpd

MiB = 1 << 20
KINDS = ["local", "ftp", "ftps", "vsftpd", "s3"]


@pytest.fixture(params=KINDS)
def server(request):
    """A fresh, empty replica on each kind of server."""
    srv = request.getfixturevalue(f"{request.param}_server")
    return srv.sub(request.node.name.replace("[", "-").rstrip("]"))


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """20 MiB of random bytes in a file: three S3 parts."""
    path = tmp_path_factory.mktemp("data") / "big"
    path.write_bytes(os.urandom(20 * MiB))
    return str(path)


def content(path):
    with open(path, "rb") as f:
        return f.read()


def temporaries(srv):
    return {n: size for n, size in srv.stored().items() if ".tmp-" in n or n.endswith(".multipart")}


def kept(srv, name):
    """Bytes of `name` an interrupted put left on the server, once it has written all it received."""
    last, stable = None, 0
    while stable < 3:     # an FTP server may still be writing what a cut connection carried
        time.sleep(0.05)
        now = temporaries(srv)
        stable = stable + 1 if now == last else 0
        last = now
    return sum(size for n, size in last.items() if n.startswith(name + "."))


class Boom(Exception):
    pass


def fail_after(nbytes, exc=Boom):
    def progress(done):
        if done >= nbytes:
            raise exc("injected failure")
    return progress


# ---- every backend -------------------------------------------------------------------------------

def test_round_trip(server, big, tmp_path):
    data = content(big)
    small = tmp_path / "small"
    small.write_bytes(data[:100_000])
    with server.backend() as b:
        assert b.list() == {}
        seen = []
        b.put("arenas/00000000.arena", big, token="a", progress=seen.append)
        assert seen[-1] == len(data) and seen == sorted(seen)
        b.put("arenas/00000001.arena", str(small), token="b")
        b.put("a/b/c/part", big, offset=3 * MiB + 5, length=9 * MiB, token="c")
        b.put("empty", str(small), offset=7, length=0)
        assert b.list() == {"arenas/00000000.arena": len(data), "arenas/00000001.arena": 100_000,
                            "a/b/c/part": 9 * MiB, "empty": 0}
        assert b.list("arenas/") == {"arenas/00000000.arena": len(data), "arenas/00000001.arena": 100_000}
        assert b.list("arenas/00000001") == {"arenas/00000001.arena": 100_000}
        assert b.list("a/b") == {"a/b/c/part": 9 * MiB}
        assert b.list("nothing/") == {}
        assert b.size("arenas/00000000.arena") == len(data)
        assert b.size("arenas/nothing") is None

        assert b.get("arenas/00000000.arena") == data
        assert b.get("arenas/00000001.arena") == data[:100_000]
        assert b.get("a/b/c/part") == data[3 * MiB + 5:12 * MiB + 5]
        assert b.get("empty") == b""
        assert b.get("arenas/00000000.arena", 12345, 3 * MiB) == data[12345:12345 + 3 * MiB]
        assert b.get("arenas/00000000.arena", 19 * MiB) == data[19 * MiB:]
        assert b.get("arenas/00000000.arena", len(data) - 10, 100) == data[-10:]
        assert b.get("arenas/00000000.arena", len(data) + 10, 100) == b""
        assert b.get("arenas/00000000.arena", 5, 0) == b""
        got = []
        b.get_file("arenas/00000000.arena", str(tmp_path / "down"), progress=got.append)
        assert content(tmp_path / "down") == data and got[-1] == len(data)
        assert not (tmp_path / "down.tmp").exists()
        assert server.read("arenas/00000001.arena") == data[:100_000]    # as the server holds it

        with pytest.raises(RemoteMissing, match="has no object arenas/gone"):
            b.get("arenas/gone")
        with pytest.raises(RemoteMissing):
            b.get_file("arenas/gone", str(tmp_path / "gone"))
        assert not os.path.exists(tmp_path / "gone.tmp")

        b.delete("arenas/00000001.arena")
        b.delete("arenas/00000001.arena")     # absent is fine
        assert b.size("arenas/00000001.arena") is None
        assert set(b.list()) == {"arenas/00000000.arena", "a/b/c/part", "empty"}
        if server.kind in ("ftp", "ftps"):    # servers without MLSD: LIST is parsed
            b.inner.mlsd = False
            assert set(b.list()) == {"arenas/00000000.arena", "a/b/c/part", "empty"}
        assert b.sent >= len(data) + 9 * MiB + 100_000
        assert b.received >= 2 * len(data)


def test_interrupted_put_leaves_nothing_and_resumes(server, big):
    """A put cut after 8 MiB: no object, no temporary listed; the same token then resumes byte-exact."""
    data = content(big)
    with server.backend() as b:
        b.put("arenas/00000003.arena", big, length=MiB, token="old")
        with pytest.raises(Boom):
            b.put("arenas/00000003.arena", big, token="t1", progress=fail_after(8 * MiB))
        assert b.get("arenas/00000003.arena") == data[:MiB]       # the old object, untouched
        with pytest.raises(Boom):
            b.put("arenas/00000004.arena", big, token="t1", progress=fail_after(8 * MiB))
        assert b.size("arenas/00000004.arena") is None
        assert set(b.list()) == {"arenas/00000003.arena"}
        assert len(temporaries(server)) == 2                      # what the server keeps for the resume

        for name in ("arenas/00000003.arena", "arenas/00000004.arena"):
            have = kept(server, name)
            assert have >= 8 * MiB
            before, seen = b.sent, []
            b.put(name, big, token="t1", progress=seen.append)
            assert b.sent - before == len(data) - have, "the put did not continue where it was cut"
            assert seen[-1] == len(data)
            assert b.get(name) == data
        assert temporaries(server) == {}
        assert b.list() == {"arenas/00000003.arena": len(data), "arenas/00000004.arena": len(data)}


def test_killed_upload_resumes(server, big, tmp_path):
    """kill -9 of the uploading process midway; the next put of the same (name, token) continues."""
    data = content(big)
    child = r"""
import json, sys
from foundation.replica.config import spec_from_url
from foundation.replica import open_backend
url, options, big = json.loads(sys.argv[1])
b = open_backend(spec_from_url(url, bandwidth=8 << 20, **options))
b.put("arenas/00000007.arena", big, token="k", progress=lambda n: print(n, flush=True))
print("done", flush=True)
"""
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    p = subprocess.Popen([sys.executable, "-c", child, json.dumps([server.url, server.options, big])],
                         stdout=subprocess.PIPE, env=env, text=True)
    try:
        for line in p.stdout:
            assert line != "done\n", "the upload finished before it could be killed"
            if int(line) >= 8 * MiB:
                break
        p.kill()
    finally:
        p.kill()
        p.wait()
    have = kept(server, "arenas/00000007.arena")
    assert have > 0
    with server.backend() as b:
        assert b.list() == {}
        before = b.sent
        b.put("arenas/00000007.arena", big, token="k")
        assert b.sent - before == len(data) - have
        assert b.get("arenas/00000007.arena") == data


def test_transient_failure_is_retried_and_resumes(server, big):
    calls = []

    def flaky(done):
        if done >= 8 * MiB and not calls:
            calls.append(done)
            raise Transient(server.url, "injected drop")
    with server.backend() as b:
        b.put("x", big, token="t", progress=flaky)
        assert b.retries == 1
        assert b.sent <= len(content(big)) + 4 * MiB
        assert b.get("x") == content(big)


def test_replace_is_whole(server, big, tmp_path):
    other = tmp_path / "other"
    other.write_bytes(b"new bytes" * 1000)
    with server.backend() as b:
        b.put("arenas/00000002.arena", big, token="1")
        b.put("arenas/00000002.arena", str(other), token="2")
        assert b.get("arenas/00000002.arena") == other.read_bytes()
        b.put("arenas/00000002.arena", big, token="3")
        assert b.get("arenas/00000002.arena") == content(big)
        assert b.list() == {"arenas/00000002.arena": 20 * MiB}
        assert temporaries(server) == {}


def test_cleanup_removes_unfinished_uploads(server, big):
    with server.backend() as b:
        with pytest.raises(Boom):
            b.put("arenas/00000005.arena", big, token="t", progress=fail_after(8 * MiB))
        assert kept(server, "arenas/00000005.arena")
        assert b.cleanup("arenas/00000005.arena") == 1
        assert temporaries(server) == {} and b.list() == {}


def test_bandwidth_limit(server, tmp_path):
    src = tmp_path / "src"
    src.write_bytes(os.urandom(600_000))
    with server.backend(bandwidth="1M") as b:
        t = time.monotonic()
        b.put("slow", str(src), token="t")
        put_time = time.monotonic() - t
        t = time.monotonic()
        assert b.get("slow") == src.read_bytes()
        get_time = time.monotonic() - t
        assert b.limiter.total >= 1_200_000
    # 600 kB at 1 MiB/s with a 0.1 s burst: at least 0.47 s each way
    assert put_time >= 0.4 and get_time >= 0.4, (put_time, get_time)
    assert put_time < 5 and get_time < 5


def test_limiter_accounting():
    lim = Limiter(1 << 20)
    t = time.monotonic()
    for _ in range(30):
        lim.take(20_000)
    elapsed = time.monotonic() - t
    assert lim.total == 600_000
    assert 0.4 <= elapsed < 1.5 and abs(lim.slept - elapsed) < 0.2
    assert lim.chunk(1 << 20) == (1 << 20) // 10


def test_limiter_shared_by_threads():
    """Four threads through one limit: every byte is counted, and together they keep to the rate."""
    import threading
    lim = Limiter(1 << 20)
    t = time.monotonic()
    threads = [threading.Thread(target=lambda: [lim.take(10_000) for _ in range(30)]) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    elapsed = time.monotonic() - t
    assert lim.total == 1_200_000
    # 1.2 MB at 1 MiB/s, less the 0.1 s burst: not before about 1.04 s (a sleep never ends early)
    assert elapsed >= (1_200_000 - lim.burst) / lim.rate - 0.01, elapsed


def s3_calls(backend):
    """[(operation, "start"|"end")] of the S3 requests `backend` (Retrying(S3Backend)) makes from now on."""
    import threading
    events, lock = [], threading.Lock()
    client = backend.inner._client()

    def hook(what):
        def record(model, **_):
            with lock:
                events.append((model.name, what))
        return record
    client.meta.events.register("before-call.s3", hook("start"))
    client.meta.events.register("after-call.s3", hook("end"))
    return events


def most_at_once(events, op):
    now = top = 0
    for name, what in events:
        if name == op:
            now += 1 if what == "start" else -1
            top = max(top, now)
    return top


def test_s3_one_put_then_parallel_parts(s3_server, big, tmp_path):
    srv = s3_server.sub("shapes")
    opts = {k: v for k, v in srv.options.items() if k != "multipart_threshold"}
    srv.options = opts
    with srv.backend() as b:                          # the defaults: 64 MiB in one PUT, 4 at a time
        assert b.concurrent == 4
        calls = s3_calls(b)
        b.put("one", big)
        assert [c for c in calls if c[1] == "start"] == [("PutObject", "start")]
    with srv.backend(multipart_threshold="8M", parallel=3) as b:
        calls = s3_calls(b)
        b.put("parts", big, token="t")
        started = [n for n, what in calls if what == "start"]
        assert started[:2] == ["ListMultipartUploads", "CreateMultipartUpload"]   # (nothing to resume)
        assert started[-1] == "CompleteMultipartUpload"
        assert started.count("UploadPart") == 3
        assert most_at_once(calls, "UploadPart") >= 2, calls
        assert b.get("parts") == b.get("one") == content(big)
    assert temporaries(srv) == {}


def test_s3_damaged_body_refused_and_sent_again(s3_server, tmp_path):
    """Bytes damaged on the way fail the body's check at the server (over plain http its signed SHA-256,
    not a Content-MD5 as well), and the whole object goes again; no request waits for `100 Continue`."""
    data = os.urandom(3 * MiB)
    (tmp_path / "x").write_bytes(data)
    with s3_server.sub("damaged").backend() as b:
        sent = []

        def damage(request, **_):
            sent.append(dict(request.headers))
            if len(sent) == 1:
                body = bytearray(request.body.read() if hasattr(request.body, "read") else request.body)
                body[12345] ^= 1
                request.body = bytes(body)
        b.inner._client().meta.events.register("before-send.s3.PutObject", damage)
        b.put("x", str(tmp_path / "x"))
        assert b.retries == 1 and b.get("x") == data
    assert [(h.get("Expect"), h.get("Content-MD5"), len(h["X-Amz-Content-SHA256"])) for h in sent] == \
        [(None, None, 64)] * 2


def test_s3_missing_bucket_named(s3_server):
    from foundation.replica import open_backend
    with pytest.raises(Permanent, match="bucket no-such-bucket does not exist at http://127.0.0.1:.*: create it"):
        open_backend(spec_from_url("s3://no-such-bucket/p", **s3_server.options)).list()


def test_s3_paced_parts_keep_the_limit(s3_server, big):
    """Parts in flight at once under one bandwidth limit: each byte is paced once, however botocore reads."""
    srv = s3_server.sub("paced")
    with srv.backend(bandwidth="16M", parallel=4) as b:
        t = time.monotonic()
        b.put("x", big, token="t")
        elapsed = time.monotonic() - t
        assert b.limiter.total == 20 * MiB
        assert b.get("x") == content(big)
    assert elapsed >= (20 * MiB - 1.6 * MiB) / (16 * MiB), elapsed


# ---- failures ------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["ftp", "ftps", "s3"])
def test_wrong_credentials(request, kind, tmp_path):
    srv = request.getfixturevalue(f"{kind}_server")
    src = tmp_path / "f"
    src.write_bytes(b"x")
    bad = {"secret_key": "wrong-" + S3_SECRET} if kind == "s3" else {"password": "wrong-" + PASSWORD}
    with srv.backend(**bad) as b:
        with pytest.raises(AuthFailed) as e:
            b.put("x", str(src))
    msg = str(e.value)
    assert srv.url in msg and "refused the credentials" in msg and "[replicas.NAME]" in msg
    assert "wrong-" not in msg and e.value.code == 44
    assert b.retries == 0


@pytest.mark.parametrize("kind", ["ftp", "ftps", "s3"])
def test_unreachable(request, kind):
    srv = request.getfixturevalue(f"{kind}_server")
    port = free_port()
    if kind == "s3":
        spec = spec_from_url(srv.url, **dict(srv.options, endpoint=f"http://127.0.0.1:{port}"))
    else:
        spec = spec_from_url(f"{kind}://{srv.url.split('@')[0].split('//')[1]}@127.0.0.1:{port}/x", **srv.options)
    from foundation.replica import open_backend
    b = open_backend(spec, attempts=3, backoff=0.01)
    t = time.monotonic()
    with pytest.raises(Unreachable) as e:
        b.list()
    # S3: botocore also tries each request 3 times, with its own backoff of up to 2 + 4 s
    assert time.monotonic() - t < (25 if kind == "s3" else 5)
    assert b.retries == 2 and f"127.0.0.1:{port}" in str(e.value) and "3 attempts" in str(e.value)
    assert PASSWORD not in str(e.value)


def test_local_directory_missing(tmp_path):
    from foundation.replica import open_backend
    b = open_backend(spec_from_url(f"file://{tmp_path}/not-mounted"))
    with pytest.raises(Permanent, match="does not exist: mount the share"):
        b.list()
    assert b.retries == 0 and not (tmp_path / "not-mounted").exists()


def test_each_scheme_opens_with_the_backend_that_registered_it(tmp_path, monkeypatch):
    from foundation.replica import ftp, local, open_backend, registry, s3

    assert registry.registered() == {"file": local.LocalBackend, "ftp": ftp.FTPBackend, "ftps": ftp.FTPBackend,
                                   "s3": s3.S3Backend}
    b = open_backend(spec_from_url(f"file://{tmp_path}"))
    assert type(b.inner) is local.LocalBackend
    with pytest.raises(ValueError, match="replica scheme ftp:// already opens with FTPBackend; Clash cannot"):
        class Clash(local.LocalBackend):
            pass
        registry.register(Clash, "sftp", "ftp")
    assert "sftp" not in registry.registered()              # refused whole
    monkeypatch.setattr(registry, "_factories", {"s3": s3.S3Backend})     # a scheme nobody registered
    with pytest.raises(BadReplicaURL, match=r"unknown scheme 'file' \(known: s3\)"):
        open_backend(spec_from_url(f"file://{tmp_path}"))


@pytest.mark.parametrize("tls", [False, True])
def test_full_ftp_server(tmp_path, tls, big):
    srv = start_ftpd(str(tmp_path), tls=tls, quota=MiB)
    try:
        with srv.backend() as b:
            with pytest.raises(RemoteFull) as e:        # cut in the middle of the upload
                b.put("arenas/00000000.arena", big, token="a")
            assert "is full" in str(e.value) and "Free space on the server" in str(e.value)
            assert b.retries == 0
            with pytest.raises(RemoteFull, match="552"):
                b.put("arenas/00000001.arena", big, length=MiB, token="b")
            assert b.list() == {}
    finally:
        srv.stop()


def test_ftp_server_whose_disk_fills(tmp_path, big):
    """pyftpdlib on a tmpfs that fills: it only answers "426 None; transfer aborted", so the message hints at it."""
    with small_disk(tmp_path / "disk", "30m") as disk:
        srv = start_ftpd(str(disk))
        try:
            with srv.backend() as b:
                b.put("arenas/00000000.arena", big, token="a")
                with pytest.raises(Unreachable, match="its disk or your quota may be full"):
                    b.put("arenas/00000001.arena", big, token="b")
                assert b.list() == {"arenas/00000000.arena": 20 * MiB}
                assert b.get("arenas/00000000.arena") == content(big)
        finally:
            srv.stop()


def test_s3_bucket_encrypted_with_kms(tmp_path, big, monkeypatch):
    """SSE-KMS: the server answers ETags that are no MD5; a multipart put must still go through."""
    import base64

    from servers import NotAvailable, start_minio
    monkeypatch.setenv("MINIO_KMS_SECRET_KEY", "foundation-test:" + base64.b64encode(b"k" * 32).decode())
    try:
        srv = start_minio(str(tmp_path))
    except NotAvailable as e:
        pytest.skip(str(e))
    try:
        srv.client.put_bucket_encryption(Bucket=srv.bucket, ServerSideEncryptionConfiguration={"Rules": [
            {"ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": "aws:kms", "KMSMasterKeyID": "foundation-test"}}]})
        with srv.backend(multipart_threshold="8M") as b:
            b.put("arenas/00000000.arena", big, token="t")       # three parts
            assert b.get("arenas/00000000.arena") == content(big)
            head = srv.client.head_object(Bucket=srv.bucket, Key="arenas/00000000.arena")
            assert head["ServerSideEncryption"] == "aws:kms"
    finally:
        srv.stop()


def test_ftps_certificate_checked(ftps_server, caplog):
    options = dict(ftps_server.options)
    del options["ca_file"]
    from foundation.replica import open_backend
    with pytest.raises(Permanent, match="certificate is not trusted.*ca_file"):
        open_backend(spec_from_url(ftps_server.url, **options)).list()
    b = open_backend(spec_from_url(ftps_server.url, insecure=True, **options))
    assert "not checked" in caplog.text
    assert isinstance(b.list(), dict)


def test_error_mapping_s3(s3_server):
    from botocore.exceptions import ClientError, EndpointConnectionError

    b = s3_server.backend().inner

    def raised(code, status, message="m"):
        with pytest.raises(Exception) as e:
            with b._errors("uploading x"):
                raise ClientError({"Error": {"Code": code, "Message": message},
                                   "ResponseMetadata": {"HTTPStatusCode": status}}, "PutObject")
        return type(e.value)
    assert raised("XMinioStorageFull", 507) is RemoteFull
    assert raised("EntityTooLarge", 400) is RemoteFull
    assert raised("SlowDown", 503) is Transient
    assert raised("InternalError", 500) is Transient
    assert raised("InternalError", 500, "We encountered an internal error: cause(no space left on device)") \
        is RemoteFull                                     # what a MinIO whose disk filled says
    assert raised("IncompleteBody", 400) is Transient
    assert raised("RequestTimeTooSkewed", 403) is Permanent       # not the keys: the clock
    assert raised("InvalidAccessKeyId", 403) is AuthFailed
    assert raised("SignatureDoesNotMatch", 403) is AuthFailed
    assert raised("InvalidArgument", 400) is Permanent
    with pytest.raises(Transient):
        with b._errors("x"):
            raise EndpointConnectionError(endpoint_url="http://x")


def test_error_mapping_ftp(ftp_server):
    b = ftp_server.backend().inner

    class Dummy:
        def close(self):
            pass
    for exc, cls in [(ftplib.error_temp("421 Too many connections"), Transient),
                     (ftplib.error_temp("451 Local error"), Transient),
                     (ftplib.error_temp("452 Insufficient storage"), RemoteFull),
                     (ftplib.error_perm("552 Quota exceeded"), RemoteFull),
                     (ftplib.error_perm("530 Login incorrect"), AuthFailed),
                     (ftplib.error_perm("553 Not allowed"), Permanent),
                     (ConnectionResetError(104, "Connection reset by peer"), Transient),
                     (TimeoutError(), Transient), (EOFError(), Transient)]:
        b.ftp = Dummy()
        with pytest.raises(cls):
            with b._session("uploading x"):
                raise exc


def test_names_checked(local_server, tmp_path):
    for bad in ("", "/abs", "a//b", "../up", "a/./b", "a/", "x.tmp-1"):
        with pytest.raises(ValueError):
            check_name(bad)
    (tmp_path / "f").write_bytes(b"abc")
    with local_server.backend() as b:
        with pytest.raises(ValueError):
            b.put("ok", str(tmp_path / "f"), token="no/slash")
        with pytest.raises(ValueError):
            b.put("ok", str(tmp_path / "f"), offset=2, length=5)


def test_retrying_backoff():
    waits = []

    class Flaky:
        url = "ftp://h/"

        def list(self, prefix=""):
            raise Transient(self.url, "connection reset")
    r = Retrying(Flaky(), attempts=6, backoff=0.5, max_backoff=3, sleep=waits.append)
    with pytest.raises(Unreachable, match="connection reset"):
        r.list()
    # doubling up to max_backoff, each wait jittered down to half of it
    assert len(waits) == 5
    assert all(w / 2 <= got <= w for got, w in zip(waits, [0.5, 1, 2, 3, 3])), waits
    assert len({round(got / w, 9) for got, w in zip(waits, [0.5, 1, 2, 3, 3])}) > 1, "no jitter"


# ---- configuration -------------------------------------------------------------------------------

def conf(tables, path="/etc/foundation/foundation.toml"):
    return Config(path=path, sections={"replicas": tables})


def test_config_tables(tmp_path, monkeypatch):
    for var in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_DEFAULT_REGION",
                "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "FOUNDATION_FTP_PASSWORD"):
        monkeypatch.delenv(var, raising=False)
    (tmp_path / "ca.pem").write_text("x")
    specs = replicas_from_config(conf({
        "offsite": {"url": "s3://my-bucket/some/prefix/", "endpoint": "http://127.0.0.1:9000",
                    "access_key": "AK", "secret_key": "SECRET", "bandwidth": "2M"},
        "hosting": {"url": "ftps://user@ftp.example.com:2121/backups/foundation", "password": "PW",
                    "ca_file": "ca.pem", "timeout": 5},
        "nas": {"url": "file:///mnt/nas/foundation/", "allow_plaintext": True},
        "plain": {"url": "ftp://me:URLPW@example.org/"},
    }, path=str(tmp_path / "foundation.toml")))
    s3, ftps, nas, ftp = specs
    assert (s3.name, s3.scheme, s3.bucket, s3.path, s3.endpoint, s3.region, s3.access_key, s3.secret_key,
            s3.bandwidth) == ("offsite", "s3", "my-bucket", "some/prefix", "http://127.0.0.1:9000", "us-east-1",
                              "AK", "SECRET", 2 * MiB)
    assert (ftps.host, ftps.port, ftps.user, ftps.password, ftps.path, ftps.ca_file, ftps.timeout) == (
        "ftp.example.com", 2121, "user", "PW", "/backups/foundation", str(tmp_path / "ca.pem"), 5.0)
    assert (nas.scheme, nas.path, nas.allow_plaintext, s3.allow_plaintext) == ("file", "/mnt/nas/foundation", True, False)
    assert (ftp.user, ftp.password, ftp.port, ftp.path) == ("me", "URLPW", 21, "")
    assert ftp.url == "ftp://me@example.org/" and "URLPW" not in repr(ftp)
    assert "SECRET" not in repr(s3)


@pytest.mark.parametrize("table, error", [
    ({"url": "ftp://h/", "pasword": "x"}, r"\[replicas.r\] unknown setting 'pasword'"),
    ({"url": "ftp://h/", "ca_file": "/x"}, "unknown setting 'ca_file' for a ftp://"),
    ({"url": "s3://bucket/p", "password": "x"}, "unknown setting 'password' for a s3://"),
    ({"url": "ftps://h/", "insecure": "yes"}, "insecure must be true or false"),
    ({"url": "ftp://h/", "timeout": -1}, "timeout must be a positive number"),
    ({"url": "ftp://h/", "bandwidth": "fast"}, "bandwidth must be bytes per second"),
    ({"url": "s3://bucket/p", "parallel": 0}, "parallel must be a number of transfers from 1 to 64"),
    ({"url": "s3://bucket/p", "parallel": "4"}, "parallel must be a number"),
    ({"url": "s3://bucket/p", "multipart_threshold": "1M"}, "multipart_threshold must be at least 5M"),
    ({"url": "ftp://h/", "parallel": 4}, "unknown setting 'parallel' for a ftp:// replica"),
    ({"endpoint": "http://x"}, r"\[replicas.r\] has no url"),
    ({"url": "sftp://h/x"}, "url must start with ftp://, ftps://, s3:// or file:///"),
    ({"url": "ftp:///x"}, "url has no host name"),
    ({"url": "s3://Bad_Bucket/x"}, "not a valid bucket name"),
    ({"url": "s3://key:secret@bucket/x"}, "give the endpoint and keys as settings"),
    ({"url": "s3://bucket/x", "access_key": "AK"}, "give both access_key and secret_key"),
    ({"url": "s3://bucket/x", "endpoint": "127.0.0.1:9000"}, "endpoint must be an http"),
    ({"url": "file://relative/dir"}, "three slashes"),
    ({"url": "ftp://h/x?passive=0"}, "must not have a query"),
    ({"url": "ftps://h/", "ca_file": "/no/such/ca.pem"}, "ca_file /no/such/ca.pem does not exist"),
    ({"url": "ftp://h:99999/"}, "not a valid URL"),
])
def test_config_errors(table, error, monkeypatch):
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY", raising=False)
    with pytest.raises(ConfigError, match=error) as e:
        replicas_from_config(conf({"r": table}))
    assert "/etc/foundation/foundation.toml" in str(e.value)
    with pytest.raises(ConfigError, match="must be tables"):
        replicas_from_config(conf("s3://x"))


def test_url_errors():
    with pytest.raises(BadReplicaURL, match="unknown setting 'endpont'") as e:
        spec_from_url("s3://bucket/p", endpont="http://x")
    assert e.value.code == 47 and str(e.value).startswith("Replica s3://bucket/p:")
    with pytest.raises(BadReplicaURL) as e:
        spec_from_url("ftp://u:hunter2@h:2121/x", insecure=True)
    assert "hunter2" not in str(e.value) and "ftp://u@h:2121/x" in str(e.value)
    for typo in ("ftps//alice:hunter2@host/dir", "ftps:/alice:hunter2@host/dir", "ftp//bob:hunt/er2@host/dir",
                 "ftp://bob:hunter2/x@host/dir"):                  # mistyped: still no password, even with a /
        with pytest.raises(BadReplicaURL) as e:
            spec_from_url(typo)
        assert "hunt" not in str(e.value), str(e.value)


def test_credentials_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://minio:9000")
    monkeypatch.setenv("AWS_REGION", "eu-west-3")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "ENVAK")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "ENVSECRET")
    s = spec_from_url("s3://bucket")
    assert (s.endpoint, s.region, s.access_key, s.secret_key, s.path) == (
        "http://minio:9000", "eu-west-3", "ENVAK", "ENVSECRET", "")
    assert spec_from_url("s3://bucket", region="us-west-2", access_key="A", secret_key="S").access_key == "A"

    monkeypatch.setenv("FOUNDATION_FTP_PASSWORD", "envpw")
    assert spec_from_url("ftp://u@h/").password == "envpw"
    monkeypatch.delenv("FOUNDATION_FTP_PASSWORD")
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".netrc").write_text("machine h login netuser password netpw\n")
    (tmp_path / ".netrc").chmod(0o600)
    s = spec_from_url("ftp://h/")
    assert (s.user, s.password) == ("netuser", "netpw")
    s = spec_from_url("ftp://other@h/")
    assert (s.user, s.password) == ("other", "")
    s = spec_from_url("ftp://nowhere/")
    assert (s.user, s.password) == ("anonymous", "anonymous@")


def test_bandwidth_and_find():
    assert parse_bandwidth("2M") == 2 * MiB
    assert parse_bandwidth("500K") == 500 * 1024
    assert parse_bandwidth("1.5 MiB/s") == int(1.5 * MiB)
    assert parse_bandwidth(1000) == 1000
    assert parse_bandwidth("1G") == 1 << 30
    assert parse_bandwidth("0") is None
    assert parse_bandwidth("") is None
    for bad in ("fast", "1.5", "-2M", "2 M/s/s", True):
        with pytest.raises(ValueError, match="not a size"):
            parse_bandwidth(bad)
    c = conf({"nas": {"url": "file:///mnt/nas"}})
    assert find_replica(c, "nas").path == "/mnt/nas"
    assert find_replica(c, "ftp://h/x").host == "h"
    with pytest.raises(BadReplicaURL, match=r"no replica of that name .*configured: nas"):
        find_replica(c, "offsite")
