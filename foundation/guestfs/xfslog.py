"""Whether an XFS log holds transactions the guest would replay: so the tree can say it did not.

libfsxfs reads an XFS as the disk holds it and no library replays the XFS
log in memory, so a day archived mid-write may lack the guest's last
seconds of metadata changes. This module only tells such a day apart, as
the kernel's xlog_find_head/xlog_find_tail do: find the log head (where the
cycle number stamped on every 512-byte block drops), take the last record
header before it, and call the log clean only if that record is an
unmount record (one operation, flag XLOG_UNMOUNT_TRANS). Anything else,
including a log it cannot make sense of, is dirty.
"""

import struct

BB = 512
RECORD_MAGIC = 0xFEEDBABE
UNMOUNT_TRANS = 0x20
CYCLE_DATA = 32 << 10         # bytes of record data whose first words one header block saves


def dirty(read, sb):
    """True if the internal log of the XFS whose superblock is sb (read(offset, n) reads the
    file system) does not end in an unmount record; None if the log is external."""
    blocksize, = struct.unpack_from(">I", sb, 4)
    logstart, = struct.unpack_from(">Q", sb, 48)
    agblocks, = struct.unpack_from(">I", sb, 84)
    logblocks, = struct.unpack_from(">I", sb, 96)
    agblklog = sb[124]
    if logstart == 0:
        return None
    agno, agbno = logstart >> agblklog, logstart & ((1 << agblklog) - 1)
    base = (agno * agblocks + agbno) * blocksize
    nbb = logblocks * blocksize // BB

    def block(i):
        return read(base + (i % nbb) * BB, BB)

    def cycle(i):
        # A record header keeps its cycle in its second word; every other block in its first.
        word, hcycle = struct.unpack_from(">II", block(i), 0)
        return hcycle if word == RECORD_MAGIC else word

    first, last = cycle(0), cycle(nbb - 1)
    if first == last:
        head = nbb               # written all round with one cycle: the head is at the wrap
    else:
        lo, hi = 0, nbb - 1      # cycle(lo) == first, cycle(hi) == last: find the first block of `last`
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if cycle(mid) == first:
                lo = mid
            else:
                hi = mid
        head = hi
    for back in range(1, nbb + 1):
        h = block(head - back)
        magic, = struct.unpack_from(">I", h, 0)
        if magic != RECORD_MAGIC:
            continue
        version, = struct.unpack_from(">i", h, 8)
        nops, = struct.unpack_from(">i", h, 40)
        size, = struct.unpack_from(">i", h, 320)
        hblocks = -(-size // CYCLE_DATA) if version & 2 and size > CYCLE_DATA else 1
        if nops != 1:
            return True
        op = block(head - back + hblocks)
        return not op[9] & UNMOUNT_TRANS
    return True
