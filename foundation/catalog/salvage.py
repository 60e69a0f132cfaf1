"""What damage costs, said in the user's terms: which VM, day and disk, which bytes of it.

Damage is found by arena and offset (verify, a salvage scan); a person
asks which days they lost. This walks every snapshot's trees once
(foundation.image.lost) and names, per day and disk, the byte ranges no
intact record holds. Only the days with a loss are named.

A lost newest CATALOG record need not lose the days it alone listed: the
record only names the catalog blob, whose tree was written just before it
(docs/format.md §11.4), and whose first bytes are always the catalog's
header line. So the newest tree in the log after the newest intact
CATALOG record whose first leaf starts with that header, and which parses
as a whole catalog, is the lost record's list, provided bytes were lost
after it (otherwise it is the list of a commit that never happened: a
crash before its record). `rebuild --salvage` commits it again.
"""

import json
import logging

from foundation.catalog import CATALOG, HEADER_LINE, Catalog, CatalogCorrupt, format_time
from foundation.errors import DataCorrupt, Error, NotFound
from foundation.image.lost import Losses, describe

log = logging.getLogger(__name__)

DATA, TREE = 1, 2  # foundation.store.BlockType
HEADER = json.dumps(HEADER_LINE, sort_keys=True, separators=(",", ":")).encode()[:30]  # every header line's start


def losses(store):
    """[(snapshot, disk, [(start, end)])] of every day that needs a lost block; raises if the catalog is lost."""
    out, seen = [], Losses(store)   # the days share most of their subtrees: each is looked at once
    for snap in Catalog.load(store).snapshots():
        for disk, entry in sorted(snap.disks.items()):
            ranges = seen.ranges(entry.root)
            if ranges:
                out.append((snap, disk, ranges))
    return out


def line(snap, disk, ranges):
    lost = sum(b - a for a, b in ranges)
    return f"{snap.name}@{format_time(snap.time)} disk {disk}: {lost:,} bytes lost (bytes {describe(ranges)})"


def newer_catalog_lost(store):
    """A line if bytes were lost after the newest catalog record that can be read: a newer catalog
    (and the days it named) may have been there, so the list may be short. Else None."""
    ref = store.latest(CATALOG)
    at = store.address(ref) if ref is not None else 0
    places = [(n, lo) for n, lo, _ in store.log.lost] + list(store.log.damaged) + [divmod(a, 1 << 32) for a in store.bad]
    after = sorted((n, lo) for n, lo in places if at is None or (n << 32 | lo) > at)
    if not after:
        return None
    n, lo = after[-1]
    return (f"the catalog in use is older than lost bytes (arena {n} offset {lo}): snapshots taken after "
            "the newest one listed may be lost with them")


def days_affected(store, damage=True):
    """Lines naming each lost day, disk and byte range; [] when nothing is damaged."""
    if not damage and not store.log.lost and not store.bad:
        return []
    try:
        out = [line(*x) for x in losses(store)]
        newer = newer_catalog_lost(store)
        return out + ([newer] if newer else [])
    except Error as e:
        return [f"the catalog cannot be read ({e}); which days are affected is unknown"]


# ---- a lost newest catalog, found again from its blob ----------------------------------------

def _records_after(store, at):
    """(address, type) of the DATA and TREE records after log address `at`, newest first."""
    lg, oa = store.log, store.log.open
    first = at >> 32
    for n in range(oa.n, first - 1, -1):
        if n in lg.missing:
            continue
        if n == oa.n:
            addrs, types = oa.addrs, oa.types
        else:
            try:
                _, addrs, types = store.summary_records(n)
            except DataCorrupt:
                continue
        for i in range(len(addrs) - 1, -1, -1):
            if addrs[i] <= at:
                return
            if types[i] in (DATA, TREE):
                yield addrs[i], types[i]


def _read(store, ref):
    """(type, data) of the record a ref names; DataCorrupt or NotFound if it cannot be read."""
    a = store.address(ref)
    if a is None:
        raise NotFound("no record holds the block")
    btype, _, data = store.log.read(a)
    return btype, bytes(data)


def _blob_text(store, btype, data):
    """The catalog text under a record (a leaf, or a tree node whose leaves all lie at one depth),
    or None if its first leaf does not start with the catalog header. Raises if a record under it
    cannot be read."""
    rs, null = store.ref_size, store.null_ref

    def leaves(btype, data):
        if btype == DATA:
            yield data
            return
        for i in range(0, len(data), rs):
            ref = data[i:i + rs]
            if ref == null:
                return   # a node's unused slots, and the blob's end
            yield from leaves(*_read(store, ref))

    out = bytearray()
    for leaf in leaves(btype, data):
        if not out and not leaf.startswith(HEADER):
            return None
        out += leaf
    return bytes(out).rstrip(b"\0")


def lost_catalog(store):
    """-> (Catalog, log address of its blob's root) of the list a lost newest CATALOG record named, or
    None: no bytes were lost after the newest intact catalog, or no whole list lies before them."""
    ref = store.latest(CATALOG)
    at = store.address(ref) if ref is not None else 0
    places = [(n << 32) | lo for n, lo, _ in store.log.lost] + [(n << 32) | o for n, o in store.log.damaged] + \
        list(store.bad)
    last = max((p for p in places if p > at), default=None)
    if last is None:
        return None
    for a, btype in _records_after(store, at):
        if a >= last:
            continue
        try:
            _, _, data = store.log.read(a)
            text = _blob_text(store, btype, bytes(data))
            if text is None:
                continue
            cat = Catalog()
            cat._parse(text)
        except (DataCorrupt, NotFound, CatalogCorrupt) as e:
            log.info("a catalog list at arena %d offset %d cannot be read whole (%s)", a >> 32, a & 0xFFFFFFFF, e)
            continue
        return cat, a
    return None


def recover_catalog(store):
    """For `rebuild --salvage`: commit the list a lost newest catalog record named again, if it is in
    the log -> lines saying what was brought back, or which days cannot be named."""
    try:
        old = Catalog.load(store)
    except Error as e:
        return [f"the newest intact catalog cannot be read ({e}); no list was brought back"]
    found = lost_catalog(store)
    if found is None:
        newer = newer_catalog_lost(store)
        if not newer:
            return []
        last = old.snapshots()[-1:] if old.snapshots() else []
        since = f"after {format_time(last[0].time)}" if last else "at all"
        return [f"the newest catalog record is lost and the list it named is not intact in the log: snapshots "
                f"of any VM taken {since} cannot be named (a replica may hold them)"]
    cat, a = found
    known = {(s.name, s.time) for s in old.snapshots()}
    new = [s for s in cat.snapshots() if (s.name, s.time) not in known]
    gone = len(old.snapshots()) - (len(cat.snapshots()) - len(new))
    cat.generation = old.generation + 1
    cat.commit(store)
    out = [f"the newest catalog record was lost; its list was found in the log (arena {a >> 32} offset "
           f"{a & 0xFFFFFFFF}) and committed again: {len(cat.snapshots())} snapshot(s)"]
    out += [f"listed again: {s.name}@{format_time(s.time)}" for s in new]
    if gone:
        out.append(f"{gone} snapshot(s) of the older list are not in it (forgotten by the lost commit)")
    return out
