import sys

from foundation.cli import main

sys.exit(main())
