"""Swap areas found from the partition table, archived as zeros (paper §2).

Only the MBR (with logical partitions) and the GPT header and entries are
parsed, with struct, from the disk as it was at the snapshot. A partition
is swap if its type says so (MBR 0x82, GPT 0657FD6D-A4AB-43C4-84E5-0933C84B4F4F)
or if it carries the Linux swap signature ("SWAPSPACE2" at byte 4086); a
disk without a partition table is checked for the signature at its start.

Two cases are never zeroed, because the bytes matter: a swap area holding a
hibernation image (signature S1SUSPEND, S2SUSPEND, ULSUSPEND, LINHIB...), and
an 0x82 partition holding a Solaris label (Solaris x86 used the same type
byte). When the area has a swap header its first 4 KiB page is kept, so a
restored or booted image still finds a valid, empty swap area by UUID.
Swap *files* inside file systems are not looked for (they would need the
file system's block map); they are archived like any other file.
"""

import struct

SECTOR = 512
PAGE = 4096
SIG_OFF = PAGE - 10
SWAP_SIGS = (b"SWAPSPACE2", b"SWAP-SPACE")
MBR_SWAP = 0x82
MBR_EXTENDED = (0x05, 0x0F, 0x85)
MBR_GPT = 0xEE
# the Linux swap type GUID 0657FD6D-A4AB-43C4-84E5-0933C84B4F4F as a GPT entry holds it (mixed-endian,
# uuid's bytes_le), compared as bytes: the uuid module (it imports platform) is not loaded a night for it
GPT_SWAP = bytes.fromhex("6dfd5706aba4c44384e50933c84b4f4f")
SOLARIS_SANITY = 0x600DDEEE
MAX_LOGICAL = 128
MAX_GPT_ENTRIES = 1024

MBR_ENTRY = struct.Struct("<B3sB3sII")      # status, chs, type, chs, first lba, sectors
GPT_HEADER = struct.Struct("<8sIIIIQQQQ16sQII")
GPT_ENTRY = struct.Struct("<16s16sQQQ72s")   # type, unique, first lba, last lba, attrs, name


def partitions(read, size):
    """(start, length, kind) of each partition; kind is "swap-type" or "" (other)."""
    mbr = read(0, SECTOR)
    if len(mbr) < SECTOR or mbr[510:512] != b"\x55\xaa":
        return []
    entries = [MBR_ENTRY.unpack_from(mbr, 446 + 16 * i) for i in range(4)]
    if any(e[2] == MBR_GPT for e in entries):
        return _gpt(read, size)
    out = []
    for _, _, ptype, _, lba, n in entries:
        if not n or not ptype:
            continue
        if ptype in MBR_EXTENDED:
            out += _logical(read, size, lba)
        else:
            out.append((lba * SECTOR, n * SECTOR, "swap-type" if ptype == MBR_SWAP else ""))
    return [p for p in out if p[0] + p[1] <= size]


def _logical(read, size, ext_lba):
    out = []
    ebr_lba = ext_lba
    for _ in range(MAX_LOGICAL):
        ebr = read(ebr_lba * SECTOR, SECTOR)
        if len(ebr) < SECTOR or ebr[510:512] != b"\x55\xaa":
            break
        _, _, ptype, _, lba, n = MBR_ENTRY.unpack_from(ebr, 446)
        if n and ptype:
            out.append(((ebr_lba + lba) * SECTOR, n * SECTOR, "swap-type" if ptype == MBR_SWAP else ""))
        _, _, ntype, _, nlba, nn = MBR_ENTRY.unpack_from(ebr, 462)
        if not nn or ntype not in MBR_EXTENDED or ext_lba + nlba <= ebr_lba:
            break
        ebr_lba = ext_lba + nlba
    return out


def _gpt(read, size):
    for lbs in (SECTOR, 4096):
        hdr = read(lbs, GPT_HEADER.size)
        if len(hdr) == GPT_HEADER.size and hdr[:8] == b"EFI PART":
            break
    else:
        return []
    f = GPT_HEADER.unpack(hdr)
    entries_lba, count, esize = f[10], f[11], f[12]
    if esize < GPT_ENTRY.size or count > MAX_GPT_ENTRIES:
        return []
    table = read(entries_lba * lbs, count * esize)
    out = []
    for i in range(count):
        if (i + 1) * esize > len(table):
            break
        tguid, _, first, last, _, _ = GPT_ENTRY.unpack_from(table, i * esize)
        if tguid == bytes(16) or last < first:
            continue
        kind = "swap-type" if tguid == GPT_SWAP else ""
        out.append((first * lbs, (last - first + 1) * lbs, kind))
    return [p for p in out if p[0] + p[1] <= size]


def find_swap(read, size):
    """Ranges (offset, length) to archive as zeros, and a note per area for the catalog."""
    parts = partitions(read, size) or [(0, size, "")]
    zeros, notes = [], []
    for start, length, kind in parts:
        if length <= PAGE:
            continue
        page = read(start, PAGE)
        sig = page[SIG_OFF:PAGE]
        hibernated = sig.rstrip(b"\0").endswith(b"SUSPEND") or sig.startswith(b"LINHIB")
        swap_sig = sig in SWAP_SIGS
        if hibernated:
            notes.append({"offset": start, "length": length, "kept": "hibernation image"})
            continue
        if kind == "swap-type" and not swap_sig and \
                struct.unpack_from("<I", page, SECTOR + 12)[0] == SOLARIS_SANITY:
            continue                      # a Solaris x86 partition, not Linux swap
        if not (swap_sig or kind == "swap-type"):
            continue
        skip = PAGE if swap_sig else 0    # keep the swap header: a valid, empty swap area
        zeros.append((start + skip, length - skip))
        notes.append({"offset": start, "length": length, "zeroed_from": start + skip})
    return zeros, notes
