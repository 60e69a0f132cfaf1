"""Replicas of the store's arenas on servers the user rents: FTP, FTPS, S3, or a mounted directory.

The backends (one module each) move objects; `backend.py` states the rules
they keep and wraps retries and a bandwidth limit around any of them.
"""

from foundation.replica.backend import (
    AuthFailed, Backend, BadReplicaURL, Permanent, RemoteError, RemoteFull, RemoteMissing,
    Retrying, Throttled, Transient, Unreachable, open_backend)
from foundation.replica.config import ReplicaSpec, find_replica, replicas_from_config, spec_from_url

__all__ = ["AuthFailed", "Backend", "BadReplicaURL", "Permanent", "RemoteError", "RemoteFull", "RemoteMissing",
           "Retrying", "Throttled", "Transient", "Unreachable", "open_backend",
           "ReplicaSpec", "find_replica", "replicas_from_config", "spec_from_url"]
