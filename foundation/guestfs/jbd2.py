"""ext3/ext4 journal (jbd2) replay in memory: a crash-consistent day shown as the guest saw it.

A day archived without a quiesced guest holds an ext file system whose
journal still carries committed transactions. The kernel (or e2fsck)
would replay them at the guest's next mount; no reader library does, so
this module does what e2fsprogs' recovery.c does, into a dict instead of
onto the disk: it scans the log from `s_start`, keeps the transactions
whose commit block was written, drops revoked blocks (a revoke in
transaction T cancels that block in every transaction up to T), and
returns {file-system block: new bytes}, the later transaction winning.
`Overlay` lays that over the day's bytes; the archive is never written.

Not replayed: fast-commit blocks (ext4 `fast_commit`, kept after the
normal log) and an external journal device. Checksums are not verified:
a transaction counts as committed once its commit block with the right
sequence number is found, as e2fsck does without `journal_checksum`.
"""

import struct

MAGIC = 0xC03B3998
DESCRIPTOR, COMMIT, SB_V1, SB_V2, REVOKE = 1, 2, 3, 4, 5
INCOMPAT_REVOKE, INCOMPAT_64BIT, INCOMPAT_CSUM_V2, INCOMPAT_CSUM_V3 = 0x1, 0x2, 0x8, 0x10
INCOMPAT_FAST_COMMIT = 0x20
FLAG_ESCAPE, FLAG_SAME_UUID, FLAG_LAST_TAG = 0x1, 0x2, 0x8
EXT_RECOVER = 0x4            # ext superblock s_feature_incompat: the journal needs recovery
EXT_JOURNAL_DEV = 0x8        # the journal lives on another device


class JournalError(Exception):
    """The journal cannot be replayed; the file system is shown as the disk holds it."""


def needs_replay(ext_sb):
    """(journal inode, True) when the ext superblock (1024 bytes) says the journal needs recovery."""
    compat, incompat = struct.unpack_from("<II", ext_sb, 0x5C)
    if not compat & 0x4 or not incompat & EXT_RECOVER:
        return None
    if incompat & EXT_JOURNAL_DEV:
        raise JournalError("the journal is on an external device, which is not archived with this disk")
    inum, dev = struct.unpack_from("<II", ext_sb, 0xE0)
    if dev:
        raise JournalError("the journal is on an external device, which is not archived with this disk")
    return inum


def replay(read_block, nblocks):
    """{fs block: bytes} of the committed, unrevoked transactions of the journal.

    read_block(i) returns journal block i (of the journal inode's nblocks);
    an empty dict means there is nothing to replay.
    """
    sb = read_block(0)
    magic, btype = struct.unpack_from(">II", sb, 0)
    if magic != MAGIC or btype not in (SB_V1, SB_V2):
        raise JournalError("no jbd2 journal superblock in the journal inode")
    bs, maxlen, first, seq, start = struct.unpack_from(">IIIII", sb, 12)
    if start == 0:
        return {}
    if len(sb) != bs or maxlen > nblocks or not 0 < first < maxlen:
        raise JournalError(f"inconsistent journal superblock (block size {bs}, length {maxlen}, first {first})")
    incompat = struct.unpack_from(">I", sb, 40)[0] if btype == SB_V2 else 0
    if incompat & INCOMPAT_FAST_COMMIT:
        # The fast-commit area takes the end of the journal; the log wraps before it.
        maxlen -= struct.unpack_from(">I", sb, 0x54)[0] or 256
    if not first <= start < maxlen:
        raise JournalError(f"the journal's start {start} is outside its log ({first}..{maxlen - 1})")
    big = incompat & INCOMPAT_64BIT
    csum = incompat & (INCOMPAT_CSUM_V2 | INCOMPAT_CSUM_V3)
    if incompat & INCOMPAT_CSUM_V3:
        tag_size = 16
    else:
        tag_size = 8 + (4 if big else 0) + (2 if csum else 0)

    def nxt(b):
        b += 1
        return first if b >= maxlen else b

    transactions = []            # [(seq, [(fs block, journal block, escaped)])]
    revoked = {}                 # fs block -> highest sequence that revoked it
    blk, tags, rev, steps = start, [], [], 0
    while steps < maxlen:
        data = read_block(blk)
        magic, btype, bseq = struct.unpack_from(">III", data, 0)
        if magic != MAGIC or bseq != seq:
            break                # the end of the log: what follows was never committed
        steps += 1
        if btype == DESCRIPTOR:
            end = bs - (4 if csum else 0)
            off = 12
            while off + tag_size <= end:
                if incompat & INCOMPAT_CSUM_V3:
                    lo, flags, hi = struct.unpack_from(">III", data, off)
                else:
                    lo, _, flags = struct.unpack_from(">IHH", data, off)
                    hi = struct.unpack_from(">I", data, off + 8)[0] if big else 0
                off += tag_size
                if not flags & FLAG_SAME_UUID:
                    off += 16
                blk = nxt(blk)
                steps += 1
                tags.append(((hi << 32 | lo) if big else lo, blk, flags & FLAG_ESCAPE))
                if flags & FLAG_LAST_TAG:
                    break
        elif btype == REVOKE:
            count = struct.unpack_from(">I", data, 12)[0]
            size = 8 if big else 4
            for off in range(16, min(count, bs) - size + 1, size):
                rev.append(struct.unpack_from(">Q" if big else ">I", data, off)[0])
        elif btype == COMMIT:
            transactions.append((seq, tags))
            for b in rev:
                revoked[b] = max(revoked.get(b, seq), seq)
            seq = (seq + 1) & 0xFFFFFFFF
            tags, rev = [], []
        else:
            break
        blk = nxt(blk)
    out = {}
    for tseq, ttags in transactions:
        for fsblk, jblk, escaped in ttags:
            if revoked.get(fsblk, -1) >= tseq:
                continue
            data = read_block(jblk)
            if escaped:
                data = struct.pack(">I", MAGIC) + data[4:]
            out[fsblk] = data
    return out
