import gc
import sys

from foundation import warmup

warmup.start(sys.argv[1:])  # before the imports below: the disk serves them and the store's first reads at once

from foundation.cli import main  # noqa: E402

code = main()
# Done: what the command wrote is closed (files opened for writing are always in `with` blocks).
# Frozen, the command's objects are skipped by the collections of the interpreter's exit, which
# otherwise walk all of them again (~10 ms of a night).
gc.freeze()
sys.exit(code)
