"""Catching a store that went back in time: the host remembers the newest commit it saw of each store.

A restored disk image, a copy made with rsync or a cloned USB disk is a
valid store, only an older one: every MAC verifies, so nothing in the
store itself can tell. The host can: it keeps, per store uuid, the newest
commit it has seen, and opening a store whose head lies before it is
refused to writers (nothing is written, not even a torn tail cut) and
reported to readers. The commit is compared as a log position, (arena,
end), and by the chain MAC of the arenas sealed before the recorded one
and the tag of the last record below it, which also catch an older copy
that was written on since: a position stays meaningful whatever form the
head file takes, and chain and tag name the log's history up to it.

A writer records the head it leaves behind, whatever it is (a
compare-by-value gc rewrites the log shorter, and accepting a rollback
moves the record back on purpose); a reader records only a newer one.
`<state_dir>/heads.json`: {store uuid: {"arena", "end", "chain", "last",
"tag", "seen", "from"}}; best effort, like the replicas' last
runs (a state directory that cannot be written loses protection, never
an archive). A host without an entry takes its first from the store's
replicas (foundation.replica.seed, `from` names the one). docs/format.md
§6.2.
"""

import json
import logging
import os
from datetime import datetime, timezone

from foundation.errors import Error
from foundation.fields import Fields
from foundation.store import format as F
from foundation.store.disk import atomic_write, read_record

log = logging.getLogger(__name__)

FILE = "heads.json"


class Seen(Fields):
    def __init__(self, arena, end, chain, when="", last=0, tag=b"", source=""):
        self.arena, self.end = arena, end
        self.chain = chain    # chain MAC of the arenas sealed before `arena`
        self.when = when
        self.last = last      # offset of the last record below `end` in `arena` (0: none)
        self.tag = tag        # and its tag
        self.source = source  # where the record came from when not from this host's own open ("replica NAME")


def position(head):
    return f"arena {head.arena} offset {head.end}"


def older(head, seen, chain_before, tag_at=lambda n, off: None):
    """Why the store whose head is `head` is older than the commit `seen`, or None if it is not.
    chain_before(n): the chain MAC of arenas 0..n-1 in the store; tag_at(n, off): the tag of the
    record at offset off of arena n (either None if it cannot be read). The chain covers the arenas
    sealed before the one seen open, the tag of its last record the bytes written into it."""
    if (head.arena, head.end) < (seen.arena, seen.end):
        return "older"
    chain = head.chain if head.arena == seen.arena else chain_before(seen.arena)
    if chain is not None and chain != seen.chain:
        return "other"
    if seen.last and tag_at(seen.arena, seen.last) not in (None, seen.tag):
        return "other"
    return None


def explain(path, head, seen, why):
    """The one-line message of a rollback `why` (from older())."""
    when = f" on {seen.when[:10]}" if seen.when else ""
    saw = f"{seen.source} holds" if seen.source else "this host saw"
    if why == "older":
        return (f"store {path}'s newest commit is {position(head)}, but {saw} {position(seen)}{when}: "
                "the disk holds an older copy (a restored image, an rsync copy, a cloned disk)")
    return (f"store {path} holds another history than the one {saw} at {position(seen)}{when}: "
            "the disk holds an older copy that was written to since (a restored image, a cloned disk)")


class Watch:
    """The host's record of the newest commit of each store, in state_dir."""

    def __init__(self, state_dir):
        self.path = os.path.join(state_dir, FILE)

    def seen(self, uuid, runs=None):
        e = (self._read() if runs is None else runs).get(uuid)
        try:
            return Seen(int(e["arena"]), int(e["end"]), bytes.fromhex(e["chain"]), str(e.get("seen", "")),
                        int(e.get("last", 0)), bytes.fromhex(e.get("tag", "")), str(e.get("from", "")))
        except (TypeError, KeyError, ValueError):
            return None

    def check(self, path, uuid, head, chain_before, tag_at):
        """The message if the store at path (head) is older than what this host saw, else None."""
        seen = self.seen(uuid)
        why = older(head, seen, chain_before, tag_at) if seen else None
        return explain(path, head, seen, why) if why else None

    def record(self, uuid, head, last=(0, b""), newer_only=False, source=""):
        """Remember `head` as the newest commit of store uuid, with `last` (offset, tag) of the last
        record below its end (with newer_only, only if it is newer than the one recorded); `source`:
        where it was seen, when not here (a replica's manifest)."""
        runs = self._read()
        old = self.seen(uuid, runs)
        if newer_only and old and (head.arena, head.end) <= (old.arena, old.end):
            return
        entry = {"arena": head.arena, "end": head.end, "chain": head.chain.hex(), "last": last[0],
                 "tag": last[1].hex()}
        if source:
            entry["from"] = source
        if old and {k: v for k, v in runs[uuid].items() if k != "seen"} == entry:
            return  # recorded already (a writer's open, mostly): the file is not rewritten
        runs[uuid] = dict(entry, seen=datetime.now(timezone.utc).isoformat(timespec="seconds"))
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            atomic_write(self.path, json.dumps(runs, indent=1, sort_keys=True).encode() + b"\n", sync=False)
        except (OSError, Error) as e:   # Error: StoreFull from a full host disk
            log.warning("the store's newest commit was not recorded in %s (%s): rollback goes unnoticed", self.path, e)

    def _read(self):
        return read_record(self.path)


def last_record(oa, end):
    """(offset, tag) of the last record of the open arena oa (arena.OpenArena) below end, or (0, b"")."""
    k = len(oa.addrs)
    while k and F.split(oa.addrs[k - 1])[1] >= end:
        k -= 1
    return (F.split(oa.addrs[k - 1])[1], bytes(oa.tags[(k - 1) * 16:k * 16])) if k else (0, b"")


def chain_reader(trailer):
    """chain_before(n) from trailer(n) (a Trailer or None): the chain a log has before arena n."""
    def chain_before(n):
        if n == 0:
            return F.ZERO_CHAIN
        tr = trailer(n - 1)
        return tr.chain if tr is not None else None
    return chain_before
