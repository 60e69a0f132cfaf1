"""Byte sources inside a disk, and the two adapters readers need over them.

Every reader sees a disk through one `DiskBytes` (a 64 KiB chunk cache
over the archive), narrowed to a partition by `Slice`, to a logical volume
by `Lv`, patched by a journal replay with `Overlay`. A reader that is a C
library may swallow a failed read and carry on, so the adapters record
every failure in the disk's `errors` list and `DiskFiles.call` fails the
whole call afterwards: a damaged block is EIO, never wrong data.
"""

import collections
import os
import traceback

import pytsk3

CHUNK = 64 << 10          # the disk is read in 64 KiB aligned chunks
CACHE_CHUNKS = 256        # per disk: 16 MiB of metadata and small-file blocks
BYPASS_CHUNKS = 4         # a read spanning more chunks than this goes straight to the source


def scrub(exc):
    """Drop the frames an exception chain holds, by refcount, now.

    A store read that fails can leave memoryviews exported to cffi in its
    frames; if the cyclic GC collects them later it can crash the process
    (seen with foundation.store: "memoryview has 1 exported buffer", then
    SIGSEGV). Clearing the frames at once frees them in a safe order.
    """
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        traceback.clear_frames(exc.__traceback__)
        exc.__traceback__ = None
        exc = exc.__cause__ or exc.__context__
    return None


class ReadFailed(Exception):
    """A read of the archived disk failed under a reader; `cause` is the original error."""

    def __init__(self, cause):
        super().__init__(str(cause))
        self.cause = cause


class DiskBytes:
    """`source.read(offset, length)` / `source.size` behind an LRU of 64 KiB chunks."""

    def __init__(self, source):
        self.source = source
        self.size = source.size
        self.cache = collections.OrderedDict()

    def read(self, offset, length):
        end = min(offset + length, self.size)
        if offset >= end:
            return b""
        first, last = offset // CHUNK, (end - 1) // CHUNK
        if last - first >= BYPASS_CHUNKS:
            # File data in long runs: caching it would only evict metadata and copy twice.
            return self.source.read(offset, end - offset)
        try:
            if first == last:
                c = self._chunk(first)
                return c[offset - first * CHUNK:end - first * CHUNK]
            parts = [self._chunk(i) for i in range(first, last + 1)]
        except Exception as e:
            # A damaged block somewhere in the chunk: read just what was asked,
            # so one bad block fails only the reads that touch it.
            scrub(e)
            del e
            return self.source.read(offset, end - offset)
        return b"".join(parts)[offset - first * CHUNK:end - first * CHUNK]

    def _chunk(self, i):
        c = self.cache.get(i)
        if c is not None:
            self.cache.move_to_end(i)
            return c
        off = i * CHUNK
        c = self.source.read(off, min(CHUNK, self.size - off))
        self.cache[i] = c
        if len(self.cache) > CACHE_CHUNKS:
            self.cache.popitem(last=False)
        return c


class Slice:
    """Bytes [offset, offset+size) of another source: a partition."""

    def __init__(self, base, offset, size):
        self.base, self.offset = base, offset
        self.size = max(0, min(size, base.size - offset))

    def read(self, offset, length):
        length = min(length, self.size - offset)
        if length <= 0:
            return b""
        return self.base.read(self.offset + offset, length)


class Lv:
    """A logical volume, mapped to its physical volume by libvslvm."""

    def __init__(self, lv):
        self.lv = lv
        self.size = lv.size

    def read(self, offset, length):
        length = min(length, self.size - offset)
        if length <= 0:
            return b""
        return self.lv.read_buffer_at_offset(length, offset)


class Overlay:
    """A source with some blocks replaced: {block number: bytes of block_size}."""

    def __init__(self, base, blocks, block_size):
        self.base, self.blocks, self.bs = base, blocks, block_size
        self.size = base.size

    def read(self, offset, length):
        data = self.base.read(offset, length)
        if not self.blocks or not data:
            return data
        end = offset + len(data)
        buf = None
        for b in range(offset // self.bs, (end - 1) // self.bs + 1):
            new = self.blocks.get(b)
            if new is None:
                continue
            if buf is None:
                buf = bytearray(data)
            s, e = max(b * self.bs, offset), min((b + 1) * self.bs, end)
            buf[s - offset:e - offset] = new[s - b * self.bs:e - b * self.bs]
        return data if buf is None else bytes(buf)


class FileObject:
    """A Python file object over a source, as the libyal and Dissect readers take one."""

    def __init__(self, source, errors):
        self.source, self.errors = source, errors
        self.size = source.size
        self.pos = 0

    def read(self, size=-1):
        if size is None or size < 0:
            size = self.size - self.pos
        try:
            data = self.source.read(self.pos, size)
        except Exception as e:
            scrub(e)
            self.errors.append((self.pos, self.pos + size, e))
            raise OSError(5, f"read of {size} bytes at {self.pos} failed") from None
        self.pos += len(data)
        return data

    def seek(self, offset, whence=os.SEEK_SET):
        if whence == os.SEEK_CUR:
            offset += self.pos
        elif whence == os.SEEK_END:
            offset += self.size
        self.pos = offset
        return self.pos

    def tell(self):
        return self.pos

    get_offset = tell

    def get_size(self):
        return self.size

    def readable(self):
        return True

    def seekable(self):
        return True


class SourceImg(pytsk3.Img_Info):
    """A TSK image over a source; failed reads go to `errors` (see DiskFiles.call)."""

    def __init__(self, source, errors):
        self.source, self.errors = source, errors
        self.size = source.size
        self.just_failed = False
        super().__init__(url="", type=pytsk3.TSK_IMG_TYPE_EXTERNAL)

    def get_size(self):
        return self.size

    def close(self):
        pass

    def read(self, offset, length):
        just_failed, self.just_failed = self.just_failed, False
        try:
            data = self.source.read(offset, length)
        except Exception as e:
            # Recorded, so the TSK call fails afterwards even if TSK carries on.
            # Not raised: pytsk3 would keep the exception pending and fail the
            # call even after TSK's own retry succeeded. An empty read is an
            # error to TSK.
            scrub(e)
            self.errors.append((offset, offset + length, e))
            self.just_failed = True
            return b""
        if just_failed and self.errors:
            # TSK fills its 64 KiB cache with one read and, when that fails,
            # retries just the bytes it needs. A retry that succeeds right
            # after, inside the failed range, is all TSK uses: forgive that one.
            f0, f1, _ = self.errors[-1]
            if f0 <= offset and offset + length <= f1:
                self.errors.pop()
        return data
