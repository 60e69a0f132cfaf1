"""Just enough of an NBD client to read an image that QEMU serves on a unix socket.

Foundation never parses qcow2 (or vmdk, vdi, ...) itself: QEMU's own block
layer, run as `qemu-nbd --read-only`, resolves backing chains, compressed
and encrypted clusters, and serves the result as a flat run of bytes. This
module speaks the part of the NBD protocol (docs: NBD's proto.md, "fixed
newstyle" negotiation) needed to read it: NBD_OPT_EXPORT_NAME, then simple
NBD_CMD_READ requests of at most 32 MiB, then NBD_CMD_DISC. All integers on
the wire are big-endian.
"""

import os
import socket
import struct
import subprocess
import tempfile
import time

NBDMAGIC = b"NBDMAGIC"
IHAVEOPT = b"IHAVEOPT"
FLAG_FIXED_NEWSTYLE = 1 << 0
FLAG_NO_ZEROES = 1 << 1
OPT_EXPORT_NAME = 1
REQUEST_MAGIC = 0x25609513
SIMPLE_REPLY_MAGIC = 0x67446698
CMD_READ, CMD_DISC = 0, 2
MAX_REQUEST = 32 << 20  # QEMU's NBD_MAX_BUFFER_SIZE

REQUEST = struct.Struct(">IHHQQI")
REPLY = struct.Struct(">IIQ")


class NbdError(Exception):
    pass


class NbdClient:
    """A connected, negotiated NBD session on one export."""

    def __init__(self, sock_path, export=""):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(sock_path)
        self.handle = 0
        self._handshake(export.encode())

    def _recv(self, n):
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            m = self.sock.recv_into(view[got:], n - got)
            if m == 0:
                raise NbdError("the NBD server closed the connection")
            got += m
        return buf

    def _handshake(self, name):
        hello = self._recv(18)
        if hello[:8] != NBDMAGIC or hello[8:16] != IHAVEOPT:
            raise NbdError("not a fixed-newstyle NBD server")
        (hflags,) = struct.unpack(">H", hello[16:18])
        if not hflags & FLAG_FIXED_NEWSTYLE:
            raise NbdError("the NBD server does not speak fixed newstyle")
        cflags = FLAG_FIXED_NEWSTYLE | (hflags & FLAG_NO_ZEROES)
        self.sock.sendall(struct.pack(">I", cflags))
        self.sock.sendall(IHAVEOPT + struct.pack(">II", OPT_EXPORT_NAME, len(name)) + name)
        size, self.tflags = struct.unpack(">QH", self._recv(10))
        if not hflags & FLAG_NO_ZEROES:
            self._recv(124)
        self.size = size

    def read(self, offset, length):
        """`length` bytes from `offset` (a bytearray)."""
        out = bytearray(length)
        self.read_into(offset, memoryview(out))
        return out

    def read_into(self, offset, view):
        """Fill `view` with the bytes from `offset`."""
        length = len(view)
        pos = 0
        while pos < length:
            n = min(MAX_REQUEST, length - pos)
            self.handle += 1
            self.sock.sendall(REQUEST.pack(REQUEST_MAGIC, 0, CMD_READ, self.handle, offset + pos, n))
            magic, err, handle = REPLY.unpack(self._recv(REPLY.size))
            if magic != SIMPLE_REPLY_MAGIC or handle != self.handle:
                raise NbdError("unexpected NBD reply")
            if err:
                raise NbdError(f"read of {n} bytes at {offset + pos} failed: {os.strerror(err)}")
            got = 0
            while got < n:
                m = self.sock.recv_into(view[pos + got:pos + n], n - got)
                if m == 0:
                    raise NbdError("the NBD server closed the connection")
                got += m
            pos += n

    def close(self):
        try:
            self.handle += 1
            self.sock.sendall(REQUEST.pack(REQUEST_MAGIC, 0, CMD_DISC, self.handle, 0, 0))
        except OSError:
            pass
        self.sock.close()


class QemuNbd:
    """`qemu-nbd --read-only` serving one image on a private unix socket.

    It forks once it is ready and exits by itself when our connection closes
    (no --persistent), so even a killed Foundation leaves no server behind.
    """

    def __init__(self, path, fmt):
        self.dir = tempfile.mkdtemp(prefix="foundation-nbd-")
        self.sock = os.path.join(self.dir, "nbd.sock")
        pidfile = os.path.join(self.dir, "pid")
        cmd = ["qemu-nbd", "--read-only", "--fork", "--format", fmt, "--socket", self.sock,
               "--pid-file", pidfile, "--cache", "writeback", path]
        p = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if p.returncode != 0:
            self._cleanup()
            raise NbdError(p.stderr.strip() or f"qemu-nbd exited with status {p.returncode}")
        try:
            with open(pidfile) as f:
                self.pid = int(f.read().strip())
        except (OSError, ValueError):
            self.pid = None
        try:
            self.client = NbdClient(self.sock)
        except (OSError, NbdError):
            self.close()
            raise

    def read(self, offset, length):
        return self.client.read(offset, length)

    def close(self):
        c = getattr(self, "client", None)
        if c is not None:
            c.close()
            self.client = None
        if self.pid:
            for _ in range(100):
                if not _alive(self.pid):
                    break
                time.sleep(0.01)
            else:
                try:
                    os.kill(self.pid, 15)
                except ProcessLookupError:
                    pass
            self.pid = None
        self._cleanup()

    def _cleanup(self):
        """Remove the socket directory."""
        for f in ("nbd.sock", "pid"):
            try:
                os.unlink(os.path.join(self.dir, f))
            except FileNotFoundError:
                pass
        try:
            os.rmdir(self.dir)
        except OSError:
            pass


def _alive(pid):
    """True while the process runs (a zombie waiting for its reaper counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False
