"""The config file, TOML, by default /etc/foundation/foundation.toml.

    store = "/mnt/backup/foundation"      # the store directory on the backup disk
    key_file = "/etc/foundation/keys/<store uuid>.key"
    libvirt_uri = "qemu:///system"
    vms = "all"                           # or a list of VM names: ["desktop", "web"]
    exclude = ["scratch"]                 # never archived, even with "all" or --all
    state_dir = "/var/lib/foundation"     # the archiver's journal and locks (on the host, not the store)
    quiesce = "auto"                      # auto | always | never: freeze guest file systems through the QEMU guest agent
    notify = "auto"                       # or "never": desktop notifications of failed nights and stale VMs
    stale_days = 2                        # a VM whose last good archive is older is reported (status, notify)
    snapshot_group = "libvirt"            # who may read /snapshot and is notified (default: libvirt's group)
    list_files = true                     # after each archive, add the night to `find`'s file listings

    [replica]                             # a table for another part of Foundation: kept as is
    ...

Every key is optional. A misspelt top-level key is an error naming it, so
a typo never silently turns a setting off; tables are handed unchecked to
the part of Foundation that owns them (`conf.section("replica")`).
Relative paths are relative to the config file's directory.
"""

import os
import re

from foundation.errors import BadInput
from foundation.fields import Fields

DEFAULT_PATH = "/etc/foundation/foundation.toml"
ENV = "FOUNDATION_CONFIG"
# auto: quiesced when the guest agent answers, else crash-consistent (said so);
# always: a running VM whose agent cannot freeze is not archived; never: no freeze.
QUIESCE_MODES = ("auto", "always", "never")


class ConfigError(BadInput):
    """Config file {}: {}"""

    code = 31


class Config(Fields):
    """The settings: Config(name=value, ...) sets any of them; the class's values are the defaults."""

    path = None
    store = None
    key_file = None
    libvirt_uri = "qemu:///system"
    vms = "all"               # "all" or a list of names
    state_dir = "/var/lib/foundation"
    quiesce = "auto"          # auto | always | never (QUIESCE_MODES)
    list_files = True         # `archive` updates the file listings `find` searches
    clones_dir = None         # where `boot` puts clone overlays (default <state_dir>/clones)
    notify = "auto"
    stale_days = 2
    snapshot_group = None     # None: libvirt's own group (see foundation.access)

    def __init__(self, exclude=(), sections=None, **settings):
        self.exclude = list(exclude)
        self.sections = dict(sections or {})   # tables of the file, by name
        self._set(settings)

    def section(self, name):
        """A table of the file (dict), empty if absent."""
        return self.sections.get(name, {})


_PATHS = ("store", "key_file", "state_dir", "clones_dir")
_TYPES = {"store": str, "key_file": str, "libvirt_uri": str, "state_dir": str,
          "clones_dir": str, "notify": str, "stale_days": (int, float), "snapshot_group": str,
          "list_files": bool}


def load_config(path=None):
    """The configuration from `path`, $FOUNDATION_CONFIG or the default file.

    A missing default file means the defaults; a file named explicitly must exist.
    """
    explicit = path or os.environ.get(ENV)
    path = explicit or DEFAULT_PATH
    conf = Config()
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        if explicit:
            raise ConfigError(path, "no such file") from None
        return conf
    except OSError as e:
        raise ConfigError(path, f"cannot read it: {e.strerror or e}") from None
    import tomllib  # here: without a config file (the default) every command's start would pay it

    try:
        data = tomllib.loads(raw.decode())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(path, f"not valid TOML: {e}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(path, f"not UTF-8 text (byte {e.start} cannot be read): save it as UTF-8") from None
    conf.path = os.path.abspath(path)
    here = os.path.dirname(conf.path)
    known = set(_TYPES) | {"vms", "exclude", "quiesce"}
    for key, value in data.items():
        if isinstance(value, dict):
            conf.sections[key] = value
            continue
        if key not in known:
            raise ConfigError(path, f"unknown setting {key!r} (known: {', '.join(sorted(known))})")
        if key == "quiesce":
            if quiesce_mode(value) is None:
                raise ConfigError(path, f'quiesce must be "auto", "always" or "never" (or true/false), not {value!r}')
            value = quiesce_mode(value)
        elif key in _TYPES and (not isinstance(value, _TYPES[key]) or isinstance(value, bool) != (_TYPES[key] is bool)):
            kind = "number" if key == "stale_days" else _TYPES[key].__name__
            raise ConfigError(path, f"{key} must be a {kind}, not {value!r}")
        if key == "notify" and value not in ("auto", "never"):
            raise ConfigError(path, f'notify must be "auto" or "never", not {value!r}')
        if key == "stale_days" and not value > 0:
            raise ConfigError(path, f"stale_days must be a positive number of days, not {value!r}")
        if key == "vms" and not (value == "all" or _names(value)):
            raise ConfigError(path, f'vms must be "all" or a list of VM names, not {value!r}')
        if key == "exclude" and not (_names(value) or value == []):
            raise ConfigError(path, f"exclude must be a list of VM names, not {value!r}")
        if key in _PATHS:
            value = os.path.join(here, os.path.expanduser(value))
        setattr(conf, key, value)
    return conf


def quiesce_mode(value):
    """"auto", "always" or "never" from a setting; true/false (once a bool) mean auto/never; else None."""
    if value is True or value is False:
        return "auto" if value else "never"
    return value if value in QUIESCE_MODES else None


def _names(v):
    return isinstance(v, list) and bool(v) and all(isinstance(x, str) and x for x in v)


_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*(?:([KMGT])(?:i?B)?|B)?", re.I)
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text):
    """Bytes from a size: the one grammar of every size Foundation reads (docs/operation.md §2).

    A non-negative int, or a string: a number (digits, optionally a fraction) then optionally a unit
    K, M, G or T, each a power of 1024 and optionally followed by "B" or "iB", or a bare "B":
    4096, "16M", "16 MiB", "1.5G", "512KB", "100B". Case does not matter. The result must be a
    whole number of bytes ("1.5" and "0.3K" are refused). ValueError (naming the text) otherwise.
    """
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 0:
            raise ValueError(f"not a size: {text!r} (a size is never negative)")
        return text
    m = _SIZE.fullmatch(text.strip()) if isinstance(text, str) else None
    if not m:
        raise ValueError(f"not a size: {text!r} (use e.g. 4096, 512K, 16M, 2G or 1T; K/M/G/T are powers of 1024)")
    number, unit = m.group(1), (m.group(2) or "").upper()
    whole, _, frac = number.partition(".")
    scaled = int(whole) * _UNITS[unit] + (int(frac) * _UNITS[unit] // 10 ** len(frac) if frac else 0)
    if frac and int(frac) * _UNITS[unit] % 10 ** len(frac):
        raise ValueError(f"not a size: {text!r} (it is not a whole number of bytes)")
    return scaled

