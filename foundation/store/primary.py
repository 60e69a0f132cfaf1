"""The store's primary files, opened in one place: config, head, arenas, key files and locks.

A store directory holds two kinds of file: primary ones, which nothing
else can give back (foundation.json, head, arenas/, the key file kept
elsewhere), and derived ones (summaries, index, Bloom filter), which the
next writable open rebuilds. `Store` reaches the primary files through
this module, and so do the tools that need them without the caches —
replicate and audit while an archive writes, repair when the store cannot
open at all, recover while the store does not exist yet — through
`Primary`. What each file means, how it is locked, and what a new store's
empty derived files look like is therefore written once (docs/design.md,
"Who owns which file").
"""

import errno
import fcntl
import json
import logging
import mmap
import os
import time

from foundation import native
from foundation.crypto.keys import Keys, load_key_file
from foundation.errors import (DataCorrupt, KeyMissing, StoreBusy, StoreConfigBad, StoreLocked, StoreMissing,
                               StoreReadOnly, WrongKey)
from foundation.fields import Fields
from foundation.store import format as F
from foundation.store import layout as L
from foundation.store import rollback, switch
from foundation.store.arena import Commit, Log, read_head, write_heads
from foundation.store.disk import Disk, atomic_write, flock, fsync_dir
from foundation.store import bloom
from foundation.store.index import INITIAL, Index, plan

log = logging.getLogger(__name__)


# ---- config and keys -------------------------------------------------------------------------

def read_config(path, config=None, recovering=False):
    """(config dict, its bytes) of the store at path; `config` (bytes) stands in for its
    foundation.json (a store being recovered). A store whose recovery has not finished opens only
    for recover (`recovering`)."""
    where = f"of {path}"
    if config is None:
        if not os.path.isdir(path):
            raise StoreMissing(path)
        where = os.path.join(path, F.CONFIG)
        try:
            with open(where, "rb") as f:
                config = f.read()
        except FileNotFoundError:
            raise StoreMissing(f"{path} (no {F.CONFIG}: not a Foundation store, or the backup disk "
                               "is not mounted)") from None
        if not recovering and os.path.exists(os.path.join(path, F.RECOVERING)):
            raise StoreMissing(f"{path} (its recovery from a replica has not finished: run the same "
                               "`foundation recover` again)")
    try:
        conf = F.unpack_config(config)
    except (ValueError, KeyError) as e:
        raise DataCorrupt(f"store config {where} is unreadable ({e})") from None
    if where.endswith(F.CONFIG):  # the store's own file; one that stands in is checked by its caller (recover)
        check_types(conf, where)
    return conf, bytes(config)


def check_types(conf, where):
    """Every parameter present with its type and a value a store can have: an edited file is named,
    never met later as a KeyError."""
    for k, t in F.CONFIG_TYPES.items():
        if k not in conf:
            raise StoreConfigBad(where, f"has no {k!r}")
        v = conf[k]
        if type(v) is not t:
            raise StoreConfigBad(where, f"has {k} = {v!r}, which is not {'an' if t is int else 'a'} {t.__name__}")
    bs = conf["block_size"]
    if conf["mode"] not in ("hash", "value") or bs < 512 or bs > 65536 or bs & (bs - 1) or \
            conf["arena_size"] < 64 * bs or conf["arena_size"] >= 1 << 32:
        raise StoreConfigBad(where, "has a mode, block_size or arena_size no store can have")
    try:
        store_level(conf)
    except (TypeError, ValueError) as e:
        raise StoreConfigBad(where, f"has an unusable compression setting: {e}") from None
    try:
        F.store_run(conf)
    except ValueError as e:
        raise StoreConfigBad(where, f"has an unusable run setting: {e}") from None
    try:
        F.record_tag(conf)
    except ValueError as e:
        raise StoreConfigBad(where, f"has an unknown record tag: {e}") from None


def store_level(conf):
    """The zstd level the store's writers use: its `compression` setting (§3), or the default."""
    setting = conf.get("compression", F.COMPRESSION_DEFAULT)
    if not isinstance(setting, str):
        raise TypeError(f"compression = {setting!r}, which is not a string")
    return F.compression_level(setting)


