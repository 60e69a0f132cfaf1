"""The nightly VM archiver: libvirt external snapshots, changed clusters, block-commit, journal.

Paper §2.2 and Figure 2, on libvirt/QEMU. `archiver.py` holds the run and
its crash-repair table; `domain.py` the libvirt side
(`foundation.image.qemuimg` runs the image tool); `source.py` reads a frozen disk; `swap.py` finds swap areas;
`journal.py` the per-VM journal and lock; `sink.py` where snapshots go.
"""

from foundation.vm.archiver import Archiver, Result
from foundation.vm.domain import all_names, connect
from foundation.vm.sink import DirSink, StoreSink

__all__ = ["Archiver", "Result", "DirSink", "StoreSink", "all_names", "connect"]
