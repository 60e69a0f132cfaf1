"""Every on-disk layout of the store, packed and unpacked in one place.

Like Venti's dat.h and conv.c: sizes derive from field sizes, all integers
are little-endian, and each structure starts with an 8-byte magic and a
version so that a reader in 2050 can tell what it holds. docs/format.md is
the prose version of this file; change both together.
"""

import array
import hashlib
import hmac
import json
import struct
import sys

from foundation.fields import Fields


VERSION = 1
CONFIG = "foundation.json"
HEAD = "head"
HEADS = ("head", "head.1")  # the head's two slots: commit g goes to HEADS[g % 2] (docs/format.md §6)
INDEX = "index"
BLOOM = "bloom"
BLOOM_STATE = "bloom.json"
COUNTERS = "counters.json"
DAMAGED = "damaged.json"
RECOVERING = "recovering.json"  # a recovery from a replica under way (docs/format.md §13.5)
LOCK = "lock"
READERS = "readers"
ARENAS = "arenas"
SUMMARIES = "summaries"

ARENA_MAGIC = b"FDNarena"
TRAILER_MAGIC = b"FDNseal\0"
SUMMARY_MAGIC = b"FDNsumm\0"
INDEX_MAGIC = b"FDNindex"
HEAD_MAGIC = b"FDNhead\0"

# Block types: what a record holds. TREE and CATALOG blocks hold refs; a COMMIT
# record ends every sync (the commit point in the log, below).
DATA, TREE, CATALOG, COMMIT = 1, 2, 3, 4

MAC_SIZE = 32


def mac(key, *parts):
    h = hmac.new(key, digestmod=hashlib.sha256)
    for p in parts:
        h.update(p)
    return h.digest()


def arena_name(n):
    return f"{n:08d}.arena"


def summary_name(n):
    return f"{n:08d}.sum"


# Log addresses: arena number in the high 32 bits, byte offset in the low 32.
def addr(arena, offset):
    return (arena << 32) | offset


def split(address):
    return address >> 32, address & 0xFFFFFFFF


# ---- arena header: 72 bytes at offset 0 of every arena file ----------------
ARENA_HEADER = struct.Struct("<8sII16s16sQ")  # magic version arena uuid iv size
ARENA_HEADER_SIZE = ARENA_HEADER.size + 16  # 56 + the header tag = 72


class ArenaHeader(Fields):
    def __init__(self, arena, uuid, iv, size):
        self.arena, self.uuid, self.iv, self.size = arena, uuid, iv, size

    def pack(self, mac_key):
        body = ARENA_HEADER.pack(ARENA_MAGIC, VERSION, self.arena, self.uuid, self.iv, self.size)
        return body + mac(mac_key, b"arena header", body)[:16]

    @classmethod
    def unpack(cls, b, mac_key):
        if len(b) < ARENA_HEADER_SIZE:
            raise ValueError("arena header truncated")
        body = b[: ARENA_HEADER.size]
        magic, version, arena, uuid, iv, size = ARENA_HEADER.unpack(body)
        if magic != ARENA_MAGIC:
            raise ValueError("not an arena (bad magic)")
        if version != VERSION:
            raise ValueError(f"arena format version {version} is not supported (this is {VERSION})")
        if not hmac.compare_digest(mac(mac_key, b"arena header", body)[:16], b[ARENA_HEADER.size:ARENA_HEADER_SIZE]):
            raise ValueError("arena header MAC mismatch (wrong key or tampered header)")
        return cls(arena, uuid, iv, size)


# ---- arena trailer: written once when an arena is sealed -------------------
TRAILER = struct.Struct("<8sIIQ32s32s")  # magic count generation(0) end arena_mac chain
TRAILER_SIZE = TRAILER.size  # 88

# A sealed arena rewritten by the garbage collector (generation >= 1) ends in
# a longer trailer that still carries the chain of the arena as first sealed
# and the arena MAC the chain covers, so compacting one arena never touches
# the trailers of the arenas after it (or their replicas).
COMPACT_MAGIC = b"FDNcmpt\0"
COMPACT = struct.Struct("<8sIIQ32s32s32s")  # magic count generation end arena_mac chain sealed_mac
COMPACT_SIZE = COMPACT.size + MAC_SIZE  # + compaction MAC = 152
MAX_TRAILER = COMPACT_SIZE


