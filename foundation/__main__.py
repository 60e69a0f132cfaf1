import sys

from foundation import warmup

warmup.start(sys.argv[1:])  # before the imports below: the disk serves them and the store's first reads at once

from foundation.cli import console  # noqa: E402

sys.exit(console())
