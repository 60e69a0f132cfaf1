"""The interface every replica backend keeps, its errors, and the behaviour wrapped around any backend.

A replica is a flat namespace of objects ("arenas/00000001.arena") on a
server the user rents; a backend moves whole objects or byte ranges of
them and nothing else. Retries and the bandwidth limit are wrappers
(`Retrying`, `Throttled`), not repeated in each backend (restic's layout).

Rules every backend keeps:

- Names are relative, "/"-separated ("a/b/c"), without empty, "." or ".."
  components, and never contain ".tmp-" (that marks temporaries).
- `put` is ATOMIC: the object appears complete under its name or not at
  all, and replacing an existing object is atomic too (a reader sees the
  old or the new bytes). It uploads under a temporary (`name + ".tmp-" +
  token`, or an S3 multipart upload) and renames or completes it. The one
  exception: an FTP server that refuses to rename over an existing file
  gets the old file deleted first, and a reader may meet no object for a
  moment (never a partial one).
- `put` is RESUMABLE: if an earlier put of the same (name, token) was
  interrupted, it continues from what the server already holds. The
  caller guarantees that the same (name, token) always means the same
  bytes; an empty token means "do not resume". S3 keys no token: the parts
  of an unfinished multipart upload are kept only where their MD5 matches
  the local bytes.
- `list` shows complete objects only, never temporaries.
- `get` and `get_file` raise RemoteMissing for an absent object; `size`
  answers None; `delete` of an absent object is fine.
- Every failure is a RemoteError. `Transient` ones (a refused or dropped
  connection, a timeout, FTP 421/425/426/450/451, S3 5xx and throttling)
  are worth retrying; `Retrying` does so and raises `Unreachable` when the
  attempts are spent. `Permanent` ones (wrong credentials, a full server,
  a missing object, a bad URL, anything else the server refuses) are not
  retried. A backend drops a connection that failed and opens a new one
  at its next call.
- Messages name the replica by its URL without any password or secret key
  and say what to do.
- A backend object is used by one thread at a time, unless its
  `concurrent` says how many calls may run on it at once (S3: its
  `parallel` setting); replicate then puts that many objects at once.
"""

import contextlib
import hashlib
import os
import random
import re
import threading
import time

# The errors the rules above name; the backends take them from here.
from foundation.replica.errors import (  # noqa: F401
    AuthFailed, BadReplicaURL, Permanent, RemoteError, RemoteFull, RemoteMissing, Transient, Unreachable)

CHUNK = 1 << 20              # bytes per read/write in the chunk loops
TMP = ".tmp-"                # marks a temporary object: name + TMP + token


# ---- the interface ------------------------------------------------------------------------

class Backend:
    """A replica: objects by relative name. See the module docstring for the rules."""

    url = ""                 # for messages: the URL without any password or secret
    limiter = None           # a Limiter pacing put/get data, set by Throttled
    chunk = CHUNK
    concurrent = 1           # calls that may run on this object at once, from different threads

    def __init__(self):
        self.sent = 0        # bytes of object data sent to the server, all calls together
        self.received = 0    # bytes of object data received

    def put(self, name, path, offset=0, length=None, token="", progress=None):
        """Upload bytes [offset, offset+length) of local file `path` (length None: to its end) as `name`.

        progress(done) is called as it goes, `done` counting the bytes of
        the object the server holds, including those an earlier
        interrupted put left (so its first value may be above 0).
        """
        raise NotImplementedError

    def get(self, name, offset=0, length=None):
        """Bytes [offset, offset+length) of object `name`, fewer if it ends sooner; RemoteMissing if absent."""
        raise NotImplementedError

    def get_file(self, name, path, progress=None):
        """Download object `name` to local `path` (written as path + ".tmp", then renamed)."""
        raise NotImplementedError

    def size(self, name):
        """The size of object `name`, or None if it is absent."""
        raise NotImplementedError

    def list(self, prefix=""):
        """{name: size} of every complete object whose name starts with `prefix` (recursive)."""
        raise NotImplementedError

    def delete(self, name):
        """Remove object `name`; an absent object is fine."""
        raise NotImplementedError

    def cleanup(self, prefix=""):
        """Remove the leftovers of interrupted puts under `prefix`; returns how many.

        Only while no put to this replica is under way (it would lose its progress).
        """
        return 0

    def close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"<{type(self).__name__} {self.url}>"

    # helpers for the backends' chunk loops

    def _pace(self, n):
        if self.limiter is not None:
            self.limiter.take(n)

    def _chunk_size(self):
        return self.limiter.chunk(self.chunk) if self.limiter is not None else self.chunk


_NAME = re.compile(r"[^/\x00]+(/[^/\x00]+)*")
_TOKEN = re.compile(r"[A-Za-z0-9_.=-]*")


def check_name(name):
    """Refuse a name that breaks the rules (a bug in the caller, not a user error)."""
    if (not isinstance(name, str) or not _NAME.fullmatch(name) or TMP in name
            or any(p in (".", "..") for p in name.split("/"))):
        raise ValueError(f"bad replica object name {name!r}")
    return name


def temp_name(name, token):
    if not _TOKEN.fullmatch(token):
        raise ValueError(f"bad upload token {token!r}")
    return check_name(name) + TMP + token


def is_temp(name):
    return TMP in name.rsplit("/", 1)[-1]


def span(path, offset, length):
    """The length of the local range to upload, checked against the file."""
    size = os.path.getsize(path)
    if length is None:
        length = size - offset
    if offset < 0 or length < 0 or offset + length > size:
        raise ValueError(f"{path}: range {offset}+{length} outside the file ({size} bytes)")
    return length


