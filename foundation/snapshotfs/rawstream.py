"""Reads of one open vda.raw: a copy streams whole decoded windows, a booting guest reads small.

A user copying a past disk (`cp`, `dd bs=1M`, `qemu-img convert`) reads it
front to back: as soon as reads adjoin recent ones, the stream reads the
disk in aligned windows of WINDOW bytes, one log-order stream of the image
reader's (each arena once a window, decoded on every core in the C core
straight into the window, the next window's spans under way while this
one's last decode), AHEAD windows ahead of the reader, while the event loop
answers the kernel's requests from windows already decoded, without a trip
to the worker thread. Requests of a reader with several in flight arrive
out of order: a read adjoining any of the last RECENT counts, and once
sequential a reader stays so while it reads within the windows kept.

The one design decision: a copier's replies bypass the page cache (FUSE
direct_io, chosen per open by direct()): each byte crosses once, from the
window into the reader's buffer, instead of into the cache and out again;
a running guest (QEMU) keeps the cache, which its repeated reads and the
clones of one day share. A guest booting from a past day reads small
pieces here and there: those go straight to the image reader, block by
block through the store's block cache, so a first read never waits for a
window it does not need.

A window that fails to decode is dropped: the requests in it are then
read alone, so only a request touching the damaged block fails (EIO).
A window read to its end is dropped at once; its buffer, once no
request's reply references it, is decoded into again (no fresh pages to
fault in and zero a window).
"""

import collections
import mmap
import os
import sys

import trio

WINDOW = 8 << 20  # bytes of image a sequential window decodes at once: the windows are the passes
# of one stream of spans (ImageReader.read_window), each planned alone (its blocks located, its
# arenas swept): 8 MiB cost a copy of a day ~0.3 CPU s less than 4 MiB, for 16-20 MB more
AHEAD = 2  # windows fetched ahead of a sequential reader: with two, the next fetch starts as the one
# before it ends, not when the reader's next request comes (one ahead left the decoders idle for a
# round trip through the event loop and the reader at every window; benchmarks/README.md, fuse8)
KEEP = AHEAD + 3  # decoded windows kept per open file: the one read, those ahead of it, and those
# a reader with several requests in flight (qemu-img convert, 8 of 2 MiB) has not finished with
SEQUENTIAL = 2  # reads in a row adjoining a recent one that make a reader sequential...
STREAM_BYTES = 2 << 20  # ...and this many bytes read so (a guest's short runs of small reads stay
# on the block path: they would wait for a window they do not need)
RECENT = 16  # reads remembered to tell whether a new one adjoins them
SPARE = 1  # dropped windows' buffers kept for the next ones (one is dropped as each is made)
DIRECT = True  # replies straight into a copier's buffer (direct()); False: every reader through the page cache
BLKSIZE = 1 << 20  # a raw image's st_blksize, what cp reads at once: one FUSE request, the kernel's largest
# (max_pages 256); 4 MiB (four requests at once) cost cp more CPU
GUESTS = ("qemu-system-", "qemu-kvm")  # programs that run a guest: they keep the page cache


def direct(pid):
    """Whether the replies to process pid's reads go straight into its buffers (FUSE direct_io).

    A copy (cp, dd, qemu-img convert, anything that is not a running guest) reads each byte once:
    the page cache would cost it a copy of every byte into the cache and one out of it. A guest
    booting from the image (QEMU) reads here and there, some blocks again, and clones of one day
    share what the cache holds: it keeps the cache."""
    if not DIRECT:
        return False
    try:
        name = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
    except OSError:
        try:
            with open(f"/proc/{pid}/comm") as f:
                name = f.read().strip()
        except OSError:
            return True
    return not name.startswith(GUESTS)