def arena_mac(mac_key, header_bytes, tags, count, end):
    """MAC over an arena: its header, every record tag in order, count and end."""
    return mac(mac_key, b"arena", header_bytes, tags, struct.pack("<IQ", count, end))


def chain_mac(mac_key, prev_chain, arena, sealed_mac):
    """MAC over the arenas: each sealed arena extends the chain of the one before
    with the arena MAC it had when first sealed."""
    return mac(mac_key, b"chain", prev_chain, struct.pack("<I", arena), sealed_mac)


ZERO_CHAIN = bytes(MAC_SIZE)


class Trailer(Fields):
    def __init__(self, count, end, amac, chain, generation=0, sealed=None):
        self.count, self.end = count, end
        self.amac = amac  # MAC over this file's header and record tags
        self.chain = chain
        self.generation = generation  # 0 as first sealed; +1 each time gc rewrites the arena
        self.sealed = amac if sealed is None else sealed  # the arena MAC the chain covers (= amac in generation 0)

    @property
    def size(self):
        return TRAILER_SIZE if self.generation == 0 else COMPACT_SIZE

    def pack(self, mac_key=None, arena=None):
        if self.generation == 0:
            return TRAILER.pack(TRAILER_MAGIC, self.count, 0, self.end, self.amac, self.chain)
        body = COMPACT.pack(COMPACT_MAGIC, self.count, self.generation, self.end, self.amac, self.chain,
                            self.sealed)
        return body + mac(mac_key, b"compacted", struct.pack("<I", arena), body[8:])

    @classmethod
    def unpack(cls, b):
        """A generation-0 trailer from exactly its 88 bytes."""
        if len(b) != TRAILER_SIZE:
            raise ValueError("arena trailer truncated")
        magic, count, gen, end, amac, chain = TRAILER.unpack(b)
        if magic != TRAILER_MAGIC or gen != 0:
            raise ValueError("arena trailer missing (bad magic)")
        return cls(count, end, amac, chain)

    @classmethod
    def from_tail(cls, tail, mac_key, arena):
        """The trailer at the end of a sealed arena file, given its last
        MAX_TRAILER bytes (or all of a shorter file); ValueError if none."""
        tail = bytes(tail)
        if len(tail) >= TRAILER_SIZE and tail[-TRAILER_SIZE:].startswith(TRAILER_MAGIC):
            return cls.unpack(bytes(tail[-TRAILER_SIZE:]))
        if len(tail) >= COMPACT_SIZE and tail[-COMPACT_SIZE:].startswith(COMPACT_MAGIC):
            b = bytes(tail[-COMPACT_SIZE:])
            body = b[:COMPACT.size]
            _, count, gen, end, amac, chain, sealed = COMPACT.unpack(body)
            if gen == 0 or not hmac.compare_digest(
                    mac(mac_key, b"compacted", struct.pack("<I", arena), body[8:]), b[COMPACT.size:]):
                raise ValueError("compacted arena trailer MAC mismatch (wrong key or tampered trailer)")
            return cls(count, end, amac, chain, gen, sealed)
        raise ValueError("arena trailer missing (bad magic)")


# ---- head: the commit point, two slots written alternately at every sync ----
HEAD_STRUCT = struct.Struct("<8sIIQII32s")  # magic version open_arena end count generation chain
HEAD_SIZE = HEAD_STRUCT.size + MAC_SIZE


class Head(Fields):
    def __init__(self, arena, end, count, chain, generation=0):
        self.arena = arena  # the open arena; arenas below it are sealed
        self.end = end  # committed end offset in the open arena
        self.count = count  # records in the open arena up to end
        self.chain = chain  # chain MAC of the last sealed arena (ZERO_CHAIN if none)
        self.generation = generation  # commit number: one more at every commit (0 in a head written before slots)

    def pack(self, mac_key):
        body = HEAD_STRUCT.pack(HEAD_MAGIC, VERSION, self.arena, self.end, self.count, self.generation, self.chain)
        return body + mac(mac_key, b"head", body)

    @classmethod
    def unpack(cls, b, mac_key):
        if len(b) != HEAD_SIZE:
            raise ValueError("head truncated" if len(b) < HEAD_SIZE else "head has trailing bytes")
        body = b[: HEAD_STRUCT.size]
        magic, version, arena, end, count, generation, chain = HEAD_STRUCT.unpack(body)
        if magic != HEAD_MAGIC or version != VERSION:
            raise ValueError("bad head magic or version")
        if not hmac.compare_digest(mac(mac_key, b"head", body), b[HEAD_STRUCT.size:]):
            raise ValueError("head MAC mismatch")
        return cls(arena, end, count, chain, generation)

    @property
    def position(self):
        return addr(self.arena, self.end)


