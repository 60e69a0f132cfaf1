"""Swap areas found from MBR and GPT partition tables are archived as zeros (paper §2)."""

import struct
import uuid
import zlib

import pytest

from foundation.vm.swap import find_swap
from test_vm_support import DiskSpec, dir_archive, libvirt_conn, make_vm, vm_dir  # noqa: F401 (fixtures)

MiB = 1 << 20
SWAP_GUID = uuid.UUID("0657FD6D-A4AB-43C4-84E5-0933C84B4F4F")
LINUX_GUID = uuid.UUID("0FC63DAF-8483-4772-8E79-3D69D8477DE4")


def mbr_entry(ptype, lba, sectors):
    return struct.pack("<B3sB3sII", 0, b"\0" * 3, ptype, b"\0" * 3, lba, sectors)


def with_mbr(disk, entries):
    disk[446:446 + 64] = b"".join(entries) + bytes(64 - 16 * len(entries))
    disk[510:512] = b"\x55\xaa"


def swap_header(disk, start, sig=b"SWAPSPACE2"):
    disk[start + 4086:start + 4096] = sig
    disk[start + 4096:start + 8 * 4096] = b"\xee" * (7 * 4096)   # "swapped-out pages"


def read_of(disk):
    return lambda off, n: bytes(disk[off:off + n])


def test_mbr_swap_partition_keeps_header_page():
    disk = bytearray(8 * MiB)
    with_mbr(disk, [mbr_entry(0x83, 2048, 4096), mbr_entry(0x82, 6144, 8192)])
    swap_header(disk, 6144 * 512)
    zeros, notes = find_swap(read_of(disk), len(disk))
    assert zeros == [(6144 * 512 + 4096, 8192 * 512 - 4096)]
    assert notes[0]["offset"] == 6144 * 512


def test_signature_alone_marks_swap_and_type_alone_too():
    disk = bytearray(8 * MiB)
    with_mbr(disk, [mbr_entry(0x83, 2048, 4096), mbr_entry(0x82, 6144, 8192)])
    swap_header(disk, 2048 * 512)                  # swap in a partition typed Linux
    zeros, _ = find_swap(read_of(disk), len(disk))
    assert zeros == [(2048 * 512 + 4096, 4096 * 512 - 4096), (6144 * 512, 8192 * 512)]


def test_hibernation_image_and_solaris_are_kept():
    disk = bytearray(8 * MiB)
    with_mbr(disk, [mbr_entry(0x82, 2048, 4096), mbr_entry(0x82, 6144, 8192)])
    swap_header(disk, 2048 * 512, b"S1SUSPEND\0")
    disk[6144 * 512 + 512 + 12:6144 * 512 + 512 + 16] = struct.pack("<I", 0x600DDEEE)
    zeros, notes = find_swap(read_of(disk), len(disk))
    assert zeros == []
    assert notes == [{"offset": 2048 * 512, "length": 4096 * 512, "kept": "hibernation image"}]


def test_logical_partition():
    disk = bytearray(16 * MiB)
    with_mbr(disk, [mbr_entry(0x83, 2048, 2048), mbr_entry(0x05, 8192, 16384)])
    # EBR 1 at 8192: logical 1 (Linux) at +2048, next EBR at ext+8192
    ebr1 = 8192 * 512
    disk[ebr1 + 446:ebr1 + 478] = mbr_entry(0x83, 2048, 2048) + mbr_entry(0x05, 8192, 8192)
    disk[ebr1 + 510:ebr1 + 512] = b"\x55\xaa"
    ebr2 = (8192 + 8192) * 512
    disk[ebr2 + 446:ebr2 + 462] = mbr_entry(0x82, 2048, 4096)
    disk[ebr2 + 510:ebr2 + 512] = b"\x55\xaa"
    start = (8192 + 8192 + 2048) * 512
    swap_header(disk, start)
    zeros, _ = find_swap(read_of(disk), len(disk))
    assert zeros == [(start + 4096, 4096 * 512 - 4096)]


def gpt_disk(parts, size=8 * MiB):
    disk = bytearray(size)
    with_mbr(disk, [mbr_entry(0xEE, 1, size // 512 - 1)])
    entries = bytearray(128 * 128)
    for i, (guid, first, last) in enumerate(parts):
        struct.pack_into("<16s16sQQQ72s", entries, i * 128, guid.bytes_le, uuid.uuid4().bytes_le,
                         first, last, 0, b"")
    hdr = struct.pack("<8sIIIIQQQQ16sQII", b"EFI PART", 0x10000, 92, 0, 0, 1, size // 512 - 1,
                      34, size // 512 - 34, uuid.uuid4().bytes_le, 2, 128, 128)
    disk[512:512 + len(hdr)] = hdr
    disk[1024:1024 + len(entries)] = entries
    struct.pack_into("<I", disk, 512 + 88, zlib.crc32(entries))
    return disk


def test_gpt_swap_partition():
    disk = gpt_disk([(LINUX_GUID, 2048, 4095), (SWAP_GUID, 4096, 12287)])
    swap_header(disk, 4096 * 512)
    zeros, _ = find_swap(read_of(disk), len(disk))
    assert zeros == [(4096 * 512 + 4096, 8192 * 512 - 4096)]


def test_unpartitioned_swap_disk_and_plain_disk():
    disk = bytearray(4 * MiB)
    swap_header(disk, 0)
    assert find_swap(read_of(disk), len(disk))[0] == [(4096, 4 * MiB - 4096)]
    assert find_swap(read_of(bytearray(4 * MiB)), 4 * MiB) == ([], [])


@pytest.mark.libvirt
def test_swap_partition_archived_as_zeros(make_vm, dir_archive):
    """A guest disk with a swap partition: its pages are archived as zeros, the rest byte for byte."""
    vm = make_vm([DiskSpec("vda", "raw", 8 * MiB)])
    head = bytearray(8 * MiB)
    with_mbr(head, [mbr_entry(0x83, 2048, 4096), mbr_entry(0x82, 6144, 8192)])
    vm.write_bytes("vda", 0, bytes(head[:512]))
    vm.write("vda", 0x33, 2048 * 512, 64 << 10)            # file system data
    sig = bytearray(4096)
    sig[4086:] = b"SWAPSPACE2"
    vm.write_bytes("vda", 6144 * 512, bytes(sig))
    vm.write("vda", 0xEE, 6144 * 512 + 4096, 1 * MiB)      # swapped-out pages
    assert dir_archive.run(vm.name).status == "ok"
    want = bytearray(vm.state()["vda"])
    want[6144 * 512 + 4096:] = bytes(len(want) - 6144 * 512 - 4096)
    vm.write("vda", 0xEF, 6144 * 512 + 8192, 4096)         # more swapping the next day
    vm.write("vda", 0x34, 2048 * 512, 4096)
    assert dir_archive.run(vm.name).status == "ok"
    want2 = bytearray(want)
    want2[2048 * 512:2048 * 512 + 4096] = b"\x34" * 4096
    dir_archive.check(vm.name, [{"vda": bytes(want)}, {"vda": bytes(want2)}])
    snaps = dir_archive.snapshots(vm.name)
    assert snaps[0]["meta"]["swap_zeroed"]["vda"][0]["offset"] == 6144 * 512
    vm.assert_healthy()



def test_gpt_swap_type_is_linux_swap():
    """The GPT type compared as bytes is the Linux swap GUID as a GPT entry stores it (mixed-endian)."""
    import uuid

    from foundation.vm import swap

    assert swap.GPT_SWAP == uuid.UUID("0657FD6D-A4AB-43C4-84E5-0933C84B4F4F").bytes_le
