"""A replica on an FTP or FTPS server (ftplib): the cheapest hosting there is.

FTP has no atomic upload, only an atomic rename: a put stores
`name.tmp-TOKEN` (REST + STOR from the temporary's SIZE when an earlier
put was cut) and renames it over `name` with RNFR/RNTO. One control
connection, opened at the first call and again after a failure, in
passive binary mode, TLS on both channels for ftps:// (AUTH TLS + PROT P).
Every data connection resumes the control connection's TLS session, as
vsftpd (require_ssl_reuse, its default), ProFTPD and FileZilla Server
demand: ftplib's FTP_TLS does not (CPython bpo-19500), so `_SessionReuse`
does.
"""

import contextlib
import ftplib
import posixpath
import ssl

from foundation.replica import registry
from foundation.replica.backend import (
    AuthFailed, Backend, Permanent, RemoteError, RemoteFull, RemoteMissing, Transient,
    check_name, download, is_temp, read_chunks, span, temp_name)

_TRANSIENT = {"421", "425", "426", "450", "451"}
_FULL = {"452", "552"}
_AUTH = {"530", "532"}


def _code(e):
    return str(e)[:3]


def _full(e):
    """452/552, or any refusal that says the disk is full (pyftpdlib: "426 No space left on device; ...")."""
    text = str(e).lower()
    return _code(e) in _FULL or "no space left" in text or "disk full" in text or "quota" in text


class _SessionReuse(ftplib.FTP_TLS):
    """FTP_TLS whose data connections resume the control connection's TLS session."""

    def ntransfercmd(self, cmd, rest=None):
        conn, size = ftplib.FTP.ntransfercmd(self, cmd, rest)
        if self._prot_p:
            conn = self.context.wrap_socket(conn, server_hostname=self.host, session=self.sock.session)
        return conn, size


