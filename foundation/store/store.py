"""The content-addressed store of paper §3 (Figure 4b and 4c), on one disk: the one door for blocks.

Store is a facade over one part per concern: the write path (dedup.py:
fresh or duplicate, decided mostly in memory), the read path (read.py),
the in-memory index cache, Bloom filter and block cache (cache.py), and
the primary files with their keys and locks (primary.py). This module
opens and closes them in the right order, keeps the commit points (sync,
flush) and the damaged-record bookkeeping. The "venti" policy turns the
in-memory tricks off, for benchmarks.
"""

import json
import logging
import os
from collections import OrderedDict
from datetime import datetime, timezone

from foundation import native
from foundation.crypto.keys import Keys, create_key_file
from foundation.errors import (BadInput, DataCorrupt, Error, DerivedCorrupt, RolledBack, StoreBusy, StoreMissing,
                               StoreNotEmpty, UsageError)
from foundation.store import format as F
from foundation.store import primary, switch
from foundation.store.rollback import last_record
from foundation.store.arena import Log
from foundation.store.cache import LRU, IndexCache, Tuning, give_back
from foundation.store.dedup import Writes
from foundation.store.disk import Disk, atomic_write
from foundation.store.index import Index, IndexFull
from foundation.store.read import Reads

log = logging.getLogger(__name__)

DATA, TREE, CATALOG = F.DATA, F.TREE, F.CATALOG


class BlockType:
    DATA = F.DATA
    TREE = F.TREE
    CATALOG = F.CATALOG


