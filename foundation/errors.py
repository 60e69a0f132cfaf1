"""Errors that say what they mean for the user's data.

Every error a user can meet is a subclass of Error; its docstring is the
message template and `code` is the process exit status (borg's convention).
A damaged derived structure (index, summary, Bloom filter) is a different
class from damaged primary data (an arena): the first is repaired by
`foundation rebuild`, the second means data is lost or tampered with.

An exit code means one thing. Every code is registered here, at class
creation, to the first class that declares it; a class may share a code
only with an ancestor (every "not found" is a NotFound, exit 30), so
two unrelated errors can never meet under one code. docs/operation.md
lists every registered code; tests/test_errors.py holds the two together.
"""

CODES = {}      # exit code -> the class that owns it; its subclasses share it

SUCCESS, FAILED, INTERRUPTED = 0, 1, 130    # the CLI's statuses that are no Error


class Error(Exception):
    """Error: {}"""

    code = 2

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        owner = CODES.get(cls.code)
        if owner is None or _same(owner, cls):
            CODES[cls.code] = cls
        elif not issubclass(cls, owner):
            raise TypeError(f"exit code {cls.code} of {cls.__module__}.{cls.__qualname__} already belongs to "
                            f"{owner.__module__}.{owner.__qualname__}: take a free code, or derive from it")

    def __init__(self, *args):
        super().__init__(*args)
        self.args = args

    def __str__(self):
        return self.__doc__.format(*self.args).strip()


class UsageError(Error):
    """{}"""

    code = 2


class StoreMissing(Error):
    """Store {} does not exist or is not mounted. Plug in and mount the backup disk, or create a store with `foundation init`."""

    code = 10


class StoreNotEmpty(Error):
    """Refusing to create a store in {}: the directory is not empty. Choose an empty directory."""

    code = 11


class StoreLocked(Error):
    """Store {} is in use by another Foundation process (pid {}). Wait for it to finish."""

    code = 12


class StoreBusy(Error):
    """{}"""

    code = 15


class WrongKey(Error):
    """{}"""

    code = 13


class KeyMissing(Error):
    """{}"""

    code = 14


class DataCorrupt(Error):
    """Archived data is damaged: {}. Run `foundation verify` to list every damaged record; a replica can restore the arena."""

    code = 20


class DerivedCorrupt(Error):
    """A rebuildable structure is damaged: {}. Run `foundation rebuild`."""

    code = 21


class StoreFull(Error):
    """The store disk is full while writing {}. Nothing after the last completed snapshot was kept; free space or use a larger disk, then run again."""

    code = 22


class NotFound(Error):
    """{}"""

    code = 30


class BadInput(Error):
    """{}"""

    code = 31


class FilesUnreadable(Error):
    """{}: the guest file system cannot be read ({}). Nothing is reported for it; `foundation verify` tells whether the archive is damaged."""

    code = 70


def _same(a, b):
    """The same class defined again (a module imported twice), not a second owner."""
    return (a.__module__, a.__qualname__) == (b.__module__, b.__qualname__)