class FTPBackend(Backend):
    def __init__(self, spec):
        super().__init__()
        self.spec = spec
        self.url = spec.url
        self.base = spec.path
        self.ftp = None
        self.dirs = set()          # remote directories known to exist on this connection
        self.mlsd = True           # False once the server refused MLSD: LIST is parsed instead
        self.ascii = False         # the connection is in TYPE A

    # -- the connection

    def _connect(self):
        if self.ftp is not None:
            return self.ftp
        s = self.spec
        if s.scheme == "ftps":
            if s.insecure:
                ctx = ssl._create_unverified_context()
            else:
                ctx = ssl.create_default_context(cafile=s.ca_file)
            ftp = _SessionReuse(context=ctx, timeout=s.timeout)
        else:
            ftp = ftplib.FTP(timeout=s.timeout)
        self.ftp = ftp
        ftp.connect(s.host, s.port)
        ftp.login(s.user, s.password)
        if s.scheme == "ftps":
            ftp.prot_p()
        ftp.set_pasv(True)
        ftp.voidcmd("TYPE I")      # binary; SIZE and REST also need it
        self.ascii = False
        return ftp

    def _binary(self, ftp):
        """Back to TYPE I after a listing (ftplib's retrlines switches to TYPE A)."""
        if self.ascii:
            ftp.voidcmd("TYPE I")
            self.ascii = False

    def _drop(self):
        ftp, self.ftp = self.ftp, None
        self.dirs.clear()
        if ftp is not None:
            with contextlib.suppress(Exception):
                ftp.close()

    @contextlib.contextmanager
    def _session(self, what):
        """The connection; every failure becomes a RemoteError, and a broken connection is dropped."""
        try:
            yield self._connect()
        except RemoteError as e:
            if isinstance(e, Transient):
                self._drop()   # raised in the middle of a transfer: the dialogue is out of step
            raise
        except ftplib.Error as e:
            code, msg = _code(e), f"{what}: the server answered {str(e).strip().rstrip('.')}"
            if code in _AUTH:
                self._drop()
                raise AuthFailed(self.url, msg) from e
            if _full(e):
                raise RemoteFull(self.url, msg) from e
            self._drop()   # the dialogue may be out of step after an unexpected answer
            if code in _TRANSIENT or code.startswith("4"):
                raise Transient(self.url, msg) from e
            raise Permanent(self.url, msg) from e
        except ssl.SSLCertVerificationError as e:
            self._drop()
            raise Permanent(self.url, f"the server's certificate is not trusted ({e.verify_message}): set "
                                      "ca_file to the certificate that signed it, or insecure = true") from e
        except (OSError, EOFError) as e:
            self._drop()
            raise Transient(self.url, f"{what}: {_describe(e)}") from e
        except BaseException:
            self._drop()   # e.g. a progress callback raised in the middle of a transfer
            raise

    def _path(self, name):
        return posixpath.join(self.base, name) if self.base else name

    def _mkdirs(self, ftp, d):
        if not d or d in self.dirs or d == "/":
            return
        self._mkdirs(ftp, posixpath.dirname(d))
        try:
            ftp.mkd(d)
        except ftplib.error_perm:
            pass           # it exists (or cannot be made, which the STOR will tell)
        self.dirs.add(d)

    def _why_cut(self, ftp):
        """Read the reply to a cut upload (within 5 s); raise it if it says the server is full or aborted."""
        try:
            ftp.sock.settimeout(5)
            ftp.voidresp()
        except ftplib.Error as e:
            if _full(e):
                raise
            if _code(e) == "426":    # some servers (pyftpdlib) say only this when their disk is full
                raise Transient(self.url, f"the server aborted the upload ({str(e).strip()}); if this repeats, "
                                          "its disk or your quota may be full") from e
        except Exception:
            pass
        finally:
            with contextlib.suppress(Exception):
                ftp.sock.settimeout(self.spec.timeout)

    def _size(self, ftp, path):
        self._binary(ftp)
        try:
            return ftp.size(path)
        except ftplib.error_perm as e:
            if _code(e) == "550":
                return None
            raise

    # -- the interface

    def put(self, name, path, offset=0, length=None, token="", progress=None):
        length = span(path, offset, length)
        final, tmp = self._path(check_name(name)), self._path(temp_name(name, token))
        with self._session(f"uploading {name}") as ftp:
            self._mkdirs(ftp, posixpath.dirname(final))
            self._binary(ftp)
            skip = 0
            if token:
                have = self._size(ftp, tmp)
                skip = have if have is not None and have <= length else 0
            with ftp.transfercmd(f"STOR {tmp}", rest=skip or None) as conn:
                try:
                    for data in read_chunks(self, path, offset, length, skip, progress):
                        conn.sendall(data)
                    if isinstance(conn, ssl.SSLSocket):
                        conn.unwrap()
                except BaseException:
                    # Hang up the data connection and hear the server out: it may say why it cut
                    # us (552: full), and it keeps all we sent for the resume.
                    if isinstance(conn, ssl.SSLSocket):
                        with contextlib.suppress(Exception):
                            conn.unwrap()
                    conn.close()
                    self._why_cut(ftp)
                    raise
            ftp.voidresp()
            try:
                ftp.rename(tmp, final)
            except ftplib.error_perm:
                if self._size(ftp, final) is None:
                    raise
                ftp.delete(final)     # this server will not rename over a file
                ftp.rename(tmp, final)

    def get(self, name, offset=0, length=None):
        out = bytearray()
        if length == 0:
            return b""
        with self._session(f"reading {name}") as ftp:
            self._retrieve(ftp, name, offset, length, out.extend)
        return bytes(out)

    def get_file(self, name, path, progress=None):
        def fetch(write):
            with self._session(f"downloading {name}") as ftp:
                self._retrieve(ftp, name, 0, None, write)
        download(path, fetch, progress)

    def _retrieve(self, ftp, name, offset, length, write):
        self._binary(ftp)
        try:
            conn = ftp.transfercmd(f"RETR {self._path(check_name(name))}", rest=offset or None)
        except ftplib.error_perm as e:
            if _code(e) == "550":
                raise RemoteMissing(self.url, name) from None
            if _code(e) == "554" and offset:
                return     # REST beyond the end
            raise
        left, eof = length, False
        with conn:
            while not eof and (left is None or left > 0):
                n = self._chunk_size() if left is None else min(self._chunk_size(), left)
                self._pace(n)
                data = _recv(conn, n)
                eof = len(data) < n
                self.received += len(data)
                write(data)
                if left is not None:
                    left -= len(data)
            if eof and isinstance(conn, ssl.SSLSocket):
                conn.unwrap()
        if eof:
            ftp.voidresp()
        else:
            try:      # we hung up before the end: the server answers 226, 426 or 451
                ftp.voidresp()
            except (ftplib.error_temp, ftplib.error_reply):
                pass

    def size(self, name):
        with self._session(f"looking up {name}") as ftp:
            return self._size(ftp, self._path(check_name(name)))

    def _walk(self, ftp, prefix):
        """(name, size) of every file, temporaries too, whose name starts with prefix."""
        todo = [prefix.rpartition("/")[0]]
        while todo:
            rel = todo.pop()
            for entry, kind, size in self._listdir(ftp, self._path(rel) if rel else self.base or "."):
                name = f"{rel}/{entry}" if rel else entry
                if kind == "dir" and (name.startswith(prefix) or prefix.startswith(name + "/")):
                    todo.append(name)
                elif kind == "file" and name.startswith(prefix):
                    yield name, size

    def _listdir(self, ftp, d):
        """(name, "file"|"dir", size) in directory d; nothing if it does not exist."""
        self.ascii = True
        try:
            if self.mlsd:
                try:
                    return [(n, f.get("type"), int(f.get("size", 0)))
                            for n, f in ftp.mlsd(d, facts=["type", "size"]) if f.get("type") in ("file", "dir")]
                except ftplib.error_perm as e:
                    if _code(e) not in ("500", "501", "502", "504"):
                        raise
                    self.mlsd = False
            lines = []
            ftp.retrlines(f"LIST {d}", lines.append)
            return [e for e in map(_parse_list, lines) if e]
        except ftplib.error_perm as e:
            if _code(e) == "550":
                return []
            raise

    def list(self, prefix=""):
        with self._session("listing") as ftp:
            return {n: s for n, s in self._walk(ftp, prefix) if not is_temp(n)}

    def delete(self, name):
        with self._session(f"deleting {name}") as ftp:
            try:
                ftp.delete(self._path(check_name(name)))
            except ftplib.error_perm as e:
                if _code(e) != "550":
                    raise

    def cleanup(self, prefix=""):
        with self._session("removing unfinished uploads") as ftp:
            temps = [n for n, _ in self._walk(ftp, prefix) if is_temp(n)]
            for n in temps:
                ftp.delete(self._path(n))
            return len(temps)

    def close(self):
        ftp, self.ftp = self.ftp, None
        if ftp is not None:
            with contextlib.suppress(Exception):
                ftp.quit()
            with contextlib.suppress(Exception):
                ftp.close()


def _recv(conn, n):
    """Up to n bytes from the data connection, fewer only at its end."""
    buf = bytearray()
    while len(buf) < n:
        data = conn.recv(n - len(buf))
        if not data:
            break
        buf += data
    return bytes(buf)


def _parse_list(line):
    """(name, kind, size) from a Unix `ls -l` line of LIST, or None for links and others."""
    parts = line.split(None, 8)
    if len(parts) < 9 or parts[0][:1] not in "d-" or parts[8] in (".", ".."):
        return None
    return parts[8], "dir" if parts[0][0] == "d" else "file", int(parts[4])


def _describe(e):
    if isinstance(e, EOFError):
        return "the server closed the connection"
    if isinstance(e, TimeoutError):
        return "no answer within the timeout"
    return e.strerror or str(e) or type(e).__name__


registry.register(FTPBackend, "ftp", "ftps")