class Store(Writes, Reads, IndexCache):
    """Open with Store.open(); a context manager. Public API (docs/design.md): create, open, write,
    write_blocks, read, read_blocks, latest, sync, flush, refresh, close, stats; for gc and repair
    summary_records, exclusive, suspend/resume, rebuild_derived, forget_damaged, skip_records."""

    # ---- creating ------------------------------------------------------------

    @staticmethod
    def create(path, mode="hash", block_size=4096, arena_size=16 << 20, max_log_size=256 << 30,
               encrypt=True, key_file=None, passphrase=None, compression=None, run=None, tag=None):
        """Make a new store in the empty directory `path`; returns the key file path (or None).
        `compression`, `run`: the writers' settings (format §3), None for the defaults; `tag`:
        the record tag (§5.2), None for the default."""
        if mode not in ("hash", "value"):
            raise BadInput(f"mode must be 'hash' or 'value', not {mode!r}")
        if block_size < 512 or block_size > 65536 or block_size & (block_size - 1):
            raise BadInput(f"block size must be a power of two from 512 to 65536, not {block_size}")
        if arena_size < 64 * block_size or arena_size > (1 << 32) - 1:
            raise BadInput(f"arena size must be at least 64 blocks ({64 * block_size}) and below 4 GiB, not {arena_size}")
        if max_log_size < arena_size:
            raise BadInput("the maximum log size must be at least one arena")
        if compression is not None:
            try:
                F.compression_level(compression)
            except ValueError as e:
                raise BadInput(str(e)) from None
        try:
            run = F.check_run(F.RUN_DEFAULT if run is None else run)
            tag = F.check_tag(F.TAG_DEFAULT if tag is None else tag)
        except ValueError as e:
            raise BadInput(str(e)) from None
        if not os.path.isdir(path):
            raise StoreMissing(path)
        if os.listdir(path):
            raise StoreNotEmpty(path)
        import uuid  # here, not at every open: uuid imports platform

        su = str(uuid.uuid4())
        keys = Keys.unkeyed()
        if encrypt:
            key_file = key_file or primary.default_key_path(su)
            key_dir = os.path.realpath(os.path.dirname(os.path.abspath(key_file)))
            home = os.path.realpath(path)
            # The store's own directory counts too (a prefix test with a separator missed it).
            if os.path.commonpath([key_dir, home]) == home:
                raise BadInput(f"the key file {key_file} must not be kept inside the store {path}: the store disk "
                               f"may be stolen. Keep it on another disk (e.g. the default /etc/foundation/keys/)")
            os.makedirs(key_dir, mode=0o700, exist_ok=True)
            master = create_key_file(key_file, su, passphrase)
            keys = Keys.derive(master, su)
        keylen = 32 if mode == "hash" else 8
        home, _ = primary.index_plan(max_log_size, block_size, keylen)
        conf = dict(format="foundation-store", version=F.VERSION, uuid=su, mode=mode, block_size=block_size,
                    arena_size=arena_size, max_log_size=max_log_size, encrypted=bool(encrypt),
                    key_check=keys.check_value(), index_buckets=home, bucket_size=4096,
                    created=datetime.now(timezone.utc).isoformat(timespec="seconds"))
        if tag != "hmac":  # hmac: no key, so that Foundations made before Poly1305 tags read the store
            conf["tag"] = tag
        conf["check"] = F.config_check(keys.mac, conf)
        if compression is not None:
            conf["compression"] = compression
        conf["run"] = run
        os.makedirs(os.path.join(path, F.ARENAS))
        os.makedirs(os.path.join(path, F.SUMMARIES))
        disk = Disk(path)
        lg = Log(path, disk, primary.codec(keys, 0, conf), keys, conf, True)
        lg.head = F.Head(0, F.ARENA_HEADER_SIZE, 0, F.ZERO_CHAIN)
        lg.open = lg._create_arena(0)
        lg.write_head(both=True)
        lg.close()
        primary.make_derived(path, disk, conf, keylen, lg.uuid)
        primary.write_config(path, F.pack_config(conf))
        return key_file if encrypt else None

    # ---- opening -------------------------------------------------------------

    @classmethod
    def open(cls, path, key_file=None, passphrase=None, writable=False, tuning=None, master=None,
             recovering=False, watch=None, salvage=False):
        """`salvage`: `foundation rebuild --salvage` going on without a lost newest arena (Log.load).
        `passphrase`: for a key file wrapped by one, a string or a callable asked only then (the
        CLI's prompt); the store itself never prompts, and without one such a key file raises
        KeyMissing. `recovering`: foundation recover's own opens of a store it has not finished.
        `watch`: the host's record of the newest commit it saw (rollback.Watch): a store older than
        it raises RolledBack for a writer, before anything is written, and sets `rolled_back` (the
        message) for a reader."""
        s = cls.__new__(cls)
        s.watch = watch
        s.salvage = salvage
        s._init(path, key_file, passphrase, writable, tuning or Tuning(), master, recovering)
        return s

    watch = None
    rolled_back = None
    _counted = None  # the counters as last written

    def _init(self, path, key_file, passphrase, writable, tuning, master, recovering=False):
        self.path, self.writable, self.tuning = path, writable, tuning
        self.lockfd = self.readfd = None
        self.index = self.bloom = None
        self.log = None
        conf, _ = primary.read_config(path, recovering=recovering)
        self.conf = conf
        self.uuid = conf["uuid"]
        self.mode = conf["mode"]
        self.block_size = conf["block_size"]
        self.arena_size = conf["arena_size"]
        self.ref_size = 32 if self.mode == "hash" else 8
        self.keylen = self.ref_size
        self.null_ref = bytes(self.ref_size)
        self.zero_block = bytes(self.block_size)
        self.keys, _ = primary.load_keys(conf, path, key_file, master, passphrase)
        primary.check_config(conf, self.keys, os.path.join(path, F.CONFIG))
        if writable:
            self._lock()
        else:
            self._share()
        self.disk = Disk(path)
        level = primary.store_level(conf) if tuning.zlevel is None else tuning.zlevel
        self.codec = primary.codec(self.keys, level, conf)
        self.venti = tuning.policy == "venti"
        self.blocks = LRU(tuning.block_cache_bytes)
        self.summaries = OrderedDict()  # arena -> native.Table (the index cache)
        self.summary_entries = 0
        self.counters = self._load_counters()
        self.repaired = []
        self._switched = False  # resume() after a gc switch: the dropped index is expected
        self.scanned = set()  # arenas whose summary this session rebuilt by scanning them
        self._recent = []  # summaries loaded by the current write batch
        try:
            self._check_rollback()
            self._open_structures()
        except BaseException:
            self.close()
            raise
        if self.watch and not self.rolled_back:
            self.record_head(newer_only=not writable)

    def record_head(self, newer_only=False):
        """Tell the watch (the host's record) this store's head is the newest it has seen of it."""
        head, oa = self.log.head, self.log.open
        last = last_record(oa, head.end) if oa is not None and oa.n == head.arena else (0, b"")
        self.watch.record(self.uuid, head, last, newer_only)

    def _check_rollback(self):
        if self.watch is None:
            return
        why = primary.check_rollback(self.path, self.uuid, self.keys.mac, self.watch)
        if why:
            # The head copies may lag the log (sealed arenas and commit records past them carry
            # it forward): judge the commit an open finds, read without writing anything.
            log = Log(self.path, self.disk, self.codec, self.keys, self.conf, False)
            try:
                log.load()
                why = primary.check_rollback(self.path, self.uuid, self.keys.mac, self.watch, log.head)
            except Error:
                pass
            finally:
                log.close()
        if why and self.writable:
            raise RolledBack(why)
        self.rolled_back = why

    def _lock(self):
        self.lockfd = primary.lock_writer(self.path)

    def _share(self):
        """Readers hold a shared lock on `readers`, so gc never moves arenas under them."""
        self.readfd = primary.lock_readers(self.path, False, lambda: StoreBusy(
            f"garbage collection is running on store {self.path}; try again when it has finished"))

    def exclusive(self):
        """For gc: no reader may have the store open while arenas move."""
        self.readfd = primary.lock_readers(self.path, True, lambda: StoreBusy(
            f"store {self.path} is open for reading (the /snapshot tree is mounted, or a restore "
            "or replicate is running); stop it and run gc again"))

    def _open_structures(self):
        self.log = Log(self.path, self.disk, self.codec, self.keys, self.conf, self.writable)
        self.log.threads = self.tuning.threads
        self.log.salvaging = getattr(self, "salvage", False)
        self.log.on_seal = self._sealed
        switching = self._interrupted_gc()
        self.log.load(switching)
        primary.check_arena_size(self.conf, self.log.open.header, os.path.join(self.path, F.CONFIG))
        self.repaired += self.log.repaired
        self.bad = self._load_damaged() if not switching else set()
        if self.log.damaged:
            self.remember_damaged(self.log.damaged)
        if switching:  # the index and damaged.json name the old arenas' addresses
            self.index = self._memory_index(f"a gc of store {self.path} was interrupted during its switch")
            return self._finish_open()
        uuidb = self.log.uuid
        ipath = os.path.join(self.path, F.INDEX)
        try:
            self.index = Index.open(ipath, self.disk, self.keylen, uuidb, self.writable)
            if self.index.h.covered > self.log.end_addr:
                raise DerivedCorrupt("the index is ahead of the log")
        except DerivedCorrupt as e:
            if self.index:
                self.index.close()
                self.index = None
            if not self.writable:
                self.index = self._memory_index(e)
                return self._finish_open()
            if self._switched:
                log.info("the index named the arenas gc replaced; rebuilding it from the new ones")
            else:
                log.warning("%s; rebuilding it from the arenas", e)
                self.repaired.append(f"rebuilt the index ({e})")
            from foundation.store.rebuild import rebuild_index
            rebuild_index(self)
        self._finish_open()

    def _interrupted_gc(self):
        """What an interrupted gc left (foundation.store.switch): a writer finishes its switch, or
        undoes a gc stopped before it, and says so; a reader reads the switch's new arena set under
        its head, never waiting for a writer -> that head, or None."""
        if not switch.pending(self.path):
            if self.writable and switch.drop_leftovers(self.path):
                self.repaired.append("undid an interrupted gc (deleted the arenas it never swapped in)")
            return None
        if self.writable:
            switch.finish(self.path)
            log.warning("store %s: finished the switch of an interrupted gc (its new arenas and head are in place)",
                        self.path)
            self.repaired.append("finished the switch of an interrupted gc")
            return None
        head, self.log.moved = switch.view(self.path)
        return F.Head.unpack(head, self.keys.mac)

    def _finish_open(self):
        self._reset_buffer()
        self._catch_up(self.index.h.covered)
        if self.writable and not self.venti:
            self._open_bloom()

    def forget_damaged(self, n):
        """Arena n was rewritten: the damaged records known there are gone (gc kept intact copies)."""
        self.bad = {a for a in self.bad if a >> 32 != n}

    def skip_records(self, addrs):
        """Never deduplicate against the records at these addresses in this session (known damaged)."""
        self.bad |= set(addrs)

    def rebuild_derived(self):
        """After records moved (gc) or summaries were rebuilt: index and Bloom filter rebuilt from the
        summaries, every cache started afresh."""
        from foundation.store.rebuild import rebuild_bloom, rebuild_index
        self.summaries.clear()
        self.summary_entries = 0
        self.blocks.clear()
        rebuild_index(self)
        rebuild_bloom(self)
        self._reset_buffer()
        self._catch_up(self.index.h.covered)

    # ---- closing ---------------------------------------------------------------

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close(clean=exc[0] is None)

    def suspend(self):
        """Close the log and derived structures, keeping the locks (gc switches the log)."""
        self._close_structures()

    def resume(self, switched=False):
        """Open the log again; switched: gc has just switched it, so the index it dropped is rebuilt
        as a matter of course, not reported as damage."""
        self.summaries.clear()
        self.summary_entries = 0
        self.blocks.clear()
        self._switched = switched
        try:
            self._open_structures()
        finally:
            self._switched = False

    def close(self, clean=True):
        try:
            if self.writable and clean and self.log is not None and self.index is not None:
                self.sync()
                self._drop_lookups()    # no lookup past here: the flush's entries peak without them
                if self._flush_due():
                    self.flush()
                elif self.bloom is not None:
                    self._save_bloom()
                if self.watch:
                    self.record_head()
        finally:
            self._close_structures()
            self._drop_caches()
            for fd in (self.lockfd, self.readfd):
                if fd is not None:
                    os.close(fd)
            self.lockfd = self.readfd = None

    def _drop_caches(self):
        # A closed store answers no lookup: its index cache, decoded blocks and lookup tables go
        # now, not with the object (`archive` reads the store again for the file listings with
        # this one still in scope: they were 30-40 MB of its peak).
        if getattr(self, "summaries", None) is None:
            return      # closed before its caches were made
        self._drop_lookups()
        if getattr(self, "wbuf", None) is not None:
            self.wbuf = self.open_table = native.Table(self.keylen, 16)
        give_back()

    def _drop_lookups(self):
        """The index cache and decoded blocks let go (caches only: a lookup would load them again)."""
        self.summaries.clear()
        self.summary_entries = 0
        self.blocks.clear()
        self._recent, self._ahead, self.holding, self._gathered = [], {}, None, None

    def _close_structures(self):
        if self.index:
            self.index.close()
            self.index = None
        if self.bloom is not None:
            self.bloom.close()
            self.bloom = None
        if self.log:
            self.log.close()
            self.log = None

    def commit(self):
        """The newest commit (foundation.store.arena.Commit): its generation and log position."""
        return self.log.commit()

    def sync(self):
        """The commit point: everything written so far survives a crash."""
        self._need_writable()
        self.log.sync()
        text = json.dumps(self.counters).encode()
        if text != self._counted:  # a close after a commit has nothing new to count
            atomic_write(os.path.join(self.path, F.COUNTERS), text, sync=False)
            self._counted = text

    def flush(self):
        """Merge the write buffer into the on-disk index in one sorted pass."""
        self._need_writable()
        if self.log.end_addr == self.index.h.covered and not len(self.wbuf):
            return
        # The index may only cover committed records: a cut tail must never
        # leave an index entry behind that names a block we no longer have.
        self.log.sync()
        # The table hands over its own entries (its slots freed first) and is let go while the
        # index is written (no lookup runs meanwhile): a flush holds the entries once, sorted in
        # place; should it fail, they go back into a table.
        entries = self.wbuf.take()
        self.wbuf = native.Table(self.keylen, 1024)
        give_back()
        native.sort_entries(entries, self.keylen + 8, self.keylen)
        covered = self.log.end_addr
        try:
            try:
                self.index.flush(entries, covered)
            except IndexFull:
                from foundation.store.rebuild import grow_index
                grow_index(self, entries, covered)
            except DerivedCorrupt as e:  # the log is synced: the rebuilt index covers these entries too
                self.replace_index(e)
        except BaseException:
            self.wbuf = self._buffer_from(entries)
            raise
        del entries
        give_back()
        if self.bloom is not None:
            self._save_bloom()

    def _need_writable(self):
        if not self.writable:
            raise UsageError("the store was opened read-only")

    # ---- the index cache -------------------------------------------------------

    def _load_damaged(self):
        """Addresses of records known to be damaged (by `verify`, or stepped
        over at open). Deduplication never points at them, so the next archive
        that meets such a block stores it again and heals the archive (§3.4)."""
        bad = {F.addr(n, o) for n, o in self.log.damaged}
        try:
            with open(os.path.join(self.path, F.DAMAGED)) as f:
                recs = json.load(f)["records"]
            # [arena, offset, generation]: written by gc before it swapped in a
            # rewritten arena; it names a record of that generation only.
            gen = {n: self._generation(n) for n, _, *g in recs if g}
            bad |= {F.addr(n, o) for n, o, *g in recs if not g or gen[n] == g[0]}
        except (OSError, ValueError, KeyError, TypeError):
            pass
        return bad

    def remember_damaged(self, pairs):
        """Records found damaged while scanning (stepped over in the open arena, left out of a
        rebuilt summary): no summary lists them, so they go into damaged.json (when writable),
        where deduplication, gc and later sessions find them."""
        self.bad |= {F.addr(n, o) for n, o in pairs}
        if not self.writable:
            return
        path = os.path.join(self.path, F.DAMAGED)
        try:
            with open(path) as f:
                recs = list(json.load(f)["records"])
        except (OSError, ValueError, KeyError, TypeError):
            recs = []
        have = {(r[0], r[1]) for r in recs}
        add = [[n, o] for n, o in sorted(set(pairs)) if (n, o) not in have]
        if add:
            atomic_write(path, json.dumps({"records": recs + add}).encode())

    def _generation(self, n):
        try:
            tr = self.log.trailer(n) if n < self.log.open.n else None
        except DataCorrupt:
            tr = None
        return tr.generation if tr else None

    def _drop_bad(self, keys, addrs, types):
        kl = self.keylen
        keep = [i for i, a in enumerate(addrs) if a not in self.bad]
        return (b"".join(keys[i * kl:(i + 1) * kl] for i in keep), [addrs[i] for i in keep],
                bytes(types[i] for i in keep))

    # ---- accounting --------------------------------------------------------------

    def _load_counters(self):
        c = dict(offered_blocks=0, offered_bytes=0, zero_blocks=0, dup_blocks=0, records=0, raw_bytes=0)
        try:
            with open(os.path.join(self.path, F.COUNTERS)) as f:
                c.update(json.load(f))
        except (OSError, ValueError):
            pass
        return c

    def log_mark(self):
        """Where the log ends now, for log_bytes_since: (the open arena, its file's size)."""
        n = self.log.open.n
        return n, self.log.file_size(n)

    def log_bytes_since(self, mark):
        """Bytes the log grew by since log_mark() gave `mark`, from the arenas since then alone: a
        command's fixed cost does not grow with the store (log_bytes stats every arena)."""
        n0, size0 = mark
        return sum(self.log.file_size(n) for n in range(n0, self.log.open.n + 1)) - size0

    def log_bytes(self):
        """Bytes of the log on disk (all arenas)."""
        total = 0
        d = os.path.join(self.path, F.ARENAS)
        for name in os.listdir(d):
            if name.endswith(".arena"):
                total += os.path.getsize(os.path.join(d, name))
        return total

    def stats(self):
        from foundation.store.verify import stats
        return stats(self)

