"""Replicas of the store's arenas on servers the user rents: FTP, FTPS, S3, or a mounted directory.

The backends (one module each) move objects; `backend.py` states the rules
they keep and wraps retries and a bandwidth limit around any of them, and
each backend registers its URL schemes with `registry.py`.
"""

from foundation.replica import ftp, local, s3  # noqa: F401  (each registers its URL schemes)
from foundation.replica.backend import Backend, Retrying, Throttled
from foundation.replica.config import ReplicaSpec, find_replica, replicas_from_config, spec_from_url
from foundation.replica.errors import (
    AuthFailed, BadReplicaURL, Permanent, RemoteError, RemoteFull, RemoteMissing, Transient, Unreachable)
from foundation.replica.registry import open_backend

__all__ = ["AuthFailed", "Backend", "BadReplicaURL", "Permanent", "RemoteError", "RemoteFull", "RemoteMissing",
           "Retrying", "Throttled", "Transient", "Unreachable", "open_backend",
           "ReplicaSpec", "find_replica", "replicas_from_config", "spec_from_url"]
