"""Repairing damaged arenas: from a replica's good copy, or from blocks still on a disk (paper §3.4).

A damaged arena is replaced by a replica's copy of the same chain position
once that copy verifies on its own (record tags, decoding, scores, arena
MAC) and its chain MAC fits the local arenas around it: downloaded beside
the arena, fsynced, renamed over it, with the writer lock and the readers'
lock held. A record no replica can give back may still be on a disk: its
bytes are a function of the block, the arena's IV and its offset (zstd at
the store's level is deterministic, AES-CTR at the same position gives the
same ciphertext), so the block found again in an image, by its score, is
re-encoded at the very same place and the arena MAC verifies again. In
compare-by-hash mode a block that re-encodes to another length is stored
again at the log's end instead, which heals every snapshot that names it.
"""

import logging
from dataclasses import dataclass, field

from foundation import native
from foundation.errors import Error
from foundation.store import format as F
from foundation.store import primary
from foundation.store import verify
from foundation.store.verify import Kind
from foundation.store import layout as L
from foundation.replica.sync import Local, digest, own_prefix, read_remote, verify_bytes

log = logging.getLogger(__name__)

ZLEVELS = (1, 3, 2, 4, 5, 6, 0)   # after the store's own `compression` level: others it may have had
IMAGE_CHUNK = 1024                # blocks read and scored per image read


@dataclass
class Repaired:
    found: list = field(default_factory=list)      # [Damage] before
    healed: list = field(default_factory=list)     # [str] what was repaired, and how
    restored: list = field(default_factory=list)   # [(arena, offset)] damaged records whose block was stored again
    lost: list = field(default_factory=list)       # [Damage] still damaged and not readable
    notes: list = field(default_factory=list)


def repair(path, key_file=None, backends=(), images=(), progress=None, passphrase=None):
    """Repair the store at path from the backends (replicas) and images ([(path, format or None)]).
    `passphrase`: as for Store.open."""
    res = Repaired()
    local = Local(path, key_file, passphrase=passphrase)
    later = []
    try:
        local.exclusive()
        _, head = local.read_head()
        damage = scan(local, head)
        res.found = [d for ds in damage.values() for d in ds]
        if damage and backends:
            _from_replicas(local, head, damage, backends, res)
        if any(d.kind in (Kind.RECORD, Kind.UNPARSABLE, Kind.SKIPPED) for ds in damage.values() for d in ds) \
                and images:
            later = _from_images(local, head, damage, images, res)
        local.record_damaged(sorted({(d.arena, d.offset) for ds in damage.values() for d in ds if d.record}))
    finally:
        local.close()
    if later:
        _store_again(path, local.master, later, res)
    _final(path, local.master, res)
    return res


def scan(local, head):
    """{arena: [Damage]} of every damaged arena, checked as `verify` does (without opening the store)."""
    out = {}
    chain = F.ZERO_CHAIN
    for n in range(head.arena + 1):
        buf = local.read_arena(n)
        if buf is None:
            if n < head.arena or head.end > F.ARENA_HEADER_SIZE:
                out[n] = [verify.Damage(n, 0, Kind.MISSING, "arena file is missing")]
            chain = None
            continue
        damage, _, c = verify_bytes(local, n, buf, n < head.arena, chain, head.end)
        chain = c if n < head.arena else chain
        if damage:
            out[n] = damage
    if chain is not None and chain != head.chain:
        out.setdefault(head.arena, []).append(
            verify.Damage(head.arena, 0, Kind.HEAD_CHAIN, "the head's chain MAC does not match the sealed arenas"))
    return out


# ---- from a replica ---------------------------------------------------------------------------

def _from_replicas(local, head, damage, backends, res):
    manifests = []
    for b in backends:
        try:
            _, m, why = read_remote(local, b)
        except Error as e:
            res.notes.append(f"replica {b.url} not used: {e}")
            continue
        if m is None:
            res.notes.append(f"replica {b.url} not used: {why or 'it has no manifest'}")
            continue
        manifests.append((b, m))
    for n in sorted(damage):
        for b, m in manifests:
            try:
                ok = (n < head.arena and _sealed_from(local, head, n, b, m, res)
                      or _prefix_from(local, head, n, b, m, res))
            except Error as e:
                res.notes.append(f"arena {n}: the copy on {b.url} could not be used ({e})")
                ok = False
            if ok:
                again = scan_one(local, head, n)
                if again:
                    damage[n] = again
                else:
                    del damage[n]
                break


