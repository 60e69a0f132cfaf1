"""Real replica servers on loopback for the tests: FTP, FTPS (tests/ftpd.py), vsftpd (FTPS) and S3 (MinIO).

Session fixtures `ftp_server`, `ftps_server`, `vsftpd_server`, `s3_server`
start one each as a subprocess on free ports; `local_server` is a
directory (file://). vsftpd is the Debian package with its defaults
(notably require_ssl_reuse=YES: every data connection must resume the
control connection's TLS session) and TLS forced on both channels.
Each yields a Server: `.url` and `.options` (what a [replicas.NAME] table
would hold), `.sub(name)` for a fresh replica inside it, `.backend()`, and
direct access to what the server stores (`stored()`, `read`, `write`,
`remove`) so tests can drop, corrupt or inspect objects behind the
backend's back. A fixture skips only when its server program cannot be
found (`scripts/servers.sh install` installs them).

    python tests/servers.py start DIR   # all four in DIR, detached; prints a config file using them
    python tests/servers.py stop DIR
"""

import contextlib
import datetime
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
USER, PASSWORD = "foundation", "test-password"
S3_USER, S3_SECRET = "foundation", "test-secret-key"
BUCKET = "foundation-test"
CACHE = os.environ.get("FOUNDATION_CACHE", "/var/cache/foundation")


class NotAvailable(Exception):
    """The server program is not installed."""


class Server:
    """A running (or, for file://, a local) replica server and a way at what it stores."""

    def __init__(self, kind, url, options, root=None, client=None, prefix="", procs=(), owner=None):
        self.kind, self.url, self.options = kind, url, dict(options)
        self.owner = owner        # (uid, gid) the server writes as: what tests write behind it gets it too
        self.root = root          # file/ftp/ftps: the directory on disk the URL's path is in
        self.client = client      # s3: a boto3 client with the root credentials
        self.bucket = BUCKET if kind == "s3" else None
        self.prefix = prefix      # s3: the key prefix; ftp: the path below the served directory
        self.procs = list(procs)

    def sub(self, name):
        """A fresh replica in a subdirectory (or under a key prefix) of this one."""
        srv = Server(self.kind, f"{self.url.rstrip('/')}/{name}", self.options, self.root, self.client,
                     f"{self.prefix}/{name}".lstrip("/"), owner=self.owner)
        if self.kind == "file":      # a file:// replica must exist (it stands for a mounted share)
            os.makedirs(srv._file(""), exist_ok=True)
        return srv

    def spec(self, **options):
        from foundation.replica.config import spec_from_url
        return spec_from_url(self.url, **{**self.options, **options})

    def backend(self, attempts=3, backoff=0.05, **options):
        from foundation.replica import open_backend
        return open_backend(self.spec(**options), attempts=attempts, backoff=backoff)

    # what the server holds, bypassing the backend

    def _file(self, name):
        return os.path.join(self.root, *self.prefix.split("/"), *name.split("/"))

    def _key(self, name):
        return f"{self.prefix}/{name}" if self.prefix else name

    def stored(self):
        """{name: size} of everything stored, temporaries too; an unfinished S3 upload is "NAME.multipart"."""
        if self.kind == "s3":
            top, out = self._key(""), {}
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=top):
                out.update((o["Key"][len(top):], o["Size"]) for o in page.get("Contents", []))
            for page in self.client.get_paginator("list_multipart_uploads").paginate(Bucket=BUCKET):
                for u in page.get("Uploads", []):   # (MinIO answers a Prefix only if it is a whole key)
                    if u["Key"].startswith(top):
                        out[u["Key"][len(top):] + ".multipart"] = sum(p["Size"] for p in self._parts(u))
            return out
        top, out = self._file(""), {}
        for d, _, fs in os.walk(top):
            for f in fs:
                try:        # a temporary renamed or removed while we walk was simply not there
                    out[os.path.relpath(os.path.join(d, f), top).replace(os.sep, "/")] = os.path.getsize(os.path.join(d, f))
                except FileNotFoundError:
                    pass
        return out

    def _parts(self, upload):
        """The parts up so far; none if the upload completed or was aborted since it was listed."""
        try:
            return self.client.list_parts(Bucket=BUCKET, Key=upload["Key"], UploadId=upload["UploadId"]).get("Parts", [])
        except self.client.exceptions.NoSuchUpload:
            return []

    def read(self, name):
        if self.kind == "s3":
            return self.client.get_object(Bucket=BUCKET, Key=self._key(name))["Body"].read()
        with open(self._file(name), "rb") as f:
            return f.read()

    def write(self, name, data):
        if self.kind == "s3":
            self.client.put_object(Bucket=BUCKET, Key=self._key(name), Body=data)
            return
        path = self._file(name)
        made = []
        d = os.path.dirname(path)
        while not os.path.isdir(d):
            made.append(d)
            d = os.path.dirname(d)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
        if self.owner:            # the server (a local user) must be able to replace and delete it
            for p in [path, *made]:
                os.chown(p, *self.owner)

    def remove(self, name):
        if self.kind == "s3":
            self.client.delete_object(Bucket=BUCKET, Key=self._key(name))
        else:
            os.unlink(self._file(name))

    def stop(self):
        for p in self.procs:
            stop_process(p)
        if self.owner and self.root:     # vsftpd's root is outside the test's tmp_path (see start_vsftpd)
            shutil.rmtree(os.path.dirname(self.root), ignore_errors=True)