# ---- commit record: the payload of the COMMIT record that ends every sync -----
COMMIT_MAGIC = b"FDNcmit\0"
COMMIT_STRUCT = struct.Struct("<8sII32s")  # magic generation arena chain
COMMIT_SIZE = COMMIT_STRUCT.size  # 48


def pack_commit(generation, arena, chain):
    return COMMIT_STRUCT.pack(COMMIT_MAGIC, generation, arena, chain)


def unpack_commit(b):
    """(generation, arena, chain) of a commit record's payload; ValueError if it is not one."""
    if len(b) != COMMIT_SIZE or bytes(b[:8]) != COMMIT_MAGIC:
        raise ValueError("not a commit record")
    _, generation, arena, chain = COMMIT_STRUCT.unpack(bytes(b))
    return generation, arena, chain


# ---- summary: (key, addr, type) of every record of one sealed arena -------
SUMMARY_HEADER = struct.Struct("<8sIIII32s")  # magic version arena count keylen arena_mac
SUMMARY_HEADER_SIZE = 64
SUMMARY_SUM_SIZE = 32  # SHA-256 of everything before it, at the end


def summary_count(size, keylen):
    """Records listed by a summary file of `size` bytes: a key, a u64 address and a type byte each."""
    return (size - SUMMARY_HEADER_SIZE - SUMMARY_SUM_SIZE) // (keylen + 8 + 1)


def pack_summary(arena, keylen, amac, keys, addrs, types):
    n = len(addrs)
    head = SUMMARY_HEADER.pack(SUMMARY_MAGIC, VERSION, arena, n, keylen, amac)
    head += bytes(SUMMARY_HEADER_SIZE - len(head))
    body = bytes(keys) + struct.pack(f"<{n}Q", *addrs) + bytes(types)
    return head + body + hashlib.sha256(head + body).digest()


def unpack_summary(b):
    """-> (arena, keylen, arena_mac, keys, addrs, types); ValueError if damaged."""
    if len(b) < SUMMARY_HEADER_SIZE + 32 or b[:8] != SUMMARY_MAGIC:
        raise ValueError("bad summary magic")
    if hashlib.sha256(memoryview(b)[:-32]).digest() != b[-32:]:
        raise ValueError("summary checksum mismatch")
    _, version, arena, n, keylen, amac = SUMMARY_HEADER.unpack_from(b)
    if version != VERSION:
        raise ValueError("summary version")
    o = SUMMARY_HEADER_SIZE
    if o + n * (keylen + 9) + 32 != len(b):
        raise ValueError("summary length mismatch")
    keys = b[o : o + n * keylen]
    o += n * keylen
    # An array, not a list of ints: a summary is loaded for every arena a later day's duplicates
    # name, and the tables take an array without a check per entry.
    addrs = array.array("Q", b[o : o + 8 * n])
    if sys.byteorder != "little":
        addrs.byteswap()
    o += 8 * n
    types = b[o : o + n]
    return arena, keylen, amac, keys, addrs, types


# ---- index header: one page before the buckets -----------------------------
INDEX_HEADER = struct.Struct("<8sIIIIQQQQB16s")  # magic version keylen bucket_size reserved nbuckets nfile entries covered dirty uuid
INDEX_HEADER_SIZE = 4096


class IndexHeader(Fields):
    def __init__(self, keylen, bucket_size, nbuckets, nfile, entries, covered, dirty, uuid):
        self.keylen, self.bucket_size = keylen, bucket_size
        self.nbuckets = nbuckets  # home buckets (the hash range)
        self.nfile = nfile  # buckets in the file: home buckets + overflow buckets
        self.entries = entries
        self.covered = covered  # every record below this log address is in the index
        self.dirty = dirty  # 1 while a flush is rewriting buckets
        self.uuid = uuid

    def pack(self):
        b = INDEX_HEADER.pack(INDEX_MAGIC, VERSION, self.keylen, self.bucket_size, 0,
                              self.nbuckets, self.nfile, self.entries, self.covered, self.dirty, self.uuid)
        return b + bytes(INDEX_HEADER_SIZE - len(b))

    @classmethod
    def unpack(cls, b):
        if len(b) < INDEX_HEADER.size:
            raise ValueError("index header truncated")
        magic, version, keylen, bsize, _, nb, nfile, entries, covered, dirty, uuid = INDEX_HEADER.unpack_from(b)
        if magic != INDEX_MAGIC or version != VERSION:
            raise ValueError("bad index magic or version")
        return cls(keylen, bsize, nb, nfile, entries, covered, dirty, uuid)


