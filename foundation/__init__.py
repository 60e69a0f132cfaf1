"""Foundation: every day of your virtual machines, kept on one USB disk.

Layers, top to bottom (each talks only to the one below):
    cli/         the `foundation` command, one module per subcommand
    vm/          libvirt archiver: external snapshots, changed clusters, commit
    snapshotfs/  the /snapshot FUSE tree and booting past days
    image/       disk image <-> Merkle tree of block refs
    catalog/     the system catalog: (vm, time) -> disk tree roots
    store/       the content-addressed store: arenas, index, Bloom filter
    crypto/      keys, AES-CTR and the hierarchical HMAC
    native/      the C core (csrc/) and its pure-Python reference
"""

__version__ = "0.1.0"