# ---- starting servers ---------------------------------------------------------------------------

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_process(p):
    if p.poll() is None:
        p.terminate()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def make_cert(path):
    """A self-signed certificate and key for 127.0.0.1 and localhost, in one PEM file."""
    import ipaddress
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    with open(path, "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
        f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))
    return path


def start_ftpd(d, tls=False, quota=None, detach=False):
    """tests/ftpd.py serving d/root: a Server for ftp:// or ftps:// (the CA file is d/cert.pem)."""
    try:
        import pyftpdlib  # noqa: F401
        if tls:
            import OpenSSL  # noqa: F401
    except ImportError as e:
        raise NotAvailable(f"{e.name} is not installed (scripts/servers.sh install)") from None
    root = os.path.join(d, "root")
    os.makedirs(root, exist_ok=True)
    cmd = [sys.executable, os.path.join(HERE, "ftpd.py"), "--root", root, "--user", USER, "--password", PASSWORD,
           "--passive-ports", "50100-50299" if tls else "50300-50499"]
    options = {"password": PASSWORD, "timeout": 10}
    if tls:
        cmd += ["--tls", make_cert(os.path.join(d, "cert.pem"))]
        options["ca_file"] = os.path.join(d, "cert.pem")
    if quota is not None:
        cmd += ["--quota", str(quota)]
    with open(os.path.join(d, "ftpd.log"), "ab") as log:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, start_new_session=detach)
    line = b""
    if select.select([p.stdout], [], [], 15)[0]:
        line = p.stdout.readline()
    if not line.startswith(b"port "):
        stop_process(p)
        raise RuntimeError(f"tests/ftpd.py did not start; see {d}/ftpd.log")
    port = int(line.split()[1])
    scheme = "ftps" if tls else "ftp"
    return Server(scheme, f"{scheme}://{USER}@127.0.0.1:{port}/", options, root=root, procs=[p])


VSFTPD_USER = "foundation-ftp"
VSFTPD_PORTS = (50500, 50599)    # passive ports: apart from tests/ftpd.py's 50100-50499


def vsftpd_binary():
    for b in ("/usr/sbin/vsftpd", shutil.which("vsftpd")):
        if b and os.access(b, os.X_OK):
            return b
    raise NotAvailable("vsftpd is not installed (scripts/servers.sh install)")


def vsftpd_user():
    """(uid, gid) of the local user vsftpd logs the tests in as, made (with PASSWORD) if missing."""
    import pwd
    try:
        pw = pwd.getpwnam(VSFTPD_USER)
    except KeyError:
        if os.getuid() != 0:
            raise NotAvailable(f"making the local user {VSFTPD_USER} for vsftpd needs root") from None
        subprocess.run(["useradd", "--system", "--no-create-home", "--home-dir", "/",
                        "--shell", "/bin/sh", VSFTPD_USER], check=True)   # PAM wants a shell of /etc/shells
        pw = pwd.getpwnam(VSFTPD_USER)
    subprocess.run(["chpasswd"], input=f"{VSFTPD_USER}:{PASSWORD}".encode(), check=True)
    return pw.pw_uid, pw.pw_gid