def scan_one(local, head, n):
    buf = local.read_arena(n)
    prev = F.ZERO_CHAIN if n == 0 else getattr(local.trailer(n - 1), "chain", None)
    damage, _, _ = verify_bytes(local, n, buf, n < head.arena, prev if n < head.arena else None, head.end)
    return damage


def _sealed_from(local, head, n, b, m, res):
    """Replace sealed arena n by the replica's copy if it verifies and fits the local chain."""
    if n >= len(m.arenas):
        return False
    a = m.arenas[n]
    prev = F.ZERO_CHAIN if n == 0 else getattr(local.trailer(n - 1), "chain", None)
    if n + 1 < head.arena:
        nxt = local.trailer(n + 1)
        after = (lambda c: nxt.chain == F.chain_mac(local.keys.mac, c, n + 1, nxt.sealed)) if nxt else None
    else:
        after = lambda c: c == head.chain  # noqa: E731
    if prev is None and after is None:
        res.notes.append(f"arena {n}: the arenas around it are damaged too; its chain position cannot be checked")
        return False
    data = b.get(a.name)
    if len(data) != a.size:
        res.notes.append(f"arena {n}: the copy on {b.url} has {len(data)} bytes, its manifest says {a.size}")
        return False
    damage, tr, _ = verify_bytes(local, n, data, True, prev)
    if damage or tr is None or (after is not None and not after(tr.chain)):
        why = damage[0] if damage else "its chain does not fit the local arenas"
        res.notes.append(f"arena {n}: the copy on {b.url} is not usable ({why})")
        return False
    local.install_arena(n, data)
    res.healed.append(f"arena {n}: replaced by the replica's copy ({b.url}, generation {tr.generation})")
    return True


def _prefix_from(local, head, n, b, m, res):
    """Mend the first bytes of arena n from the replica's segments of it: its open arena, which may
    have been sealed here since. Only segments holding what the manifest names are used, only if
    they are this store's own bytes (they differ from the local ones only in damaged records: a
    store restored from an older copy has other records at the same offsets), and the result must
    have fewer damaged records, none in the mended part."""
    if m.open.n != n or not m.open.parts:
        return False
    sealed = n < head.arena
    mine = local.read_arena(n) or b""
    try:   # a header that fails its MAC says nothing by its tag: the mended file is judged whole
        F.ArenaHeader.unpack(mine[:F.ARENA_HEADER_SIZE], local.keys.mac)
        if L.arena_tag(mine, len(m.open.ident)) != m.open.ident:
            res.notes.append(f"arena {n}: the replica holds another open arena {n} (the local one was rewritten)")
            return False
    except ValueError:
        pass
    theirs = bytearray()
    for name, _, _, d in m.open.objects():
        data = b.get(name)
        if digest(data) != d:
            res.notes.append(f"arena {n}: segment {name} on {b.url} does not hold the bytes its manifest names")
            break
        theirs += data
    if not theirs:
        return False
    theirs = bytes(theirs)
    new = theirs + mine[len(theirs):]
    prev = (F.ZERO_CHAIN if n == 0 else getattr(local.trailer(n - 1), "chain", None)) if sealed else None

    def check(buf):
        return verify_bytes(local, n, buf, sealed, prev, head.end)[0]

    before = check(mine) if mine else []
    if mine:   # only what the replica holds of this store's own timeline
        k = own_prefix(local, n, mine[:len(theirs)], theirs, 0, before)
        if k < len(theirs):
            res.notes.append(f"arena {n}: the replica's segments hold another version of it from offset {k} "
                             "(the local store was restored from an older copy?); only what is before is used")
        theirs, new = theirs[:k], theirs[:k] + mine[k:]
    elif (m.head.arena, m.head.chain) != (head.arena, head.chain):
        res.notes.append(f"arena {n}: the replica's segments cannot be shown to be of this store's arena; not used")
        return False
    if len(theirs) <= F.ARENA_HEADER_SIZE and mine:
        return False
    before = before or ["missing"]
    after = check(new)
    resealed = False
    if sealed and after and all(d.kind is Kind.ARENA_MAC for d in after):
        new, resealed = _reseal(local, n, new, mine) or new, True
        after = check(new)
    if any(d.offset < len(theirs) for d in after) or len(after) >= len(before):
        res.notes.append(f"arena {n}: the replica's segments (up to offset {len(theirs)}) do not mend it")
        return False
    local.install_arena(n, new)
    res.healed.append(f"arena {n}{'' if sealed else ' (open)'}: bytes up to offset {len(theirs)} replaced by the "
                      f"replica's segments of it ({b.url})" + ("; resealed with a compacted trailer" if resealed
                                                                else ""))
    return True


