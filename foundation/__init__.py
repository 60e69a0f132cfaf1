"""Foundation: every day of your virtual machines, kept on one USB disk.

Layers, top to bottom; each imports only from the layers below it
(pyproject.toml's [tool.importlinter] contracts, checked by the tests):
    cli/         the `foundation` command, one module per subcommand
    replica/ | notify.py
                 copies of the arenas on FTP, FTPS, S3 or a mounted directory;
                 desktop notices of a failed night or a stale VM
    gc/ | snapshotfs/ | vm/
                 garbage collection; the /snapshot FUSE tree and booting
                 past days; the libvirt archiver (none imports another)
    catalog/     the system catalog: (vm, time) -> disk tree roots
    image/       disk image <-> Merkle tree of block refs (in a store)
    store/       the content-addressed store: arenas, index, Bloom filter
    crypto/ | config.py
                 keys, AES-CTR and the hierarchical HMAC; the config file
    native/      the C core (csrc/) and its pure-Python reference
    errors.py | faults.py | access.py | warmup.py
                 every error and its exit code; the crash tests' crash points;
                 the group that may see the VMs' past; a command's first reads
                 asked of the disk at once
"""

__version__ = "0.1.0"