def check_config(conf, keys, where):
    """The parameters are those the store was made with: `check` (written by init since format 1
    §2; absent in older stores) MACs them under the store's key."""
    if "check" in conf and conf["check"] != F.config_check(keys.mac, conf):
        raise StoreConfigBad(where, "was edited after the store was made (its check does not match its "
                             "mode, block_size, arena_size or another parameter)")


def check_arena_size(conf, header, where):
    """Every arena header records the arena size it was made with (also in stores without `check`)."""
    if header is not None and header.size != conf["arena_size"]:
        raise StoreConfigBad(where, f"says arena_size {conf['arena_size']}, but the store's arenas were made "
                             f"with {header.size}")


def write_config(path, config):
    """The config goes last when a store is made: a directory without it is not yet a store."""
    atomic_write(os.path.join(path, F.CONFIG), config)


def default_key_path(store_uuid):
    base = "/etc/foundation/keys" if os.geteuid() == 0 else os.path.expanduser("~/.config/foundation/keys")
    return os.path.join(base, f"{store_uuid}.key")


def load_keys(conf, where, key_file=None, master=None, passphrase=None):
    """(keys, master key or None) of the store whose config is conf. `passphrase`: a string, or a
    callable asked only if the key file is wrapped (the CLI's prompt); without one a wrapped key
    file raises KeyMissing. WrongKey if the key is not this store's."""
    if not conf["encrypted"]:
        keys = Keys.unkeyed()
    else:
        if master is None:
            if not key_file:
                key_file = default_key_path(conf["uuid"])
                if not os.path.exists(key_file):
                    raise KeyMissing(f"store {where} is encrypted: pass --key-file (or set FOUNDATION_KEY_FILE) "
                                     "to the key file made by `foundation init`")
            master = load_key_file(key_file, conf["uuid"], passphrase)
        keys = Keys.derive(master, conf["uuid"])
    if keys.check_value() != conf["key_check"]:
        raise WrongKey(f"wrong key for store {where}: the key does not match the store's key check")
    return keys, master


def codec(keys, zlevel, conf):
    """The record codec of the store whose config is conf: its keys, its record tag (§5.2)."""
    poly = F.record_tag(conf) == "poly1305"
    return native.Codec(keys.enc, keys.mac, zlevel, keys.tag_key() if poly else None)


# ---- locks (docs/format.md §1) -----------------------------------------------------------------

def lock_writer(path):
    """The one-writer lock, with our pid in it for the message of the next one -> fd. The first
    file a writer opens: a store it may not write is refused here, before anything changed."""
    try:
        return flock(os.path.join(path, F.LOCK), fcntl.LOCK_EX, lambda pid: StoreLocked(path, pid), write_pid=True)
    except OSError as e:
        if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            raise StoreReadOnly(path, f"{os.path.join(path, F.LOCK)}: {e.strerror}") from None
        raise


def lock_readers(path, exclusive, busy):
    """The readers' lock: shared by every reader, exclusive for whoever moves arenas (gc, repair), so
    neither runs under the other -> fd, or None on a read-only store disk (nothing moves arenas there).
    `busy()` makes the error when the other side holds it."""
    return flock(os.path.join(path, F.READERS), fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH,
                 lambda _: busy(), optional=True)


def lock_config(path, busy):
    """One replicate at a time: an flock on the config file itself -> fd."""
    return flock(os.path.join(path, F.CONFIG), fcntl.LOCK_EX, lambda _: busy(), optional=True)


