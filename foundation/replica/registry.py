"""Which backend opens a replica URL: each backend registers a factory for its schemes.

As in restic's location registry, nothing here names a concrete backend:
ftp.py, s3.py and local.py import backend.py and register themselves, and
backend.py never imports them, so no import runs in a circle. The package
(foundation/replica/__init__.py) imports the backends Foundation ships.
"""

from foundation.replica.backend import Retrying, Throttled
from foundation.replica.errors import BadReplicaURL

_factories = {}       # URL scheme -> factory(spec) -> Backend


def register(factory, *schemes):
    """Open replicas whose URL has one of these schemes with factory(spec); a scheme has one factory."""
    for scheme in schemes:
        if scheme in _factories:
            raise ValueError(f"replica scheme {scheme}:// already opens with {_factories[scheme].__name__}; "
                             f"{factory.__name__} cannot take it too")
    _factories.update(dict.fromkeys(schemes, factory))


def registered():
    """{scheme: factory} of every registered backend."""
    return dict(_factories)


def open_backend(spec, attempts=5, backoff=0.5, max_backoff=30):
    """The backend a ReplicaSpec (foundation.replica.config) names, wrapped in Retrying (+Throttled)."""
    factory = _factories.get(spec.scheme)
    if factory is None:
        raise BadReplicaURL(spec.url, f"unknown scheme {spec.scheme!r} (known: {', '.join(sorted(_factories))})")
    b = factory(spec)
    if spec.bandwidth:
        b = Throttled(b, spec.bandwidth)
    return Retrying(b, attempts=attempts, backoff=backoff, max_backoff=max_backoff)