# ---- config: JSON, written once by init -----------------------------------
CONFIG_KEYS = ("format", "version", "uuid", "mode", "block_size", "arena_size",
               "max_log_size", "encrypted", "key_check", "index_buckets", "bucket_size", "created", "check",
               "compression", "run", "tag")
# The parameters a store is made with and their types; `check` MACs them (§2).
CONFIG_TYPES = {"uuid": str, "mode": str, "block_size": int, "arena_size": int, "max_log_size": int,
                "encrypted": bool, "key_check": str, "index_buckets": int, "bucket_size": int}


# How records are tagged (§5.2): a parameter like those above, but optional, so that stores made
# before it (HMAC tags, no key) keep their check. New stores are made with TAG_DEFAULT.
TAGS = ("hmac", "poly1305")
TAG_DEFAULT = "poly1305"


def check_tag(tag):
    """tag, a `tag` setting: one of TAGS; ValueError otherwise."""
    if tag not in TAGS:
        raise ValueError(f"tag = {tag!r}, which is not one of {', '.join(map(repr, TAGS))}")
    return tag


def record_tag(conf):
    """The store's record tag: its `tag` setting, "hmac" when absent (stores made before Poly1305
    tags); ValueError for another value."""
    return check_tag(conf.get("tag", "hmac"))


# How the writer compresses blocks: a policy, not a parameter (any record may hold
# any level, §5.2), so it is outside `check` and may be changed (§3).
COMPRESSION_DEFAULT = "zstd:1"
ZSTD_LEVELS = range(-7, 20)   # zstd's fast levels down to -7, and 1..19 (20+ need big windows)


# Most neighbouring fresh data blocks a writer compresses as one run (codec 2, §5.2): a policy
# like `compression`. New stores are made with RUN_DEFAULT; a config without the key writes
# no runs (1), as before.
RUN_DEFAULT = 16
RUN_MAX = 64


def check_run(run):
    """run, a `run` setting: an integer from 1 (no runs) to RUN_MAX; ValueError otherwise."""
    if type(run) is not int or not 1 <= run <= RUN_MAX:
        raise ValueError(f"run = {run!r}, which is not an integer from 1 (no runs) to {RUN_MAX}")
    return run


def store_run(conf):
    """The longest run the store's writers make (§3 `run`; 1: none), at most what half an arena
    holds so a run always fits in an empty arena; ValueError for a value outside 1..RUN_MAX."""
    run = check_run(conf.get("run", 1))
    return max(1, min(run, conf["arena_size"] // 2 // (64 + conf["block_size"])))


def compression_level(text):
    """The zstd level of a `compression` setting: "zstd:N", "zstd" (level 1) or "none" (0, never
    compress); ValueError naming the accepted forms."""
    if text == "none":
        return 0
    name, _, level = text.partition(":")
    try:
        n = int(level) if level else 1
    except ValueError:
        n = None
    if name != "zstd" or n not in ZSTD_LEVELS or n == 0:
        raise ValueError(f"compression {text!r} is not \"none\", \"zstd\" or \"zstd:N\" with N a zstd level "
                         f"from {ZSTD_LEVELS.start} to {ZSTD_LEVELS.stop - 1} (0 excluded)")
    return n


def config_check(mac_key, conf):
    """The config's `check`: a MAC over its parameters, so an edit is caught at open."""
    keys = [*CONFIG_TYPES, *(["tag"] if "tag" in conf else [])]
    body = json.dumps({k: conf[k] for k in sorted(keys)}, sort_keys=True, separators=(",", ":"))
    return mac(mac_key, b"config", body.encode()).hex()[:32]


def pack_config(conf):
    return (json.dumps({k: conf[k] for k in CONFIG_KEYS if k in conf}, indent=1) + "\n").encode()


def unpack_config(b):
    conf = json.loads(b)
    if conf.get("format") != "foundation-store":
        raise ValueError("not a Foundation store config")
    if conf.get("version") != VERSION:
        raise ValueError(f"store format version {conf.get('version')} is not supported by this Foundation (format {VERSION})")
    return conf