def _reseal(local, n, buf, mine):
    """Sealed arena n whose records all verify once mended (buf; `mine` before), but whose arena MAC
    leaves the mended ones out: a writer steps over a record it finds damaged in the open arena and
    seals without it. -> the file with a compacted trailer over all its records (same chain and
    sealed MAC, one generation up: docs/format.md §5.4); None unless the old arena MAC is exactly
    that of the records but the mended ones, or if the trailer would not fit the arena size."""
    old = F.Trailer.from_tail(buf[-F.MAX_TRAILER:], local.keys.mac, n)
    header, hb = local.log.header(n, buf)
    entries, end, err = local.log.scan(n, header.iv, memoryview(buf)[F.ARENA_HEADER_SIZE:old.end],
                                       F.ARENA_HEADER_SIZE)
    if err is not None or end != old.end or end + F.COMPACT_SIZE > local.conf["arena_size"]:
        return None
    kept = [e for e in entries if buf[e[0]:e[0] + L.HEADER_SIZE + e[3]]
            == mine[e[0]:e[0] + L.HEADER_SIZE + e[3]]]
    if F.arena_mac(local.keys.mac, hb, b"".join(e[5] for e in kept), len(kept), end) != old.amac:
        return None
    tags = b"".join(e[5] for e in entries)
    amac = F.arena_mac(local.keys.mac, hb, tags, len(entries), end)
    tr = F.Trailer(len(entries), end, amac, old.chain, old.generation + 1, old.sealed)
    return bytes(buf[:end]) + tr.pack(local.keys.mac, n)


# ---- from disk images ------------------------------------------------------------------------

@dataclass
class _Want:
    arena: int
    offset: int
    btype: int
    key: bytes       # 32-byte key field: the score, or the weak hash and 24 zero bytes
    length: int      # bytes the record occupies
    tag: bytes       # the tag it carries (may itself be damaged)


