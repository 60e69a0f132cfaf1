"""Replica settings: the [replicas.NAME] tables of the config file, or a URL on the command line.

    [replicas.offsite]
    url = "s3://bucket/some/prefix"
    endpoint = "http://127.0.0.1:9000"   # default: AWS; env AWS_ENDPOINT_URL
    region = "us-east-1"                  # env AWS_REGION / AWS_DEFAULT_REGION
    access_key = "..."                    # env AWS_ACCESS_KEY_ID (else boto3's own search)
    secret_key = "..."                    # env AWS_SECRET_ACCESS_KEY
    parallel = 4                          # objects (and parts of one large object) in flight at once
    multipart_threshold = "64M"           # larger objects go up in parallel parts, smaller in one PUT
    bandwidth = "2M"                      # bytes/s, a size (foundation.config.parse_size); optional
    [replicas.hosting]
    url = "ftps://user@ftp.example.com:2121/backups/foundation"
    password = "..."                      # or in the URL, or FOUNDATION_FTP_PASSWORD, or ~/.netrc
    ca_file = "/path/ca.pem"              # verify the server certificate against it
    insecure = false                      # true: accept any certificate (warned about)
    [replicas.nas]
    url = "file:///mnt/nas/foundation"    # a directory that must exist (a mounted share)

`timeout` (seconds, default 60) and `allow_plaintext` (true: an unencrypted
store may be replicated there; default false) are accepted by every table. Every setting
is checked here, and a key not meant for the table's kind of URL is an
error naming it: a typo must not silently turn a setting off. A password
or secret key, wherever it comes from, is never part of `spec.url` or of
any message.
"""

import logging
import netrc
import os
import re
from dataclasses import dataclass, field
from urllib.parse import quote, unquote, urlsplit

from foundation.config import ConfigError, parse_size
from foundation.replica.backend import BadReplicaURL

log = logging.getLogger(__name__)

SCHEMES = ("file", "ftp", "ftps", "s3")
DEFAULT_TIMEOUT = 60.0
DEFAULT_PARALLEL = 4
DEFAULT_MULTIPART_THRESHOLD = 64 << 20
MIN_PART = 5 << 20                 # S3's smallest part (but the last)
PASSWORD_ENV = "FOUNDATION_FTP_PASSWORD"

_COMMON = {"url": str, "bandwidth": (str, int), "timeout": (int, float), "allow_plaintext": bool}
_KEYS = {
    "file": {},
    "ftp": {"password": str},
    "ftps": {"password": str, "ca_file": str, "insecure": bool},
    "s3": {"endpoint": str, "region": str, "access_key": str, "secret_key": str,
           "ca_file": str, "insecure": bool, "parallel": int, "multipart_threshold": (str, int)},
}
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")


@dataclass
class ReplicaSpec:
    name: str                        # the table's name ("" for a URL given on the command line)
    url: str                         # the URL without any password: for messages
    scheme: str                      # "file", "ftp", "ftps" or "s3"
    path: str = ""                   # file: the directory; ftp: the remote directory; s3: the key prefix
    host: str = ""
    port: int = 0
    user: str = ""
    password: str = field(default="", repr=False)
    bucket: str = ""
    endpoint: str | None = None
    region: str = "us-east-1"
    access_key: str | None = None
    secret_key: str | None = field(default=None, repr=False)
    ca_file: str | None = None
    insecure: bool = False
    bandwidth: int | None = None     # bytes per second
    timeout: float = DEFAULT_TIMEOUT
    allow_plaintext: bool = False    # may an unencrypted store be replicated here (foundation.replica.sync)
    parallel: int = 1                # transfers one backend runs at once (s3: DEFAULT_PARALLEL)
    multipart_threshold: int = DEFAULT_MULTIPART_THRESHOLD   # s3: larger objects go up in parts


