"""Disk images <-> Merkle trees of block refs in the store (paper §7.1).

A day's image is a tree whose leaves are the refs of its blocks and whose
interior nodes are TREE blocks of refs; the next day shares every subtree
that did not change, so a snapshot costs only its new blocks and the paths
above them. Blobs (domain XML, NVRAM, the catalog) are the same trees over
arbitrary bytes. docs/format.md ("Image trees") has the byte layout.

    root = write_image(store, src, size, prev=None, changed=None, zeros=(), progress=None)
    ImageReader(store, root).read(offset, length)
    restore_image(store, root, path, fmt="raw"|"qcow2")
    write_blob(store, data) -> Root; read_blob(store, root) -> bytes
"""

from foundation.image.ranges import BadRanges, load_changed
from foundation.image.reader import ImageReader, RestoreFailed, read_blob, restore_image, write_raw
from foundation.image.shape import Root, Shape
from foundation.image.source import ImageUnreadable, open_image
from foundation.image.tree import BytesSource, write_blob, write_image

__all__ = [
    "BadRanges",
    "BytesSource",
    "ImageReader",
    "ImageUnreadable",
    "RestoreFailed",
    "Root",
    "Shape",
    "load_changed",
    "open_image",
    "read_blob",
    "restore_image",
    "write_blob",
    "write_image",
    "write_raw",
]
