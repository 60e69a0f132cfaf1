"""What damage costs, said in the user's terms: which VM, day and disk, which bytes of it.

Damage is found by arena and offset (verify, a salvage scan); a person
asks which days they lost. This walks every snapshot's trees once
(foundation.image.lost) and names, per day and disk, the byte ranges no
intact record holds. Only the days with a loss are named.
"""

from foundation.catalog import CATALOG, Catalog, format_time
from foundation.errors import Error
from foundation.image.lost import describe, lost_ranges


def losses(store):
    """[(snapshot, disk, [(start, end)])] of every day that needs a lost block; raises if the catalog is lost."""
    out = []
    for snap in Catalog.load(store).snapshots():
        for disk, entry in sorted(snap.disks.items()):
            ranges = lost_ranges(store, entry.root)
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
