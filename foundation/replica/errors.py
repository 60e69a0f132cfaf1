"""The errors of replicas: the server's (exit 40-47 and 55) and what a replica holds (48-52, 54).

Every server failure is a RemoteError, so its codes are one family
(foundation/errors.py keeps the registry); a backend raises them and
backend.py states which are worth retrying. Replicate, audit and recover
raise the others. (recover's own refusal, 53, lives in recover.py.)
"""

from foundation.errors import Error


# ---- the server ---------------------------------------------------------------------------

class RemoteError(Error):
    """Replica {}: {}"""

    code = 40


class Transient(RemoteError):
    """Replica {}: {} (a temporary failure; it is tried again)."""

    code = 55


class Unreachable(RemoteError):
    """Replica {} cannot be reached: {}. Check that the server is up and that the host, port and URL in the [replicas.NAME] table are right, then run again; the local store is untouched."""

    code = 42


class Permanent(RemoteError):
    """Replica {}: {}"""

    code = 43


class AuthFailed(Permanent):
    """Replica {} refused the credentials: {}. Check the user name and password (FTP) or the access and secret keys (S3) in the [replicas.NAME] table or the environment."""

    code = 44


class RemoteFull(Permanent):
    """Replica {} is full: {}. Free space on the server or raise its quota, then run again; what was uploaded before is kept."""

    code = 45


class RemoteMissing(Permanent):
    """Replica {} has no object {}. Run `foundation audit` to see what the replica lacks; `foundation replicate` uploads it again."""

    code = 46


class BadReplicaURL(Permanent):
    """Replica {}: {}"""

    code = 47


# ---- what the replica holds -----------------------------------------------------------------

class ForeignReplica(Error):
    """Replica {} holds store {}, not this store ({}). Give every store its own URL (another directory or prefix); nothing was written."""

    code = 48


class NotAReplica(Error):
    """Replica {} is not empty and holds no Foundation replica (it has {}). Give an empty directory or prefix; nothing was written."""

    code = 49


class ReplicaTampered(Error):
    """Replica {}: {}. Do not trust it: `foundation audit` lists what is wrong, `foundation replicate` writes the replica again."""

    code = 50


class PlaintextRefused(Error):
    """Store {} is not encrypted, so replica {} would hold your data in the clear. Set allow_plaintext = true in its [replicas.NAME] table (or pass --allow-plaintext) only if the server is yours; nothing was sent."""

    code = 51


class ReplicaBusy(Error):
    """Another `foundation replicate` of store {} is running; wait for it to finish."""

    code = 52


class ReplicaAhead(Error):
    """Replica {} holds a newer state of this store (up to arena {} offset {}) than the local store (arena {} offset {}): the local store looks restored from an older copy. `foundation recover --from` that replica into a new directory brings the newer days back; `foundation replicate --force` makes the replica like the local store and drops them. Nothing was sent."""

    code = 54