def replicas_from_config(conf):
    """The replicas of the config file's [replicas.NAME] tables, in file order."""
    tables = conf.section("replicas")
    if not isinstance(tables, dict):
        raise ConfigError(conf.path, "replicas must be tables: [replicas.NAME] with url = ...")
    specs = []
    here = os.path.dirname(conf.path) if conf.path else os.getcwd()
    for name, table in tables.items():
        where = f"[replicas.{name}]"
        if not isinstance(table, dict):
            raise ConfigError(conf.path, f"replicas.{name} must be a table ({where} with url = ...)")
        if "url" not in table:
            raise ConfigError(conf.path, f"{where} has no url (ftp://, ftps://, s3:// or file:///)")
        options = dict(table)
        if isinstance(options.get("ca_file"), str):
            options["ca_file"] = os.path.join(here, os.path.expanduser(options["ca_file"]))
        try:
            specs.append(_build(options.pop("url"), options, name, where))
        except BadReplicaURL as e:
            raise ConfigError(conf.path, e.args[1]) from None
    return specs


def spec_from_url(url, name="", **options):
    """A ReplicaSpec from a URL (`--from URL`) and the same options a [replicas.NAME] table takes."""
    return _build(url, options, name, "")


def find_replica(conf, name_or_url):
    """The configured replica of that name, else the replica at that URL."""
    for spec in replicas_from_config(conf):
        if spec.name == name_or_url:
            return spec
    if "://" not in name_or_url and ":" not in name_or_url:
        known = ", ".join(s.name for s in replicas_from_config(conf)) or "none"
        raise BadReplicaURL(name_or_url, f"no replica of that name in the config file (configured: {known}), "
                                         "and not a URL (ftp://, ftps://, s3:// or file:///)")
    return spec_from_url(name_or_url)


def parse_bandwidth(value):
    """Bytes per second: a size (foundation.config.parse_size), optionally followed by "/s":
    2097152, "2M", "500K", "1.5 MiB/s"; None for 0 or "" (no limit)."""
    if isinstance(value, str):
        value = value.strip().removesuffix("/s")
        if value.strip() == "":
            return None
    return parse_size(value) or None