def read_chunks(backend, path, offset, length, skip=0, progress=None):
    """Yield bytes [offset+skip, offset+length) of `path` in chunks, paced by the backend's limiter.

    Counts them in backend.sent and reports progress(done) first with
    `skip`, then after each chunk is handed back (that is, once the caller
    sent it).
    """
    done = skip
    if progress:
        progress(done)
    with open(path, "rb") as f:
        f.seek(offset + skip)
        while done < length:
            n = min(backend._chunk_size(), length - done)
            data = f.read(n)
            if len(data) != n:
                raise ValueError(f"{path} shrank while it was uploaded")
            backend._pace(n)
            yield data
            done += n
            backend.sent += n
            if progress:
                progress(done)


def download(path, fetch, progress=None):
    """Write into path + ".tmp" what fetch(write) hands to write(bytes), fsync it, rename it to path.

    progress(done) after each piece; on failure no ".tmp" is left.
    """
    done = 0

    def write(data):
        nonlocal done
        f.write(data)
        done += len(data)
        if progress:
            progress(done)
    try:
        with open(path + ".tmp", "wb") as f:
            fetch(write)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(path + ".tmp")
        raise
    os.replace(path + ".tmp", path)


def md5_of(path, offset, length):
    h = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        f.seek(offset)
        while length > 0:
            data = f.read(min(CHUNK, length))
            if not data:
                break
            h.update(data)
            length -= len(data)
    return h.hexdigest()


# ---- the bandwidth limit ------------------------------------------------------------------

class Limiter:
    """A token bucket of bytes per second, shared by every transfer of one replica.

    take(n) returns once n more bytes fit the rate; the bucket holds at most
    `burst` bytes (a tenth of a second by default), so the rate over any
    second stays within about 10% of the limit. Thread-safe.
    """

    def __init__(self, bytes_per_second, burst=None):
        if bytes_per_second <= 0:
            raise ValueError("bytes_per_second must be positive")
        self.rate = float(bytes_per_second)
        self.burst = float(burst if burst is not None else max(4096, self.rate / 10))
        self.tokens = self.burst
        self.last = time.monotonic()
        self.total = 0       # bytes let through
        self.slept = 0.0     # seconds spent waiting
        self.lock = threading.Lock()

    def chunk(self, default):
        """The chunk size to use under this limit: small enough to pace smoothly."""
        return max(4096, min(default, int(self.burst)))

    def take(self, n):
        with self.lock:
            now = time.monotonic()
            self.tokens = min(self.burst, self.tokens + (now - self.last) * self.rate)
            self.last = now
            self.tokens -= n
            self.total += n
            wait = -self.tokens / self.rate if self.tokens < 0 else 0.0
            self.slept += wait
        if wait:
            time.sleep(wait)


# ---- wrappers -----------------------------------------------------------------------------

class Wrapper(Backend):
    """A backend that hands every call to `inner`; other attributes are the inner backend's."""

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, attr):
        if attr == "inner":
            raise AttributeError(attr)
        return getattr(self.inner, attr)

    @property
    def url(self):
        return self.inner.url

    @property
    def limiter(self):
        return self.inner.limiter

    @property
    def concurrent(self):
        return self.inner.concurrent

    def _call(self, method, *args, **kw):
        return getattr(self.inner, method)(*args, **kw)

    def put(self, name, path, offset=0, length=None, token="", progress=None):
        return self._call("put", name, path, offset, length, token, progress)

    def get(self, name, offset=0, length=None):
        return self._call("get", name, offset, length)

    def get_file(self, name, path, progress=None):
        return self._call("get_file", name, path, progress)

    def size(self, name):
        return self._call("size", name)

    def list(self, prefix=""):
        return self._call("list", prefix)

    def delete(self, name):
        return self._call("delete", name)

    def cleanup(self, prefix=""):
        return self._call("cleanup", prefix)

    def close(self):
        self.inner.close()


class Retrying(Wrapper):
    """Call again on a Transient error, waiting about backoff, 2*backoff, ... (at most max_backoff) between attempts.

    Each wait is jittered (between half and all of it), so that transfers cut
    together (a dropped link, a throttling server) do not all come back together.
    A put that was cut resumes at the next attempt (same name and token).
    When `attempts` calls all failed, raises Unreachable with the last error.
    """

    def __init__(self, inner, attempts=5, backoff=0.5, max_backoff=30, sleep=time.sleep):
        super().__init__(inner)
        self.attempts, self.backoff, self.max_backoff = attempts, backoff, max_backoff
        self.sleep = sleep
        self.retries = 0     # calls made again, all together
        self._lock = threading.Lock()

    def _call(self, method, *args, **kw):
        wait = self.backoff
        for attempt in range(self.attempts):
            try:
                return getattr(self.inner, method)(*args, **kw)
            except Transient as e:
                last = e
            if attempt + 1 < self.attempts:
                with self._lock:
                    self.retries += 1
                self.sleep(wait * random.uniform(0.5, 1.0))
                wait = min(wait * 2, self.max_backoff)
        raise Unreachable(self.url, f"{last.args[-1]} ({self.attempts} attempts)") from last


class Throttled(Wrapper):
    """Limit the put/get data of `inner` to bytes_per_second (a Limiter in its chunk loops)."""

    def __init__(self, inner, bytes_per_second):
        super().__init__(inner)
        base = inner
        while isinstance(base, Wrapper):
            base = base.inner
        base.limiter = Limiter(bytes_per_second)
