"""Log lines for whoever reads them: a terminal, or systemd's journal.

Under systemd, stderr is a stream to journald (JOURNAL_STREAM names its
device and inode); each line then starts with a `<N>` syslog priority,
which journald strips and records, so `journalctl -p err` finds the
failures. Nothing else changes: one line per event, and the progress bars
stay off because stderr is not a terminal.
"""

import logging
import os
import sys

PRIORITY = {logging.CRITICAL: 2, logging.ERROR: 3, logging.WARNING: 4, logging.INFO: 6, logging.DEBUG: 7}


def to_journal(stream=None):
    """True when `stream` (default stderr) is the journal's stream for this service."""
    want = os.environ.get("JOURNAL_STREAM", "")
    try:
        dev, ino = (int(x) for x in want.split(":"))
        st = os.fstat((stream or sys.stderr).fileno())
    except (ValueError, OSError, AttributeError):
        return False
    return (st.st_dev, st.st_ino) == (dev, ino)


class JournalFormatter(logging.Formatter):
    def format(self, record):
        prio = PRIORITY.get(record.levelno, 6)
        return "\n".join(f"<{prio}>{line}" for line in super().format(record).splitlines() or [""])


def setup(verbose=False):
    level = logging.DEBUG if verbose else logging.INFO
    h = logging.StreamHandler(sys.stderr)
    if to_journal():
        h.setFormatter(JournalFormatter("%(name)s: %(message)s"))
    elif sys.stderr.isatty():
        h.setFormatter(logging.Formatter("%(message)s"))
    else:
        h.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level, handlers=[h])


def error(message):
    """The one line a failed command ends with."""
    prefix = f"<{PRIORITY[logging.ERROR]}>" if to_journal() else ""
    print(f"{prefix}foundation: {message}", file=sys.stderr)
