"""The foundation(1) manual page, generated from the argument parser (argparse-manpage).

The page is the --help of every subcommand, so it cannot drift from the
command; scripts/setup.sh installs it. Run as a module:

    python3 -m foundation.cli.manpage [OUTFILE]        # default: stdout
"""

import sys

from foundation import __version__


def manpage():
    from build_manpages.manpage import Manpage

    from foundation.cli import parser

    m = Manpage(parser())
    m.description = "keep every day of your libvirt/QEMU virtual machines on one disk"
    m.source = f"foundation {__version__}"
    m.manual = "Foundation manual"
    return str(m)


if __name__ == "__main__":
    text = manpage()
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
