"""LVM2 thin volumes, read from their pool's dm-thin metadata: no library reads it.

libvslvm refuses thin pools and Dissect (AGPL) is kept out of the default
install, so this reads the kernel's persistent-data format itself
(drivers/md/dm-thin-metadata.c, persistent-data/dm-btree*.c; checked
against thin-provisioning-tools' thin_dump): the superblock in metadata
block 0 names the two-level mapping btree, device id -> (virtual block ->
data block << 24 | time). Every metadata block is checked (checksum,
block number, magic) before it is trusted; a block of the thin volume
that the tree does not map reads as zeros, as the kernel returns it.
The superblock is the pool's last committed transaction: what the
guest's kernel would find after a crash too.
"""

import collections
import struct

try:
    import google_crc32c
except ImportError:          # the fuse extra brings it; without it no thin volume is read
    google_crc32c = None

BLOCK = 4096                         # dm-thin metadata block size, fixed by the kernel
MAGIC = 27022010
SUPERBLOCK_XOR = 160774
BTREE_XOR = 121107
INTERNAL, LEAF = 1, 2
NODE_CACHE = 1024                    # parsed btree nodes kept per pool (4 MiB of metadata)


class ThinError(Exception):
    pass


def _checksum(block, xor):
    # dm_bm_checksum: crc32c seeded with ~0, without the final inversion, xor a constant
    return google_crc32c.value(block[4:]) ^ 0xFFFFFFFF ^ xor


class Pool:
    """The metadata of one thin pool: `meta` and `data` are byte sources (its _tmeta and _tdata),
    `chunk` the pool's block size in bytes as LVM's metadata gives it."""

    def __init__(self, meta, data, chunk):
        if google_crc32c is None:
            raise ThinError("thin volumes need google-crc32c: pip install 'foundation[fuse]'")
        self.meta, self.data, self.chunk = meta, data, chunk
        self.nodes = collections.OrderedDict()
        sb = self._block(0)
        if struct.unpack_from("<Q", sb, 32)[0] != MAGIC:
            raise ThinError("thin pool metadata has no superblock (wrong magic)")
        if struct.unpack_from("<I", sb, 0)[0] != _checksum(sb, SUPERBLOCK_XOR):
            raise ThinError("thin pool superblock checksum is wrong")
        version = struct.unpack_from("<I", sb, 40)[0]
        if version not in (1, 2):
            raise ThinError(f"thin pool metadata version {version} is not supported")
        self.mapping_root, self.details_root = struct.unpack_from("<QQ", sb, 320)
        block_sectors = struct.unpack_from("<I", sb, 336)[0]
        if block_sectors * 512 != chunk:
            raise ThinError(f"thin pool block size {block_sectors * 512} differs from LVM's chunk size {chunk}")

    def _block(self, n):
        if (n + 1) * BLOCK > self.meta.size:
            raise ThinError(f"thin pool metadata block {n} is past the end of the metadata volume")
        b = self.meta.read(n * BLOCK, BLOCK)
        if len(b) != BLOCK:
            raise ThinError(f"thin pool metadata block {n} is short")
        return b

    def _node(self, n):
        """(is_leaf, keys, values as ints) of btree node n, checked."""
        node = self.nodes.get(n)
        if node is not None:
            self.nodes.move_to_end(n)
            return node
        b = self._block(n)
        csum, flags, blocknr, count, cap, vsize = struct.unpack_from("<IIQIII", b, 0)
        if csum != _checksum(b, BTREE_XOR) or blocknr != n:
            raise ThinError(f"thin pool metadata block {n} is damaged (checksum or location)")
        if flags not in (INTERNAL, LEAF) or count > cap or 32 + cap * (8 + vsize) > BLOCK or vsize < 8:
            raise ThinError(f"thin pool metadata block {n} is not a btree node")
        keys = struct.unpack_from(f"<{count}Q", b, 32)
        values = [struct.unpack_from("<Q", b, 32 + cap * 8 + i * vsize)[0] for i in range(count)]
        node = (flags == LEAF, keys, values)
        self.nodes[n] = node
        if len(self.nodes) > NODE_CACHE:
            self.nodes.popitem(last=False)
        return node

    def lookup(self, root, key):
        """The first 64 bits of key's value in the btree at root, or None."""
        n = root
        for _ in range(32):                     # no real tree is this deep: a loop is damage
            leaf, keys, values = self._node(n)
            i = _floor(keys, key)
            if leaf:
                return values[i] if i >= 0 and keys[i] == key else None
            if i < 0:
                return None
            n = values[i]
        raise ThinError("thin pool btree is too deep (damaged)")

    def device_root(self, dev_id):
        root = self.lookup(self.mapping_root, dev_id)
        if root is None:
            raise ThinError(f"thin device {dev_id} is not in the pool's metadata")
        return root


def _floor(keys, key):
    """Index of the last key <= key, or -1."""
    lo, hi = 0, len(keys)
    while lo < hi:
        mid = (lo + hi) // 2
        if keys[mid] <= key:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


class ThinLv:
    """A thin logical volume as a byte source: device dev_id of pool, `size` bytes."""

    def __init__(self, pool, dev_id, size):
        self.pool, self.size = pool, size
        self.root = pool.device_root(dev_id)
        self.nr_data = pool.data.size // pool.chunk

    def read(self, offset, length):
        length = min(length, self.size - offset)
        if length <= 0:
            return b""
        cs = self.pool.chunk
        out = bytearray(length)
        run = None                              # (data byte offset, out offset, length): one read
        pos = offset
        while pos < offset + length:
            vblock, within = divmod(pos, cs)
            n = min(cs - within, offset + length - pos)
            v = self.pool.lookup(self.root, vblock)
            if v is not None:
                dblock = v >> 24
                if dblock >= self.nr_data:
                    raise ThinError(f"thin block {vblock} maps past the end of the pool's data")
                src = dblock * cs + within
                if run and run[0] + run[2] == src and run[1] + run[2] == pos - offset:
                    run = (run[0], run[1], run[2] + n)
                else:
                    self._fill(out, run)
                    run = (src, pos - offset, n)
            pos += n
        self._fill(out, run)
        return bytes(out)

    def _fill(self, out, run):
        if run:
            src, at, n = run
            data = self.pool.data.read(src, n)
            if len(data) != n:
                raise ThinError("thin pool data volume is short")
            out[at:at + n] = data