def start_vsftpd(d, detach=False):
    """vsftpd serving a fresh directory as the local user VSFTPD_USER: a Server for ftps:// (CA file d/cert.pem).

    The served directory is made under /tmp (pytest's own directories are closed to other users)
    and removed by stop(); everything else (config, certificate, log) is in d.
    """
    binary = vsftpd_binary()
    if os.getuid() != 0:
        raise NotAvailable("vsftpd must be started as root")
    owner = vsftpd_user()
    top = tempfile.mkdtemp(prefix="foundation-vsftpd-")
    os.chmod(top, 0o755)
    root = os.path.join(top, "root")
    os.mkdir(root)
    os.chown(root, *owner)
    empty = os.path.join(d, "empty")                 # secure_chroot_dir: an empty directory root owns
    os.makedirs(empty, exist_ok=True)
    cert = make_cert(os.path.join(d, "cert.pem"))
    for _ in range(3):      # a free port may be taken between our look and vsftpd's bind
        port = free_port()
        conf = os.path.join(d, "vsftpd.conf")
        with open(conf, "w") as f:
            f.write("\n".join([
                "listen=YES", "listen_ipv6=NO", "listen_address=127.0.0.1", f"listen_port={port}",
                "background=NO", "anonymous_enable=NO", "local_enable=YES", "write_enable=YES",
                "local_umask=022", f"local_root={root}",
                "chroot_local_user=YES", "allow_writeable_chroot=YES",   # "/" is root, as at a hosting "pam_service_name=vsftpd", "seccomp_sandbox=NO",
                f"secure_chroot_dir={empty}", "connect_from_port_20=NO",
                "ssl_enable=YES", f"rsa_cert_file={cert}", f"rsa_private_key_file={cert}",
                "force_local_logins_ssl=YES", "force_local_data_ssl=YES", "ssl_ciphers=HIGH",
                f"pasv_min_port={VSFTPD_PORTS[0]}", f"pasv_max_port={VSFTPD_PORTS[1]}",
                "xferlog_enable=YES", f"vsftpd_log_file={d}/vsftpd.log", "dual_log_enable=NO",
                ""]))                                 # require_ssl_reuse: left at its default, YES
        with open(os.path.join(d, "vsftpd.out"), "ab") as log:
            p = subprocess.Popen([binary, conf], stdout=log, stderr=log, start_new_session=detach)
        deadline = time.monotonic() + 10
        while p.poll() is None and time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                    if s.recv(3) == b"220":
                        break
            except OSError:
                time.sleep(0.05)
        else:
            stop_process(p)
            continue
        options = {"password": PASSWORD, "timeout": 10, "ca_file": cert}
        return Server("ftps", f"ftps://{VSFTPD_USER}@127.0.0.1:{port}/", options, root=root, procs=[p],
                      owner=owner)
    shutil.rmtree(top, ignore_errors=True)
    raise RuntimeError(f"vsftpd did not start; see {d}/vsftpd.out")


@contextlib.contextmanager
def small_disk(path, size):
    """A tmpfs of `size` (e.g. "40m") mounted at the new directory `path`: a disk that really fills
    (root only; the test is skipped otherwise). Unmounted at the end."""
    os.makedirs(path)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)]).returncode != 0:
        pytest.skip("cannot mount a tmpfs (needs root)")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)])


def minio_binary():
    for b in (os.environ.get("MINIO_BIN"), os.path.join(CACHE, "bin", "minio"), shutil.which("minio")):
        if b and os.access(b, os.X_OK):
            return b
    raise NotAvailable(f"no MinIO binary (MINIO_BIN, {CACHE}/bin/minio or minio on PATH): "
                       "run scripts/servers.sh install")


