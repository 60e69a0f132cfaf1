"""What the last replicate to each replica did, kept on the host for `foundation status`.

A replicate at the end of a nightly archive only warns when it fails, into
a journal few people read; so every attempt is written down in the state
directory (on the host: replicate writes nothing into the store) and
`status` shows it beside the time of the last success. Best effort: a
state directory that cannot be written loses the record, never the
replicate.

`<state_dir>/replicas.json`: {store uuid: {replica key: entry}}, the key
being the table's name or, for `--to URL`, the URL; an entry holds `url`,
`attempt` (ISO time), `ok`, `error`, and from the last success `success`,
`head` ([arena, offset] the replica then held) and `sent` (bytes).
"""

import json
import logging
import os
from datetime import datetime, timezone

from foundation.errors import Error
from foundation.store.disk import atomic_write, read_record

log = logging.getLogger(__name__)

FILE = "replicas.json"


def key(spec):
    return spec.name or spec.url


def record(state_dir, store, spec, result=None, error=None):
    """Write down one replicate of `spec` for store uuid `store`: its Result, or the error it raised."""
    path = os.path.join(state_dir, FILE)
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    try:
        runs = read_record(path)
        entry = runs.setdefault(store, {}).setdefault(key(spec), {})
        entry.update(url=spec.url, attempt=now, ok=error is None, error=str(error) if error else "")
        if error is None:
            entry.update(success=now, head=[result.head.arena, result.head.end], sent=result.bytes_sent)
        os.makedirs(state_dir, exist_ok=True)
        atomic_write(path, json.dumps(runs, indent=1, sort_keys=True).encode() + b"\n", sync=False)
    except (OSError, Error) as e:   # Error: StoreFull from a full host disk
        log.debug("replica run not recorded in %s: %s", path, e)


def load(state_dir, store):
    """{replica key: entry} of store uuid `store` ({} if nothing was recorded)."""
    return read_record(os.path.join(state_dir, FILE)).get(store, {})
