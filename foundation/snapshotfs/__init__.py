"""Reading the past: the /snapshot FUSE tree and booting any archived day.

The tree interprets archived disks on demand and never writes: a day's
disk is a raw image file read through image.ImageReader, its files are
read by foundation.guestfs from the same bytes, and a booted day is a libvirt
domain over new qcow2 overlays whose backing files are those raw images.
Paths resolve by TimeLine's rule (the latest snapshot not after the time
named), so every day is reachable though only real ones are listed.

    timeindex.py  time travel: which snapshot a path names
    archive.py    what the tree reads: a store (catalog + images), or raw files
    volumes.py    the guest file systems the tree reads (foundation.guestfs)
    tree.py       the pyfuse3 operations
    server.py     mount, serve, unmount
    clone.py      `boot`: clone XML, overlays, the clone marker
    testing.py    real test images and mounts for tests and benchmarks

See docs/snapshot-tree.md.
"""

MARKER = ".foundation"   # a file at the root of every mounted tree; `boot` checks for it