def trailer(path, mac_key, n, file=None):
    """The trailer of sealed arena n of the store at path (in `file`, if not its own), or None if
    its file has no valid one."""
    try:
        with open(file or os.path.join(path, F.ARENAS, F.arena_name(n)), "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - F.MAX_TRAILER))
            tail = f.read()
    except FileNotFoundError:
        return None
    try:
        return F.Trailer.from_tail(tail, mac_key, n)
    except ValueError:
        return None


def check_rollback(path, uuid, mac_key, watch, head=None):
    """The message if the store at path is older than the newest commit `watch` (rollback.Watch)
    saw of it, else None; read before anything is written. A head that cannot be read is left to
    the open that follows. With a gc switch pending, either head will do (the host took the
    journal's as the newest before the switch began). `head`: the one to judge (default: the newest
    head copy)."""
    try:
        got = (None, head) if head is not None else read_head(path, mac_key)
    except DataCorrupt:
        return None
    if got is None:
        return None
    pending = switch.journal_head(path)
    if pending is not None:
        try:
            if not watch.check(path, uuid, F.Head.unpack(pending, mac_key), rollback.chain_reader(
                    lambda n: None), lambda n, off: None):
                return None
        except ValueError:
            pass
    def tag_at(n, off):
        try:
            with open(os.path.join(path, F.ARENAS, F.arena_name(n)), "rb") as f:
                hdr = os.pread(f.fileno(), L.HEADER_SIZE, off)
        except FileNotFoundError:
            return None
        if len(hdr) == L.HEADER_SIZE and not (any(hdr[L.H_MAGIC:L.H_MAGIC + L.MAGIC_SIZE]) and
                                              any(hdr[L.H_TAG:L.H_TAG + L.TAG_SIZE])):
            return None   # zeroed (a lost page): damage, which verify names, not another history
        return hdr[L.H_TAG:L.H_TAG + L.TAG_SIZE]

    return watch.check(path, uuid, got[1], rollback.chain_reader(lambda n: trailer(path, mac_key, n)), tag_at)


# ---- a new store's derived files -------------------------------------------------------------------

def capacity(max_log_size, block_size):
    """Records a full log holds at most (one per block)."""
    return max_log_size // block_size


def index_plan(max_log_size, block_size, keylen):
    """(home buckets, buckets in the file) of a new store's index: INITIAL entries (fewer if the
    whole log holds fewer); it grows as records come (foundation.store.index)."""
    return plan(min(INITIAL, capacity(max_log_size, block_size)), keylen)


def make_derived(path, disk, conf, keylen, log_uuid):
    """An empty index and Bloom filter, as `init` makes them, both small: they grow with the store.
    The first writable open takes every record in from the summaries (or scans) and merges them
    at its first flush."""
    home, nfile = index_plan(conf["max_log_size"], conf["block_size"], keylen)
    Index.create(os.path.join(path, F.INDEX), disk, keylen, home, nfile, log_uuid).install(
        os.path.join(path, F.INDEX))
    bloom.create(os.path.join(path, F.BLOOM), bloom.size_for(0)).close()
    atomic_write(os.path.join(path, F.BLOOM_STATE), json.dumps({"covered": 0}).encode())


# ---- the files without the caches ----------------------------------------------------------------

class ArenaFile(Fields):
    """One arena file the head names. Under the readers' lock nothing rewrites it: a writer only
    appends past the head's end and seals in place, so the bytes a reader sees stay as they were."""

    def __init__(self, n, path, size, trailer=None, ident=b""):
        self.n, self.path = n, path
        self.size = size             # 0: the file is missing
        self.trailer = trailer       # F.Trailer of a sealed arena, None if unreadable (or open)
        self.ident = ident           # open arena: the first bytes of its header tag (b"" if unreadable)

    def view(self, start=0, end=None):
        """Bytes [start, end) through mmap: a large arena is not copied."""
        end = self.size if end is None else end
        with open(self.path, "rb") as f:
            m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        return memoryview(m)[start:end]


class Primary:
    """A store's primary files (config, head, arenas) with its keys, but none of its caches.

    Enough to copy, check and replace arenas: while an archive writes (a
    reader trusts only what the head commits), or when the store cannot
    open at all (repair). `config` (bytes of a foundation.json) stands in for
    the store's own, for a store still being recovered. It also checks
    arena files that are not in the store: foundation.store.verify.verify_arena
    needs only .log, .codec, .keys and .mode.
    """

    def __init__(self, path, key_file=None, config=None, master=None, passphrase=None):
        self.path = path
        self.conf, self.config = read_config(path, config)
        self.uuid = self.conf["uuid"]
        self.mode = self.conf["mode"]
        self.keys, self.master = load_keys(self.conf, path, key_file, master, passphrase)
        if config is None:
            check_config(self.conf, self.keys, os.path.join(path, F.CONFIG))
        self.codec = codec(self.keys, 1, self.conf)
        self.disk = Disk(path)
        self.log = Log(path, self.disk, self.codec, self.keys, self.conf, False)
        self._locks = []

    # -- the head

    def read_head(self):
        """(bytes, Head) of the store's commit point: the newest valid head copy carried forward by
        the log (docs/format.md §6), as a reader finds it; if the log cannot be read that far (an
        arena missing or damaged: repair's case), the newest valid head copy."""
        try:
            head = self._loaded().head
        except DataCorrupt:
            got = read_head(self.path, self.keys.mac)
            if got is None:
                raise
            return got
        return head.pack(self.keys.mac), head

    def commit(self) -> Commit:
        """The newest commit (arena.Commit: generation, arena, end): the newest valid head copy
        carried forward by the log, as a writer's open would find it, without writing anything.
        Rollback detection compares its generation with the newest one seen before."""
        return self._loaded().commit()

    def _loaded(self):
        if self.log.open is None:
            try:
                head = None
                if switch.pending(self.path):   # the new arena set, whole on disk from the journal on
                    head, self.log.moved = switch.view(self.path)
                    head = F.Head.unpack(head, self.keys.mac)
                self.log.load(head)
            except BaseException:
                self.log.head = self.log.open = None
                raise
        return self.log

    def write_head(self, head_bytes):
        """Both head copies (a recovered store: no earlier commit to fall back to)."""
        write_heads(self.path, head_bytes, self.disk)

    # -- arenas

    def arena_path(self, n):
        return self.log.path(n)

    def arena_files(self, head, ident_size=L.TAG_SIZE):
        """[ArenaFile] of the arenas the head names: sealed ones with their trailers (None if
        unreadable), the open one with the first ident_size bytes of its header tag."""
        out = []
        for n in range(head.arena + 1):
            p = ArenaFile(n, self.arena_path(n), 0)
            try:
                fd = os.open(p.path, os.O_RDONLY)
            except FileNotFoundError:
                out.append(p)
                continue
            try:
                p.size = os.fstat(fd).st_size
                if n < head.arena:
                    k = min(p.size, F.MAX_TRAILER)
                    try:
                        p.trailer = F.Trailer.from_tail(os.pread(fd, k, p.size - k), self.keys.mac, n)
                    except ValueError:
                        pass
                else:
                    try:
                        F.ArenaHeader.unpack(os.pread(fd, F.ARENA_HEADER_SIZE, 0), self.keys.mac)
                        p.ident = os.pread(fd, ident_size, L.A_TAG)
                    except ValueError as e:
                        if head.end > F.ARENA_HEADER_SIZE:
                            raise DataCorrupt(f"arena {n} offset 0: the open arena's header is damaged ({e}); "
                                              "run `foundation repair`") from None
            finally:
                os.close(fd)
            out.append(p)
        return out

    def read_arena(self, n):
        """The bytes of arena n's file, or None if there is none."""
        try:
            with open(self.arena_path(n), "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def trailer(self, n):
        """The trailer of sealed arena n, or None if its file has no valid one."""
        if not self.log.moved and switch.pending(self.path):
            self.log.moved = switch.view(self.path)[1]   # a pending gc switch: its new arena n
        return trailer(self.path, self.keys.mac, n, self.arena_path(n))

    def install_arena(self, n, data):
        """Put new bytes of arena n in place atomically (a crash leaves the old or the new file). Its
        summary and the index go: one rebuilt around a damaged record does not list it, and a mended
        record must be found again (the next writable open rebuilds them)."""
        atomic_write(self.arena_path(n), data, tmp=self.arena_path(n) + ".repair")
        self.forget_derived(n)

    def install_arena_file(self, n, tmp):
        """Rename a checked download (beside the arena) into place as arena n."""
        os.rename(tmp, self.arena_path(n))

    def make_dirs(self):
        os.makedirs(os.path.join(self.path, F.ARENAS), exist_ok=True)
        os.makedirs(os.path.join(self.path, F.SUMMARIES), exist_ok=True)

    def sync_arenas(self):
        fsync_dir(os.path.join(self.path, F.ARENAS))

    # -- derived files

    def summary(self, n, amac):
        """(keys, addrs, types) from a summary of this very arena n (same arena MAC), or None."""
        try:
            with open(os.path.join(self.path, F.SUMMARIES, F.summary_name(n)), "rb") as f:
                arena, keylen, sum_amac, keys, addrs, types = F.unpack_summary(f.read())
        except (OSError, ValueError):
            return None
        if arena != n or sum_amac != amac or keylen != self.log.keylen:
            return None
        return keys, addrs, types

    def forget_derived(self, n):
        """Arena n's records moved: its summary, the index and the Bloom filter state are rebuilt at the
        next writable open."""
        for name in (os.path.join(F.SUMMARIES, F.summary_name(n)), F.INDEX, F.BLOOM_STATE):
            try:
                os.unlink(os.path.join(self.path, name))
            except FileNotFoundError:
                pass

    def record_damaged(self, records):
        """damaged.json as verify writes it ([(arena, offset)]), so deduplication skips what is still damaged."""
        p = os.path.join(self.path, F.DAMAGED)
        if records or os.path.exists(p):
            atomic_write(p, json.dumps({"records": records}).encode())

    def make_derived(self):
        make_derived(self.path, self.disk, self.conf, self.log.keylen, self.log.uuid)

    # -- locks

    def share(self, busy_one=None, settle=False):
        """Hold the readers' lock (gc waits for us) and the one-replicate-at-a-time lock; release()
        lets both go. `busy_one()`: the error if another holder of the second lock is running.
        A gc switch left pending is read as its new arena set (a reader's view); with `settle`
        (replicate, which writes a copy of the store elsewhere) it is finished first, as the next
        writable open would, unless a writer holds the store (whose open finishes it)."""
        self._hold(lock_readers(self.path, False, lambda: StoreBusy(
            f"garbage collection is running on store {self.path}; replicate when it has finished")))
        if settle and switch.pending(self.path):
            self._settle()
        self._hold(lock_config(self.path, busy_one or (lambda: StoreBusy(
            f"another replicate or audit of store {self.path} is running; wait for it to finish"))))

    repaired = ()

    def _settle(self):
        try:
            fd = lock_writer(self.path)
        except StoreReadOnly:
            return   # nobody can finish it: its new set is read as it stands
        except StoreLocked:
            # A writer opened after the gc died, and its open finishes the switch at once: wait for
            # that (else the new set is read, as by any reader).
            for _ in range(50):
                if not switch.pending(self.path):
                    break
                time.sleep(0.1)
            return
        try:
            if switch.pending(self.path):
                switch.finish(self.path)
                note = "finished the switch of an interrupted gc (its new arenas and head are in place)"
                log.warning("store %s: %s", self.path, note)
                self.repaired = [note]
        finally:
            os.close(fd)
        self.log.close()
        self.log = Log(self.path, self.disk, self.codec, self.keys, self.conf, False)

    def exclusive(self):
        """Hold the writer lock and the readers' lock exclusively, as gc does (repair)."""
        self._hold(lock_writer(self.path))
        self._hold(lock_readers(self.path, True, lambda: StoreBusy(
            f"store {self.path} is open for reading (the /snapshot tree is mounted, or a restore, audit or "
            "replicate is running); stop it and run again")))

    def _hold(self, fd):
        if fd is not None:
            self._locks.append(fd)

    def release(self):
        for fd in self._locks:
            os.close(fd)
        self._locks = []

    def close(self):
        self.log.close()
        self.release()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
