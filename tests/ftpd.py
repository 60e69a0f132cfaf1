"""An FTP or FTPS server for the replica tests (pyftpdlib), on loopback.

    python tests/ftpd.py --root DIR --user U --password P [--port 0] [--passive-ports 50000-50049]
                         [--tls CERT.pem] [--quota BYTES]

Prints "port N" on stdout once it listens, then serves until killed.
--tls serves FTPS (explicit AUTH TLS; CERT.pem holds certificate and key).
--quota makes the server behave like a full hosting account: a STOR or
APPE is refused with 552 once DIR holds that many bytes, and an upload
that crosses the limit is cut with 552, as vsftpd and others answer on
EDQUOT.
"""

import argparse
import errno
import os
import sys

from pyftpdlib.authorizers import DummyAuthorizer
from pyftpdlib.exceptions import _FileReadWriteError
from pyftpdlib.filesystems import AbstractedFS
from pyftpdlib.handlers import DTPHandler, FTPHandler, TLS_DTPHandler, TLS_FTPHandler
from pyftpdlib.log import logger
from pyftpdlib.servers import FTPServer

QUOTA = None


def used(root):
    total = 0
    for d, _, fs in os.walk(root):
        for f in fs:
            try:        # another session may rename or remove a temporary while we walk
                total += os.path.getsize(os.path.join(d, f))
            except FileNotFoundError:
                pass
    return total


class QuotaFile:
    """A file being uploaded that fails with EDQUOT once the served tree would pass QUOTA."""

    def __init__(self, f, root):
        self.f, self.left = f, QUOTA - used(root)

    def write(self, data):
        if len(data) > self.left:
            raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))
        self.left -= len(data)
        return self.f.write(data)

    def __getattr__(self, attr):
        return getattr(self.f, attr)


class QuotaFS(AbstractedFS):
    def open(self, filename, mode):
        f = super().open(filename, mode)
        if QUOTA is not None and any(c in mode for c in "wa+"):
            return QuotaFile(f, self.root)
        return f


class QuotaDTP:
    def handle_error(self):
        cause = getattr(sys.exc_info()[1], "__cause__", None)
        if isinstance(sys.exc_info()[1], _FileReadWriteError) and getattr(cause, "errno", None) == errno.EDQUOT:
            self._resp = ("552 Disk quota exceeded; transfer aborted.", logger.warning)
            self.close()
            return
        super().handle_error()


class QuotaControl:
    abstracted_fs = QuotaFS

    def ftp_STOR(self, file, mode="w"):
        if QUOTA is not None and used(self.fs.root) >= QUOTA:
            self.respond("552 Disk quota exceeded.")
            return None
        return super().ftp_STOR(file, mode)


class PlainDTP(QuotaDTP, DTPHandler):
    pass


class TLSDTP(QuotaDTP, TLS_DTPHandler):
    pass


class Plain(QuotaControl, FTPHandler):
    dtp_handler = PlainDTP


class TLS(QuotaControl, TLS_FTPHandler):
    dtp_handler = TLSDTP


def main():
    global QUOTA
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    ap.add_argument("--user", required=True)
    ap.add_argument("--password", required=True)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--passive-ports", default="50000-50049")
    ap.add_argument("--tls", metavar="PEM")
    ap.add_argument("--quota", type=int)
    a = ap.parse_args()
    QUOTA = a.quota
    auth = DummyAuthorizer()
    auth.add_user(a.user, a.password, a.root, perm="elradfmwMT")
    handler = TLS if a.tls else Plain
    if a.tls:
        handler.certfile = a.tls
        handler.tls_control_required = handler.tls_data_required = True
    handler.authorizer = auth
    lo, hi = map(int, a.passive_ports.split("-"))
    handler.passive_ports = range(lo, hi + 1)
    handler.banner = "foundation test ftpd"
    handler.auth_failed_timeout = 0.1     # not 3 s: the tests try wrong passwords
    handler.use_sendfile = False
    server = FTPServer(("127.0.0.1", a.port), handler)
    print("port", server.address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