def start_minio(d, detach=False):
    """MinIO serving d/data, with the bucket BUCKET made: a Server for s3://BUCKET/."""
    import boto3
    from botocore.config import Config
    binary = minio_binary()
    data = os.path.join(d, "data")
    os.makedirs(data, exist_ok=True)
    env = dict(os.environ, MINIO_ROOT_USER=S3_USER, MINIO_ROOT_PASSWORD=S3_SECRET, MINIO_BROWSER="off",
               MINIO_UPDATE="off", MINIO_CI_CD="1")
    for _ in range(3):     # a free port may be taken between our look and MinIO's bind
        port = free_port()
        with open(os.path.join(d, "minio.log"), "ab") as log:
            p = subprocess.Popen([binary, "server", "--quiet", "--address", f"127.0.0.1:{port}",
                                  "--console-address", f"127.0.0.1:{free_port()}", data],
                                 env=env, stdout=log, stderr=log, start_new_session=detach)
        endpoint = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while p.poll() is None and time.monotonic() < deadline:
            try:
                urllib.request.urlopen(endpoint + "/minio/health/live", timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        else:
            stop_process(p)
            continue
        client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id=S3_USER,
                              aws_secret_access_key=S3_SECRET, config=Config(s3={"addressing_style": "path"}))
        _make_bucket(client, deadline)
        options = {"endpoint": endpoint, "region": "us-east-1", "access_key": S3_USER, "secret_key": S3_SECRET,
                   "timeout": 10}
        return Server("s3", f"s3://{BUCKET}/", options, client=client, procs=[p])
    raise RuntimeError(f"MinIO did not start; see {d}/minio.log")


def _make_bucket(client, deadline):
    """Make BUCKET once MinIO serves requests: "live" answers before its start is done (with a KMS
    key to set up, CreateBucket was refused as XMinioServerNotInitialized for a while)."""
    from botocore.exceptions import ClientError
    while True:
        try:
            return client.create_bucket(Bucket=BUCKET)
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") != "XMinioServerNotInitialized" or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _fixture(request, tmp_path_factory, start, *args, **kw):
    try:
        srv = start(str(tmp_path_factory.mktemp(request.fixturename)), *args, **kw)
    except NotAvailable as e:
        pytest.skip(str(e))
    request.addfinalizer(srv.stop)
    return srv


@pytest.fixture(scope="session")
def ftp_server(request, tmp_path_factory):
    return _fixture(request, tmp_path_factory, start_ftpd)


@pytest.fixture(scope="session")
def ftps_server(request, tmp_path_factory):
    return _fixture(request, tmp_path_factory, start_ftpd, tls=True)


@pytest.fixture(scope="session")
def vsftpd_server(request, tmp_path_factory):
    return _fixture(request, tmp_path_factory, start_vsftpd)


@pytest.fixture(scope="session")
def s3_server(request, tmp_path_factory):
    srv = _fixture(request, tmp_path_factory, start_minio)
    srv.options["multipart_threshold"] = "8M"   # the tests' 16-20 MiB objects go up in parts (resumable)
    return srv


@pytest.fixture
def local_server(tmp_path):
    root = tmp_path / "replica-root"
    root.mkdir()
    return Server("file", f"file://{root}/", {}, root=str(root))


# ---- python tests/servers.py start|stop DIR ------------------------------------------------------

def main(argv):
    if len(argv) != 3 or argv[1] not in ("start", "stop"):
        sys.exit("usage: servers.py start|stop DIR")
    d = os.path.abspath(argv[2])
    pids = os.path.join(d, "pids.json")
    if argv[1] == "stop":
        with open(pids) as f:
            for pid in json.load(f):
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        os.unlink(pids)
        with contextlib.suppress(FileNotFoundError):      # vsftpd's served directory, outside DIR
            with open(os.path.join(d, "dirs.json")) as f:
                for top in json.load(f):
                    shutil.rmtree(top, ignore_errors=True)
            os.unlink(os.path.join(d, "dirs.json"))
        return
    servers = {}
    for name, start, kw in (("ftp", start_ftpd, {}), ("ftps", start_ftpd, {"tls": True}),
                            ("vsftpd", start_vsftpd, {}), ("s3", start_minio, {})):
        os.makedirs(os.path.join(d, name), exist_ok=True)
        servers[name] = start(os.path.join(d, name), detach=True, **kw)
    with open(pids, "w") as f:
        json.dump([p.pid for s in servers.values() for p in s.procs], f)
    with open(os.path.join(d, "dirs.json"), "w") as f:
        json.dump([os.path.dirname(s.root) for s in servers.values() if s.owner], f)
    conf = []
    for name, s in servers.items():
        conf.append(f"[replicas.{name}]\nurl = {json.dumps(s.url + 'foundation')}")
        conf += [f"{k} = {json.dumps(v)}" for k, v in s.options.items()]
        conf.append("")
    with open(os.path.join(d, "foundation.toml"), "w") as f:
        f.write("\n".join(conf))
    print("\n".join(conf))
    print(f"# written to {d}/foundation.toml; stop with: scripts/servers.sh stop {d}", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv)