def _from_images(local, head, damage, images, res):
    """Re-encode damaged records in place from blocks found in images; -> [(want, block)] that did not fit."""
    from foundation.image import open_image

    bs = local.conf["block_size"]
    wants = {}
    for n, ds in damage.items():
        for w in _damaged_records(local, head, n, ds):
            wants.setdefault(w.key[:32 if local.mode == "hash" else 8], []).append(w)
    if not wants:
        return []
    found = {}   # (arena, offset) -> (want, block, image)
    for path, fmt in images:
        src = open_image(path, fmt)
        try:
            for off in range(0, src.size, IMAGE_CHUNK * bs):
                buf = bytearray(src.read(off, min(IMAGE_CHUNK * bs, src.size - off)))
                buf += bytes(-len(buf) % bs)
                if local.mode == "hash":
                    keys, kl = native.scores(buf, bs, F.DATA, key=local.keys.score), 32
                else:
                    keys, kl = native.weak_hashes(buf, bs, F.DATA, local.keys.weak_seed), 8
                for i in range(len(buf) // bs):
                    for w in wants.get(bytes(keys[i * kl:(i + 1) * kl]), ()):
                        if w.btype == F.DATA and (w.arena, w.offset) not in found:
                            found[(w.arena, w.offset)] = (w, bytes(buf[i * bs:(i + 1) * bs]), path)
        finally:
            src.close()
    later = []
    patched = {}
    for (n, off), (w, block, path) in sorted(found.items()):
        buf = patched.get(n)
        if buf is None:
            buf = patched[n] = bytearray(local.read_arena(n))
        iv = L.arena_iv(buf)
        rec = _reencode(local, w, iv, block)
        if rec is not None:
            buf[off:off + len(rec)] = rec
            res.healed.append(f"arena {n} offset {off}: record written again in place from {path}")
        elif local.mode == "hash":
            later.append((w, block, path))
        else:
            res.notes.append(f"arena {n} offset {off}: a block with its weak hash is in {path}, but it does not "
                             "re-encode to the same record (compare-by-value cannot store it elsewhere)")
    for n, buf in patched.items():
        before = len(damage.get(n, ()))
        local.install_arena(n, bytes(buf))
        again = scan_one(local, head, n)
        if again:
            damage[n] = again
        else:
            damage.pop(n, None)
        if len(again) >= before:
            res.notes.append(f"arena {n}: rewriting records in place did not reduce its damage")
    return later


def _reencode(local, w, iv, block):
    """The record for block at w's place, if some zstd level gives back exactly its bytes: same
    length and tag. Another encoding of the same length would put other ciphertext under the same
    counter blocks (docs/format.md §5.2); in hash mode such a block is stored again instead."""
    for level in dict.fromkeys((primary.store_level(local.conf), *ZLEVELS)):
        codec = primary.codec(local.keys, level, local.conf)
        rec, _ = native.pack(codec, w.arena, iv, w.offset, w.btype, block, len(block), w.key)
        if len(rec) == w.length and L.tag(rec, 0) == w.tag:
            return rec
    return None


def _damaged_records(local, head, n, damage):
    """_Want for each damaged record of arena n: offsets and keys from its summary when there is a sound
    one (a damaged header then loses nothing), else from the record headers."""
    buf = local.read_arena(n)
    if buf is None or len(buf) < F.ARENA_HEADER_SIZE:
        return []
    single = {d.offset for d in damage if d.record}
    records = _records(local, head, n, buf, single)
    cut = min((d.offset for d in damage if d.kind is Kind.UNPARSABLE), default=None)
    spans = [(d.offset, d.end) for d in damage if d.kind is Kind.SKIPPED]
    out = []
    for off, btype, key, length in records:
        if off in single or cut is not None and off >= cut or any(a <= off < b for a, b in spans):
            out.append(_Want(n, off, btype, key, length, L.tag(buf, off)))
    return out


def _records(local, head, n, buf, damaged=()):
    """[(offset, type, 32-byte key field, length)] of arena n's records. From its summary only if that
    lists every damaged record (a summary rebuilt around a damaged record leaves it out)."""
    tr = None
    if n < head.arena:
        try:
            tr = F.Trailer.from_tail(buf[-F.MAX_TRAILER:], local.keys.mac, n)
        except ValueError:
            pass
    summary = local.summary(n, tr.amac) if tr is not None else None
    if summary is not None and not set(damaged) <= {a & 0xFFFFFFFF for a in summary[1]}:
        summary = None
    if summary is not None:
        keys, addrs, types = summary
        kl = 32 if local.mode == "hash" else 8
        offs = [a & 0xFFFFFFFF for a in addrs] + [tr.end]
        return [(offs[i], types[i], bytes(keys[i * kl:(i + 1) * kl]).ljust(32, b"\0"), offs[i + 1] - offs[i])
                for i in range(len(addrs))]
    limit = len(buf) - tr.size if tr else (head.end if n == head.arena else len(buf))
    out, off = [], F.ARENA_HEADER_SIZE
    while off + L.HEADER_SIZE <= limit and L.is_record(buf, off):
        length = L.HEADER_SIZE + L.stored(buf, off)
        if off + length > limit:
            break
        out.append((off, L.btype(buf, off), L.key(buf, off), length))
        off += length
    return out


# ---- storing blocks again, and the final check ---------------------------------------------

def _store_again(path, master, later, res):
    """Compare-by-hash: append blocks whose damaged record could not be rewritten in place; every
    snapshot naming them reads the new copy (the damaged record is skipped by deduplication)."""
    from foundation.store import Store

    with Store.open(path, master=master, writable=True) as s:
        s.skip_records(F.addr(w.arena, w.offset) for w, _, _ in later)
        for w, block, src in later:
            s.write(block, w.btype)
        s.sync()
        for w, block, src in later:
            try:
                ok = s.read(w.key) == block
            except Error:
                ok = False
            if ok:
                res.restored.append((w.arena, w.offset))
                res.healed.append(f"arena {w.arena} offset {w.offset}: block stored again at the log's end from "
                                  f"{src} (it re-encodes to another length; `verify` keeps naming the old record)")


def _final(path, master, res):
    """Open the store (writable: derived structures are rebuilt) and verify it."""
    from foundation.store import Store

    try:
        with Store.open(path, master=master, writable=True):
            pass
        with Store.open(path, master=master) as s:
            damage, _ = verify.verify(s)
    except Error as e:   # still too damaged to open: say so with what is known, not with a traceback
        res.notes.append(f"the store does not open yet: {e}")
        try:
            with Local(path, master=master) as local:
                res.lost = [d for ds in scan(local, local.read_head()[1]).values() for d in ds]
        except Error:
            pass
        res.lost = res.lost or [str(e)]
        return
    res.lost = [d for d in damage if (d.arena, d.offset) not in set(res.restored)]