def _build(url, options, name, where):
    def bad(problem):   # a mistyped URL may still carry user:password@: never echoed
        text = f"{where + ' ' if where else ''}{problem}"
        if isinstance(url, str) and url:
            text = text.replace(url, _mask(url))
        raise BadReplicaURL(_redact(clean or where or "URL"), _redact(text))

    clean = ""
    if not isinstance(url, str) or not url:
        bad("url must be a string such as ftps://user@host/dir, s3://bucket/prefix or file:///dir")
    try:
        u = urlsplit(url)
        port = u.port
    except ValueError:   # its message may quote a piece of the password
        bad("url is not a valid URL (check the host and the port)")
    scheme = u.scheme.lower()
    if scheme not in SCHEMES:
        bad(f"url must start with ftp://, ftps://, s3:// or file:///, not {u.scheme + '://' if u.scheme else url!r}")
    clean = _mask(_clean(u, scheme))   # a password left in a mistyped URL's path goes too
    if u.query or u.fragment:
        bad("url must not have a query (?...) or fragment (#...); give settings as keys of the table")
    allowed = {**_COMMON, **_KEYS[scheme]}
    for key, value in options.items():
        if key not in allowed:
            bad(f"unknown setting {key!r} for a {scheme}:// replica (known: {', '.join(sorted(allowed))})")
        if isinstance(value, bool) and allowed[key] is not bool or not isinstance(value, allowed[key]):
            kind = {str: "a string", bool: "true or false", (str, int): "a number or a string such as \"2M\""
                    }.get(allowed[key], "a number")
            bad(f"{key} must be {kind}, not {value!r}")
    spec = ReplicaSpec(name=name, url=clean, scheme=scheme)
    if "bandwidth" in options:
        try:
            spec.bandwidth = parse_bandwidth(options["bandwidth"])
        except ValueError:
            bad(f"bandwidth must be bytes per second such as 2000000, \"500K\" or \"2M\", not {options['bandwidth']!r}")
    if "timeout" in options:
        if not options["timeout"] > 0:
            bad(f"timeout must be a positive number of seconds, not {options['timeout']!r}")
        spec.timeout = float(options["timeout"])
    spec.ca_file = options.get("ca_file")
    spec.insecure = options.get("insecure", False)
    spec.allow_plaintext = options.get("allow_plaintext", False)
    if spec.ca_file and not os.path.isfile(spec.ca_file):
        bad(f"ca_file {spec.ca_file} does not exist")
    if spec.ca_file and spec.insecure:
        bad("ca_file and insecure = true contradict each other: keep one")
    if spec.insecure:
        log.warning("replica %s: insecure = true, the server's certificate is not checked: "
                    "anyone on the path can pose as the server", clean)

    if scheme == "file":
        if u.netloc not in ("", "localhost"):
            bad("a file:// URL names a local directory: file:///path (three slashes)")
        spec.path = os.path.normpath(unquote(u.path))
        if not u.path.startswith("/"):
            bad("a file:// URL needs an absolute path: file:///path")
    elif scheme in ("ftp", "ftps"):
        if not u.hostname:
            bad(f"url has no host name: {scheme}://user@host[:port]/dir")
        spec.host, spec.port = u.hostname, port or 21
        spec.path = unquote(u.path).rstrip("/")
        spec.user = unquote(u.username or "")
        spec.password = (options.get("password") or unquote(u.password or "")
                         or os.environ.get(PASSWORD_ENV, ""))
        if not spec.password:
            spec.user, spec.password = _netrc(spec.host, spec.user)
        if not spec.user:
            spec.user, spec.password = "anonymous", spec.password or "anonymous@"
    else:
        if u.username or u.password or port:
            bad("an s3:// URL is s3://bucket/prefix: give the endpoint and keys as settings, not in the URL")
        if not _BUCKET.fullmatch(u.hostname or ""):
            bad(f"{u.netloc!r} is not a valid bucket name (3-63 characters: a-z 0-9 . -)")
        spec.bucket = u.hostname
        spec.path = unquote(u.path).strip("/")
        env = os.environ.get
        spec.endpoint = options.get("endpoint") or env("AWS_ENDPOINT_URL_S3") or env("AWS_ENDPOINT_URL")
        if spec.endpoint and urlsplit(spec.endpoint).scheme not in ("http", "https"):
            bad(f"endpoint must be an http:// or https:// URL, not {spec.endpoint!r}")
        spec.region = options.get("region") or env("AWS_REGION") or env("AWS_DEFAULT_REGION") or "us-east-1"
        spec.access_key = options.get("access_key") or env("AWS_ACCESS_KEY_ID")
        spec.secret_key = options.get("secret_key") or env("AWS_SECRET_ACCESS_KEY")
        spec.parallel = options.get("parallel", DEFAULT_PARALLEL)
        if not 1 <= spec.parallel <= 64:
            bad(f"parallel must be a number of transfers from 1 to 64, not {spec.parallel!r}")
        if "multipart_threshold" in options:
            try:
                spec.multipart_threshold = parse_size(options["multipart_threshold"])
            except ValueError as e:
                bad(f"multipart_threshold: {e}")
            if spec.multipart_threshold < MIN_PART:
                bad(f"multipart_threshold must be at least 5M (S3's smallest part), "
                    f"not {options['multipart_threshold']!r}")
        if bool(spec.access_key) != bool(spec.secret_key):
            bad("give both access_key and secret_key (or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY), or neither")
    return spec


_SECRET = re.compile(r"(?<=:)[^/:@\s]+(?=@)")   # the password of a user:password@ anywhere


def _redact(text):
    return _SECRET.sub("***", text)


def _mask(url):
    """url with everything between its user name and its last "@" hidden (a password may hold "/")."""
    head, at, tail = url.rpartition("@")
    if not at:
        return url
    pre, sep, cred = head.rpartition("//") if "//" in head else ("", "", head)
    user, colon, _ = cred.partition(":")
    return f"{pre}{sep}{user}{':***' if colon else ''}@{tail}"


def _clean(u, scheme):
    """The URL without its password."""
    netloc = u.netloc.rpartition("@")[2]
    if u.username:
        netloc = quote(unquote(u.username), safe="") + "@" + netloc
    return f"{scheme}://{netloc}{u.path}"


def _netrc(host, user):
    """(user, password) for host from ~/.netrc, or (user, "") when it has none."""
    try:
        auth = netrc.netrc().authenticators(host)
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return user, ""
    if not auth or (user and auth[0] and auth[0] != user):
        return user, ""
    return user or auth[0], auth[2] or ""
