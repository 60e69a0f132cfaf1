"""An LVM2 physical volume's volume-group metadata text, parsed: what libvslvm does not tell.

libvslvm maps linear and striped logical volumes but does not say which
are hidden (a thin pool's _tmeta and _tdata, _pmspare) nor read thin
volumes at all (it refuses to open them). So the text LVM itself keeps
on the PV is read here too, read-only and nothing activated: the label
names the metadata area, whose header points at the newest copy of the
text (a ring buffer that may wrap), parsed as LVM's config syntax into
dicts and lists. Only what picks a reader for each LV is used from it.
"""

import re
import struct

SECTOR = 512
MDA_MAGIC = b" LVM2 x[5A%r0N*>"
_TOKEN = re.compile(r'\s+|#[^\n]*|"((?:[^"\\]|\\.)*)"|([-+]?\d+(?:\.\d+)?)(?![\w.])|([\w.+-]+)|([=\[\]{},])', re.S)


class MetadataError(Exception):
    pass


def metadata_text(src):
    """The newest volume-group metadata text of the physical volume src."""
    for sector in range(4):
        label = src.read(sector * SECTOR, SECTOR)
        if label[:8] == b"LABELONE" and label[24:32] == b"LVM2 001":
            break
    else:
        raise MetadataError("no LVM2 label")
    pvh = sector * SECTOR + struct.unpack_from("<I", label, 20)[0]
    areas = src.read(pvh + 40, SECTOR)              # after the PV uuid and size
    lists, cur, off = [], [], 0
    while len(lists) < 2 and off + 16 <= len(areas):
        o, n = struct.unpack_from("<QQ", areas, off)
        off += 16
        if o == 0:
            lists.append(cur)
            cur = []
        else:
            cur.append((o, n))
    if len(lists) < 2 or not lists[1]:
        raise MetadataError("the physical volume has no metadata area")
    start = lists[1][0][0]
    head = src.read(start, SECTOR)
    if head[4:20] != MDA_MAGIC:
        raise MetadataError("metadata area header has the wrong magic")
    mda_size = struct.unpack_from("<Q", head, 32)[0]
    off, size, _, flags = struct.unpack_from("<QQII", head, 40)
    if size == 0 or flags & 1:
        raise MetadataError("the metadata area holds no metadata")
    first = min(size, mda_size - off)
    text = src.read(start + off, first) + src.read(start + SECTOR, size - first)   # the ring may wrap
    return text.rstrip(b"\0").decode("utf-8", "replace")


def parse(text):
    """LVM config text -> nested dicts: `name = value`, `name { ... }`, values int, str or list."""
    tokens = []
    for m in _TOKEN.finditer(text):
        s, num, word, punct = m.groups()
        if s is not None:
            tokens.append(("v", re.sub(r"\\(.)", r"\1", s)))
        elif num is not None:
            tokens.append(("v", float(num) if "." in num else int(num)))
        elif word is not None:
            tokens.append(("w", word))
        elif punct is not None:
            tokens.append(("p", punct))
    pos = 0

    def section(end):
        nonlocal pos
        out = {}
        while pos < len(tokens) and tokens[pos] != ("p", end):
            kind, key = tokens[pos]
            if kind != "w":
                raise MetadataError(f"metadata text: unexpected {key!r}")
            pos += 1
            if tokens[pos] == ("p", "{"):
                pos += 1
                out[key] = section("}")
            elif tokens[pos] == ("p", "="):
                pos += 1
                out[key] = value()
            else:
                raise MetadataError(f"metadata text: unexpected {tokens[pos][1]!r} after {key}")
        pos += 1
        return out

    def value():
        nonlocal pos
        kind, v = tokens[pos]
        pos += 1
        if (kind, v) != ("p", "["):
            return v
        items = []
        while tokens[pos] != ("p", "]"):
            if tokens[pos] != ("p", ","):
                items.append(tokens[pos][1])
            pos += 1
        pos += 1
        return items

    try:
        return section(None)
    except IndexError:
        raise MetadataError("metadata text ends too early") from None


def volume_group(src):
    """(name, dict) of the volume group whose metadata src, a physical volume, holds."""
    top = parse(metadata_text(src))
    for name, vg in top.items():
        if isinstance(vg, dict) and "physical_volumes" in vg:
            return name, vg
    raise MetadataError("the metadata text names no volume group")


def visible(lv):
    return "VISIBLE" in lv.get("status", [])


def segments(lv):
    """The LV's segments, in order."""
    return [lv[f"segment{i}"] for i in range(1, int(lv.get("segment_count", 0)) + 1)]