class RawStream:
    """The handle of one open raw image (tree.py's read dispatches to read())."""

    def __init__(self, reader, size, path=""):
        self.reader, self.size, self.path = reader, size, path
        self._window = getattr(reader, "window", None)
        self.spare = []  # buffers of dropped windows, to decode the next ones into
        self.wins = {}  # window number -> its bytes (never mutated)
        self.pending = {}  # window number -> trio.Event set when its fetch ends
        self.failed = set()  # windows that did not decode: their requests are read alone
        self.recent = collections.deque(maxlen=RECENT)  # (start, end) of the last reads
        self.run = 0  # reads in a row that adjoined a recent one
        self.run_bytes = 0  # the bytes they asked for
        self.stream = False  # read from windows (a sequential reader)
        self.cur = 0  # the window read last
        self.served = {}  # window number -> bytes answered from it (all of them: it is dropped)
        self.done = set()  # windows answered to their end: not fetched ahead again

    async def read(self, off, n, fs):
        """Bytes [off, off + n) clipped to the image; fs runs blocking work (SnapshotFS._work)."""
        end = min(off + n, self.size)
        if off >= end:
            return b""
        # sequential: it begins where a recent read ended or ends where one began (a reader with
        # several requests in flight, or the kernel splitting a large one, sends them out of order)
        w0, w1 = off // WINDOW, (end - 1) // WINDOW
        near = any(off == b or end == a for a, b in self.recent)
        self.recent.append((off, end))
        # once sequential, a reader stays so while it reads within the windows kept
        stays = self.stream and abs(w0 - self.cur) <= KEEP
        self.run = self.run + 1 if near or stays else 0
        self.run_bytes = self.run_bytes + end - off if self.run else end - off
        self.stream = self.run >= SEQUENTIAL and self.run_bytes >= STREAM_BYTES
        if not self.run:
            self.done.clear()     # a seek: a new pass may read those windows again
        if self.stream or all(w in self.wins or w in self.pending for w in range(w0, w1 + 1)):
            if self.stream:
                for w in range(w0, min(w1 + AHEAD, (self.size - 1) // WINDOW) + 1):
                    if w > w1 and len(self.wins) + len(self.pending) >= KEEP:
                        break     # no further ahead than the windows kept: none is dropped unread
                    self._start(w, fs)
            parts = []
            for w in range(w0, w1 + 1):
                buf = await self._get(w, fs)
                if buf is None:
                    break
                lo = max(off, w * WINDOW) - w * WINDOW
                hi = min(end, (w + 1) * WINDOW) - w * WINDOW
                parts.append(memoryview(buf)[lo:hi])
                self.served[w] = self.served.get(w, 0) + hi - lo
            else:
                for w in range(w0, w1 + 1):
                    if self.served.get(w, 0) >= min(WINDOW, self.size - w * WINDOW):
                        self._drop(w)     # read to its end: its buffer goes to the next window
                        self.done.add(w)
                return parts[0] if len(parts) == 1 else b"".join(parts)
        return await fs._work(f"read {self.path} at offset {off} ({n} bytes)", self.reader.read, off, end - off)

    def _start(self, w, fs):
        """Fetch window w in the background (when the server gave a nursery to run it in)."""
        if fs.nursery is None or w in self.wins or w in self.pending or w in self.failed or w in self.done:
            return
        ev = self.pending[w] = trio.Event()
        fs.nursery.start_soon(self._fetch, w, ev, fs)

    async def _get(self, w, fs):
        """Window w's bytes, fetched now or awaited; None if it failed."""
        self.cur = w
        buf = self.wins.get(w)
        if buf is not None or w in self.failed:
            return buf
        ev = self.pending.get(w)
        if ev is None:
            ev = self.pending[w] = trio.Event()
            await self._fetch(w, ev, fs)
        else:
            await ev.wait()
        return self.wins.get(w)

    def _buffer(self, n):
        """A window's buffer of n bytes at least: a dropped one that no reply still reads from, or
        a new one (called in the worker thread, while the event loop may drop windows)."""
        for k in range(len(self.spare)):
            # referenced by the list and getrefcount's argument only: no view of it is left (a
            # request's reply that spans two windows may hold one across an await)
            if sys.getrefcount(self.spare[k]) <= 2 and len(self.spare[k]) >= n:
                return self.spare.pop(k)  # (only this thread takes from the list)
        # private: a shared anonymous map is shmem, slower to fault in and to unmap; huge pages
        # where the kernel gives them: the kernel walks the window's pages for every reply
        b = mmap.mmap(-1, max(n, WINDOW), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        try:
            b.madvise(mmap.MADV_HUGEPAGE)
        except (AttributeError, OSError):
            pass
        return b

    def _drop(self, w):
        """Forget window w; its buffer is kept for the next window (once no reply reads it)."""
        old = self.wins.pop(w, None)
        self.served.pop(w, None)
        if isinstance(old, memoryview) and isinstance(old.obj, mmap.mmap) and len(self.spare) < SPARE:
            self.spare.append(old.obj)

    async def _fetch(self, w, ev, fs):
        try:
            before = self.pending.get(w - 1)
            if before is not None:   # started in the same tick, trio may run this one first: the
                await before.wait()  # stream reads windows in order (out of turn: a new stream)
            lo = w * WINDOW
            n = min(WINDOW, self.size - lo)
            if self._window is None:
                ok, value = await fs._attempt(self.reader.read, lo, n)
            else:
                ok, value = await fs._attempt(self._window, lo, n, self._buffer)
            if ok:
                self.wins[w] = value
                # keep the windows nearest the reader, those ahead of it first
                while len(self.wins) > KEEP:
                    self._drop(max(self.wins, key=lambda x: (x < self.cur, abs(x - self.cur))))
            else:
                self.failed.add(w)
        finally:
            self.pending.pop(w, None)
            ev.set()
