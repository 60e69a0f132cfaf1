"""The nightly run for one VM: snapshot, archive the frozen layer, commit it, all journaled.

Between runs each disk is the chain `base <- overlay(k)`: the base holds
exactly the last archived state, overlay(k) the writes since (paper §2.2,
Figure 2). A run takes an external disk-only snapshot of all disks at once
(-> base <- overlay(k) <- overlay(k+1)), archives the clusters allocated in
the now frozen overlay(k) (the whole disk when there is no earlier snapshot
to build on) while QEMU merges overlay(k) into the base (the guest runs
on), makes the snapshot durable in the catalog, and then deletes overlay(k). A shut-off VM goes
through the same steps: libvirt snapshots inactive domains too, and the
merge is done offline with qemu-img. A shut-off VM whose overlay holds no
write since the last run is recorded again without touching it at all.

Every step is journaled (journal.py) *before* it is carried out, but two
whose repair is that of the step before (`commit`, whose record is the
catalog's; deleting overlay(k), whose repair from `commit` is the same); a run that
is killed, loses its host, meets a libvirt error or a full or missing store
is finished or undone by the next run on that VM, which says what it
repaired. The rule behind every repair: a write the guest made is never
dropped, and a run that got as far as its snapshot is finished rather than
undone (its overlay(k) is frozen and still exactly the disk at the
snapshot, so it can always be archived later).

    journaled step  what may have happened        what the next run does
    --------------  ----------------------------  ------------------------------------------
    snapshot        nothing; new overlays made    the domain (live XML if running, else its
                    (some, or one cut short as    config) uses the new overlays: taken ->
                    its .part), or all; or the    continue at `archive`, recorded as crash-
                    snapshot taken (libvirt is    consistent at the journaled time. Not taken
                    atomic over all disks)        -> delete the unused, empty new files and
                                                  any .part (one holding data is never
                                                  deleted: the run stops and says so); the
                                                  run is dropped.
    archive         part of the disks archived;   the catalog has the run's id -> go on to
                    the catalog record may be     `commit`; otherwise wait for a commit job
                    committed; a running VM's     still running on the disk, then archive
                    merge started early (below),  overlay(k) again (still the same bytes: the
                    running or done               merge only reads it, and leaves the file).
    (commit)        a block job running in QEMU   (not journaled: the journal says `archive`,
                    or finished; or, offline, a   whose repair finds the run in the catalog)
                    partial `qemu-img commit`     new overlay's header already names the base
                    (commits only copy bytes the  -> merged. Else: running -> wait for a commit
                    layer above already shows,    job still running, or start blockcommit again;
                    so a repeat is harmless)      shut off -> `qemu-img commit -d` + `rebase -u`
                                                  again. Then make sure the domain's config no
                                                  longer names overlay(k). A `commit` step
                                                  journaled by an older version: the same.
    (cleanup)       overlay(k) deleted or not     (not journaled either: the `commit` repair
                                                  finds the chain merged) delete
                                                  overlay(k) if it is still there and nothing
                                                  uses it. A `cleanup` step journaled by an
                                                  older version is repaired the same way.

The merge is QEMU's copy; this process only waits for it. So a running
VM's merge starts as soon as the night's blocks are mapped and the swap
check has read the partition table: every byte still to be read then lies
in overlay(k) (which the merge only reads) or in ranges of the base the
merge does not write, so the copy runs beside the store's write instead of
after it. Only for an incremental night whose reads are all plain file
reads (no qemu-nbd, which would open the chain with QEMU's locks), and only
for a snapshot this process took. The base then holds the day before its
snapshot is in the catalog; overlay(k) is deleted only after that, so a
repair still archives it from overlay(k) (the `archive` row above). The
caller's own closing work (the CLI's: closing the store, the file
listings) runs beside the end of the last VM's merge
(`archive(beside_merge=...)`), after the snapshot is in the catalog; a kill
meanwhile is the kill during `commit` above.

A run killed while the guest's file systems are frozen for the snapshot
(kill -9, power cut: stop signals wait for the thaw) leaves the guest
frozen; the next run on that VM thaws it before anything else.

No two runs touch one VM at once (journal.Lock). Tests kill the process at
each point with FOUNDATION_TEST_CRASH_AT=<point> (see CRASH_POINTS and
FROZEN_POINT).
"""

import datetime
import logging
import os
import re
import threading
import time

from foundation.config import quiesce_mode
from foundation.errors import (BadInput, DataCorrupt, DerivedCorrupt, Error, StoreDiskFailed, StoreFull,
                               StoreMissing)
from foundation.faults import crash_point
from foundation.fields import Fields
from foundation.image import qcow2, qemuimg
from foundation.store.disk import fsync_dir
from foundation.vm import journal, swap
from foundation.vm.domain import AgentFailed, Domain, FreezeFailed, LibvirtFailed, UnsupportedDisk
from foundation.vm.journal import VMBusy
from foundation.vm.source import SnapshotSource

log = logging.getLogger(__name__)

CRASH_ENV = "FOUNDATION_TEST_CRASH_AT"
# <step>: right after journaling the step, before doing it; <step>-done: right after doing it.
CRASH_POINTS = ("snapshot", "snapshot-overlays", "snapshot-done", "archive", "commit-early", "archive-disk",
                "archive-done", "commit", "commit-started", "commit-done", "cleanup", "cleanup-done")
FROZEN_POINT = "frozen"   # with the guest's file systems frozen (only reached with a guest agent)
OVERLAY_RE = re.compile(r"^(.*)\.fdn-(\d+)\.qcow2$")
MERGE_ATTEMPTS = 3


class ChainInconsistent(Error):
    """VM {}: {}. Foundation changed nothing; repair the chain by hand (operation guide, 'Repairing a chain by hand')."""

    code = 62


class MergeFailed(Error):
    """VM {}: {} could not be merged into {} ({}). The guest's data is safe on the longer chain; the next run tries again."""

    code = 63


class QuiesceFailed(Error):
    """VM {} was not archived: quiesce = always, but {}. Start qemu-guest-agent in the guest (the domain needs the org.qemu.guest_agent.0 channel), or set quiesce = "auto"."""

    code = 80


class GuestFrozen(Error):
    """VM {}: the guest's file systems are frozen and the guest agent did not thaw them ({}). Run `virsh domfsthaw {}`, then archive again."""

    code = 81


class StoreFailed(Error):
    """Writing to the store failed while archiving {}: {}. Nothing of this run is lost: the next run finishes it."""

    code = 64


class Result(Fields):
    """What one VM's run did: one line of the summary. Result(name, field=value, ...); the class's
    values are the defaults."""

    status = "failed"          # ok | unchanged | skipped | failed
    disks = 0
    changed = 0                # bytes read from the frozen layers and archived
    seconds = 0.0
    consistency = ""           # quiesced | crash-consistent | shut off
    not_quiesced = None        # why a running VM's snapshot is crash-consistent
    error = ""
    snapshot_pause = None      # seconds in the libvirt snapshot call (guest I/O frozen within it)
    freeze_seconds = None      # guest file systems frozen: from the freeze request to the thaw's answer
    commit_seconds = None      # seconds merging overlay(k) (guest keeps running)
    commit_tail = None         # longest job tail: 100 % to done (the only possible pause)
    store_failed = False
    FIELDS = ("name", "status", "disks", "changed", "seconds", "consistency", "not_quiesced", "repaired",
              "error", "snapshots", "snapshot_pause", "freeze_seconds", "commit_seconds", "commit_tail",
              "store_failed")  # (to_json's order)

    def __init__(self, name, repaired=(), snapshots=(), **given):
        self.name = name
        self.repaired = list(repaired)     # what this run repaired of an earlier one
        self.snapshots = list(snapshots)
        self._set(given)

    def to_json(self):
        """Every field, the defaults included."""
        return {k: getattr(self, k) for k in self.FIELDS}


def _crash(point):
    crash_point(CRASH_ENV, point)


def _now():
    return datetime.datetime.now(datetime.timezone.utc)


def _run_id():
    """A random (version 4) UUID's hex, as uuid.uuid4().hex: without importing uuid (and platform)."""
    b = bytearray(os.urandom(16))
    b[6] = b[6] & 0x0F | 0x40
    b[8] = b[8] & 0x3F | 0x80
    return b.hex()


def _prefetch(images):
    for path, fmt in images:
        qcow2.prefetch(path, fmt)


def _fsync_path(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Archiver:
    """Archives VMs of one libvirt connection into one sink, journaling in `state_dir`."""

    def __init__(self, conn, sink, state_dir, quiesce="auto", progress=None):
        self.conn, self.sink, self.state_dir = conn, sink, state_dir
        self.quiesce = quiesce_mode(quiesce)     # auto | always | never (true/false accepted)
        if self.quiesce is None:
            raise ValueError(f"quiesce must be auto, always or never, not {quiesce!r}")
        self.progress = progress        # progress(what, total) -> callable(n) with .finish()
        self._on_base = set()           # new overlays this process saw backed by their base after a merge
        self._taken = set()             # new overlays this process's own snapshot made (backed by the old)
        self._beside = self._side = None   # archive()'s beside_merge, and its thread while it runs
        self._early = set()             # overlays(k) whose merge this process started during their archive
        # libvirt's answers a run reuses where nothing of its own happened in between (one round trip
        # each instead of several): the live look before the snapshot, the NVRAM path read with the
        # archived XML, and the overlays(k) whose merge found the persistent config not naming them
        self._seen = self._nv = None
        self._unnamed = set()

    # -- one VM -----------------------------------------------------------

    def archive(self, name, beside_merge=None):
        """Repair what an earlier run left, then archive the VM. Never raises for one VM's failure.

        `beside_merge()`, if given, runs in a thread while QEMU merges this
        run's day layer into the base: the snapshot is in the catalog by then
        and this call uses the sink no more (the caller may close it). It is
        waited for before this call returns, must not raise, and is called at most
        once: not at all if nothing is merged, never for the merge of an
        interrupted run repaired first (this VM's own run follows that).
        """
        self._beside = beside_merge
        try:
            return self._archive_vm(name)
        finally:
            self._beside = None
            if self._side is not None:      # it may outlast the merge and the cleanup: it is theirs to overlap
                self._side.join()
                self._side = None

    def _archive_vm(self, name):
        t0 = time.monotonic()
        res = Result(name)
        self._seen = self._nv = None
        self._unnamed.clear()
        try:
            dom = Domain(self.conn, name)
            with journal.Lock(self.state_dir, dom.uuid, name):
                rec = journal.load(self.state_dir, dom.uuid) or {
                    "version": journal.VERSION, "uuid": dom.uuid, "name": name,
                    "seq": 0, "disks": {}, "run": None, "last": None}
                rec["name"] = name
                try:
                    seen = self._thaw_if_frozen(dom, res)
                    if rec.get("run"):
                        beside, self._beside = self._beside, None
                        self._resume(dom, rec, res)
                        self._beside = beside
                        seen = None             # the repair changed the chain: look again
                    self._run(dom, rec, res, seen)
                except Exception as e:     # noqa: BLE001 -- one VM's failure never stops the others
                    self._failed(res, e)
                finally:
                    res.seconds = time.monotonic() - t0
                    rec["last"] = {"finished": _now().isoformat(), "status": res.status,
                                   "error": res.error, "changed_bytes": res.changed,
                                   "consistency": res.consistency, "repaired": res.repaired,
                                   "snapshots": res.snapshots, "seconds": round(res.seconds, 3)}
                    journal.save(self.state_dir, rec)
        except Exception as e:             # noqa: BLE001
            self._failed(res, e)
        res.seconds = time.monotonic() - t0
        return res

    def _failed(self, res, e):
        if isinstance(e, (BadInput, VMBusy)):        # UnsupportedDisk, a bad name: the VM is skipped
            res.status = "skipped"
        else:
            res.status = "failed"
        if isinstance(e, StoreFailed):
            res.store_failed = True
        if isinstance(e, Error):
            res.error = str(e)
        else:
            log.exception("%s: unexpected error", res.name)
            res.error = f"{type(e).__name__}: {e}"
        log.error("%s: %s", res.name, res.error)

    # -- repair -------------------------------------------------------------

    def _thaw_if_frozen(self, dom, res):
        """Thaw a guest left frozen (a run killed while it was frozen, a stuck freeze hook), before anything else.

        -> the domain's `look()` if nothing was thawed (the run starts from it), else None.
        """
        seen = dom.look()
        if not seen[0] or not dom.frozen(seen[1]):
            return seen
        try:
            n = dom.thaw()
        except AgentFailed as e:
            raise GuestFrozen(dom.name, e, dom.name) from None
        msg = f"the guest's file systems were found frozen; thawed {n} of them"
        log.warning("%s: %s", dom.name, msg)
        res.repaired.append(msg)
        return None

    def _resume(self, dom, rec, res):
        run = rec["run"]
        log.warning("%s: the run of %s was interrupted at step '%s'; repairing",
                    dom.name, run["started"], run["step"])
        if run["step"] == "snapshot":
            if not self._snapshot_taken(dom, run):
                self._drop_new_overlays(dom, run)
                rec["run"] = None
                journal.save(self.state_dir, rec)
                res.repaired.append(f"run of {run['started']}: stopped before its snapshot; rolled back")
                return
            run.update(step="archive", time=run["started"], quiesced=False,
                       not_quiesced="the run was interrupted during its snapshot")
            journal.save(self.state_dir, rec)
        step = run["step"]
        self._advance(dom, rec, run, res)
        res.repaired.append(f"run of {run['started']}: interrupted at '{step}'; finished "
                            f"(snapshot {run['time']} archived, chain merged)")

    def _undo_snapshot(self, dom, rec, run):
        try:
            if self._snapshot_taken(dom, run):
                return
            self._drop_new_overlays(dom, run)
        except Exception as e:          # noqa: BLE001 -- the next run repairs it
            log.warning("%s: could not undo the failed snapshot now (%s); the next run will", dom.name, e)
            return
        rec["run"] = None
        journal.save(self.state_dir, rec)

    def _snapshot_taken(self, dom, run):
        tops = dom.tops()
        want = {t: d["new"] for t, d in run["disks"].items() if d["new"]}
        using = [t for t, p in want.items() if tops.get(t) == p]
        if len(using) == len(want):
            return True
        if not using:
            return False
        raise ChainInconsistent(dom.name, f"only disks {using} of {sorted(want)} use the snapshot's "
                                          f"new overlays, though libvirt takes it atomically")

    def _drop_new_overlays(self, dom, run):
        """Delete the overlays of a snapshot that was not taken: only if unused and empty."""
        for t, d in run["disks"].items():
            p = d["new"]
            if p:
                qemuimg.drop_part(p)            # its making was cut short: QEMU never used it
            if not p or not os.path.exists(p):
                continue
            if qemuimg.layer_map(p):
                raise ChainInconsistent(dom.name, f"{p} holds data but the domain does not use it; "
                                                  f"it was left in place")
            os.unlink(p)

    # -- a run --------------------------------------------------------------

    def _run(self, dom, rec, res, seen=None):
        self.sink.check_name(dom.name)
        seen = seen or dom.look()
        live = seen[0]
        disks, skipped = dom.disks(seen)
        if not disks:
            raise UnsupportedDisk(dom.name, "-", "it has no writable disk")
        self._adopt(dom, rec, disks, res)
        seq = rec["seq"] + 1
        while any(os.path.exists(f"{rec['disks'][d.target]['base']}.fdn-{seq}.qcow2") for d in disks):
            seq += 1
        rdisks = {}
        for d in disks:
            r = rec["disks"][d.target]
            rdisks[d.target] = {"base": r["base"], "base_format": r["base_format"],
                                "old": r["top"] if r["top"] != r["base"] else None,
                                "new": f"{r['base']}.fdn-{seq}.qcow2", "base_id": r.get("base_id"),
                                "qemu_direct": d.direct}
        defined = dom.defined()
        run = {"id": _run_id(), "step": "snapshot", "started": _now().isoformat(),
               "time": None, "live": live, "quiesce": self.quiesce, "quiesced": None, "skipped_disks": skipped,
               "disks": rdisks,
               "domain_xml": dom.archived_xml({t: (d["base"], d["base_format"]) for t, d in rdisks.items()},
                                              defined)}
        # the NVRAM of the XML archived; the agent's channel as the run found it (its ping is asked anew)
        self._nv, self._seen = (run["id"], dom.nvram(defined)), (run["id"], seen)
        if not live and self._unchanged(dom.name, rdisks):
            for d in rdisks.values():
                d["new"] = None
            run.update(step="archive", time=run["started"], quiesced=False)
        # The new overlays are made (qemu-img, 15-40 ms) while the run is journaled and its snapshot
        # prepared; the snapshot call only opens them. A kill before the journal names them leaves a
        # .part, which the next run, making the same names, removes.
        making = []
        try:
            for d in rdisks.values():
                if d["new"]:
                    making.append(qemuimg.NewLayer(d["new"], d["old"] or d["base"],
                                                   "qcow2" if d["old"] else d["base_format"]))
        except BaseException:
            for m in making:
                m.close()
            raise
        try:
            rec["seq"] = seq
            rec["run"] = run
            journal.save(self.state_dir, rec)
            _crash(run["step"])
            self._advance(dom, rec, run, res, making)
        except Exception:
            if run["step"] == "snapshot":     # libvirt refused the snapshot: undo now if nothing happened
                for m in making:
                    m.close()
                self._undo_snapshot(dom, rec, run)
            raise
        finally:
            for m in making:
                m.close()                     # abandoned ones (done() already cleaned up the rest)
        res.status = "unchanged" if all(d["new"] is None for d in rdisks.values()) else "ok"

    def _adopt(self, dom, rec, disks, res):
        """Check each disk's chain against the journal; learn disks that are new to it.

        A chain that is not the journaled `base <- overlay(k)` was changed
        outside Foundation: its current top becomes the new base (or, if the
        top is one of our overlays over its base, that base), and the next
        snapshot of it is archived whole.
        """
        known = rec.get("disks", {})
        out = {}
        for d in disks:
            r = known.get(d.target)
            # the running QEMU's chain as libvirt has it spares a `qemu-img info` a night
            if r and r["top"] == d.path and (d.path == r["base"] or (
                    d.backing if d.backing is not None else qemuimg.backing_of(d.path)) == r["base"]):
                out[d.target] = r
                continue
            base, fmt = d.path, d.format
            m = OVERLAY_RE.match(d.path)
            if m and d.format == "qcow2":
                i = qemuimg.info(d.path, "qcow2")
                if (i.get("full-backing-filename") or i.get("backing-filename")) == m.group(1):
                    base, fmt = m.group(1), i.get("backing-filename-format", "raw")
            if r:
                msg = (f"{d.target}: chain changed outside Foundation (journal: {r['top']}, "
                       f"libvirt: {d.path}); archiving it whole")
                log.warning("%s: %s", dom.name, msg)
                res.repaired.append(msg)
            out[d.target] = {"base": base, "base_format": fmt, "top": d.path, "base_id": None}
        rec["disks"] = out

    def _prev(self, name, target, d):
        """(root, size) of the snapshot the disk's base holds, if the sink has it."""
        if not d.get("base_id"):
            return None
        snap = self._sink("look up the previous snapshot", name, self.sink.find, name, d["base_id"])
        return snap.get(target) if snap else None

    def _unchanged(self, name, rdisks):
        """True if a shut-off VM has no write since its last archived snapshot."""
        for t, d in rdisks.items():
            if not d["old"] or not self._prev(name, t, d) or qemuimg.layer_map(d["old"]):
                return False
        return True

    def _advance(self, dom, rec, run, res, making=()):
        """Carry the run from its journaled step to the end (`making`: the new overlays being made,
        when it starts at the snapshot)."""
        if run["step"] == "snapshot":
            self._snapshot(dom, run, res, making)
            _crash("snapshot-done")
            run["step"] = "archive"
            journal.save(self.state_dir, rec)
            _crash("archive")
        if run["step"] == "archive":
            self._archive(dom, run, res)
            _crash("archive-done")
            # Not journaled: a repair from 'archive' finds the run in the catalog (its record is
            # durable by now) and goes on to the commit, which is the same repair. One fsync'd
            # save less a night.
            run["step"] = "commit"
            _crash("commit")
        if run["step"] == "commit":
            self._commit(dom, run, res)
            _crash("commit-done")
            # Not journaled: a repair from 'commit' finds the chain merged (the new overlay's header
            # names the base) and goes on to the cleanup, which is the same repair. One fsync'd
            # save less a night.
            run["step"] = "cleanup"
            _crash("cleanup")
        if run["step"] == "cleanup":
            self._cleanup(dom, run)
            _crash("cleanup-done")
        for t, d in run["disks"].items():
            rec["disks"][t] = {"base": d["base"], "base_format": d["base_format"],
                               "top": d["new"] or d["old"] or d["base"], "base_id": run["id"]}
        rec["run"] = None
        # Saved by archive() on its way out, whatever follows (a kill before that repeats the
        # cleanup, which finds nothing left to do).
        res.disks = len(run["disks"])
        res.consistency = ("quiesced" if run["quiesced"] else
                           "crash-consistent" if run["live"] else "shut off")
        res.not_quiesced = run.get("not_quiesced")
        res.snapshots.append(run["id"])

    # -- the steps ------------------------------------------------------------

    def _snapshot(self, dom, run, res, making):
        news = {t: d["new"] for t, d in run["disks"].items()}
        others = [s["target"] for s in run["skipped_disks"]]
        run["live"] = dom.active()          # asked again: the snapshot acts on what the domain is now
        seen, self._seen = self._seen, None
        root = seen[1][1] if seen and seen[0] == run["id"] and seen[1][0] and run["live"] else None
        why = self._not_quiesced(dom, run["live"], root)
        frozen = None
        # the maps the archive reads next (qcow2 headers and tables), asked for while libvirt works
        want = [(d["old"], "qcow2") if d["old"] else (d["base"], d["base_format"]) for d in run["disks"].values()]
        threading.Thread(target=_prefetch, args=(want,), name="prefetch", daemon=True).start()
        for m in making:                    # before the freeze: the snapshot call only opens them
            m.done()
        for d in {os.path.dirname(m.path) for m in making}:
            fsync_dir(d)                    # the domain will name them: their names outlive a host crash
        _crash("snapshot-overlays")
        if run["live"] and why is None:
            when = _now()
            try:
                pause, frozen = dom.snapshot(news, others, freeze=True,
                                             while_frozen=lambda: _crash(FROZEN_POINT))
            except FreezeFailed as e:
                why = f"the guest agent could not freeze the file systems ({e})"
                if self.quiesce == "always":
                    raise QuiesceFailed(dom.name, why) from None
                log.warning("%s: %s; the snapshot is crash-consistent (quiesce = auto)", dom.name, why)
        if frozen is None:
            when = _now()
            pause, _ = dom.snapshot(news, others)
        tops = dom.tops()
        if any(tops.get(t) != p for t, p in news.items()):
            raise ChainInconsistent(dom.name, f"after the snapshot the disks are {tops}, expected {news}")
        self._taken.update(p for p in news.values() if p)
        run.update(time=when.isoformat(), quiesced=frozen is not None, not_quiesced=why,
                   pause=round(pause, 4), frozen=None if frozen is None else round(frozen, 4))
        res.snapshot_pause, res.freeze_seconds = pause, frozen
        if frozen is not None:
            log.info("%s: snapshot of %d disk(s) quiesced: pause %.3f s, file systems frozen %.3f s",
                     dom.name, len(news), pause, frozen)
        else:
            log.info("%s: snapshot of %d disk(s) %s: pause %.3f s", dom.name, len(news),
                     "crash-consistent" if run["live"] else "(shut off)", pause)

    def _not_quiesced(self, dom, live, root=None):
        """None if a running VM's snapshot is to be quiesced, else why not; raises QuiesceFailed for `always`."""
        if not live:
            return None                     # a shut-off VM's disks are at rest
        if self.quiesce == "never":
            return "quiesce = never"
        why = dom.agent_problem(root)
        if why and self.quiesce == "always":
            raise QuiesceFailed(dom.name, why)
        if why:
            log.warning("%s: %s; the snapshot is crash-consistent (quiesce = auto)", dom.name, why)
        return why

    def _archive(self, dom, run, res):
        name = dom.name
        if self._sink("look up the snapshot", name, self.sink.find, name, run["id"]) is not None:
            log.info("%s: snapshot %s is already in the catalog", name, run["id"])
            return
        disks, changed, swaps, incr = {}, {}, {}, {}
        for t, d in run["disks"].items():
            prev = self._prev(name, t, d)
            if d["new"] is None:            # shut off and unchanged: the previous roots again
                disks[t], changed[t], incr[t] = prev, 0, True
                continue
            if d["old"] and d["new"] not in self._taken:
                self._wait_merge(dom, t)     # a repair: an early merge may still read overlay(k)
            frozen, fmt = (d["old"], "qcow2") if d["old"] else (d["base"], d["base_format"])
            # QEMU's merge reads overlay(k) through the page cache unless the disk bypasses it
            shared = d["old"] is not None and not d.get("qemu_direct")
            with SnapshotSource(frozen, fmt, d["base"], d["base_format"], shared=shared) as src:
                size = src.size
                if prev is not None and prev[1] != size:
                    prev = None                  # the disk was resized: archive it whole
                incremental = prev is not None and d["old"] is not None
                runs = src.changed if incremental else None
                zeros, notes = swap.find_swap(src.read, size)
                early = None
                if runs is not None and d["new"] in self._taken and run["live"] and src.direct:
                    # libvirt's call (a round trip to QEMU) runs beside the start of the write
                    early = threading.Thread(target=self._merge_early, args=(dom, t, d), name="merge-early")
                    early.start()
                total = sum(n for _, n in runs) if runs is not None else size
                prog = self.progress(f"{name} {t}", total) if self.progress else None
                try:
                    root = self._sink("write the disk", name, self.sink.write_disk, src, size,
                                      prev[0] if prev and runs is not None else None, runs, zeros,
                                      prog, run["id"], t)
                finally:
                    if early is not None:
                        early.join()
                if prog:
                    prog.finish()
            disks[t] = (root, size)
            changed[t], swaps[t], incr[t] = total, notes, runs is not None
            res.changed += total
            log.info("%s: %s archived, %s, %.1f MB read", name, t,
                     "changes only" if runs is not None else "whole disk", total / 1e6)
            _crash("archive-disk")
        meta = {"quiesced": bool(run["quiesced"]),
                "quiesce": run.get("quiesce", self.quiesce), "not_quiesced": run.get("not_quiesced"),
                "pause_seconds": run.get("pause"), "freeze_seconds": run.get("frozen"),
                "vm_state": "running" if run["live"] else "shut off",
                "domain_xml": self._sink("write the domain XML", name, self.sink.write_blob,
                                         run["domain_xml"].encode()),
                "nvram": self._nvram(dom, run["id"]),
                "swap_zeroed": {t: n for t, n in swaps.items() if n},
                "not_archived": run["skipped_disks"],
                "changed_bytes": changed, "incremental": incr,
                "run": {"id": run["id"], "started": run["started"], "resumed": bool(res.repaired)}}
        self._sink("record the snapshot in the catalog", name, self.sink.add, run["id"], name,
                   dom.uuid, datetime.datetime.fromisoformat(run["time"]), disks, meta)

    def _nvram(self, dom, run_id):
        nv, self._nv = self._nv, None
        path = nv[1] if nv and nv[0] == run_id else dom.nvram()
        if not path:
            return None
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as e:
            log.warning("%s: cannot read the NVRAM %s: %s", dom.name, path, e.strerror)
            return None
        return {"path": path, "blob": self._sink("write the NVRAM", dom.name, self.sink.write_blob, data)}

    def _sink(self, what, name, fn, *args, **kw):
        """Call the sink; a failing store (full, unplugged, damaged) becomes StoreFailed."""
        try:
            return fn(*args, **kw)
        except (StoreFull, StoreMissing, StoreDiskFailed, DataCorrupt, DerivedCorrupt) as e:
            raise StoreFailed(name, f"{what}: {str(e).rstrip('.')}") from e
        except OSError as e:
            raise StoreFailed(name, f"{what}: {e.strerror or e}") from e

    def _commit(self, dom, run, res):
        t0 = time.monotonic()
        for t, d in run["disks"].items():
            if d["old"] and d["new"]:
                self._merge(dom, t, d, res)
        res.commit_seconds = time.monotonic() - t0

    def _start_beside(self):
        """Start `beside_merge` once, as QEMU starts copying: the caller's own work (the CLI's
        store close and file listings) then overlaps the copy instead of following it."""
        if self._beside is None:
            return
        fn, self._beside = self._beside, None

        def go():
            try:
                fn()
            except BaseException:    # noqa: BLE001 -- documented not to raise; never lose the merge for it
                log.exception("work beside the merge failed")

        self._side = threading.Thread(target=go, name="beside-merge", daemon=True)
        self._side.start()

    def _merge_early(self, dom, target, d):
        """Start merging overlay(k) into the base as soon as the day's blocks are mapped (and the
        swap check has read what it reads): QEMU copies while this process stores the blocks. What
        is still to be read comes from overlay(k) itself (the merge only reads it) or from ranges of
        the base the merge does not write, so the bytes archived are the same; a failure to start
        here only leaves the merge to `commit`. The base then holds the day before its snapshot is
        in the catalog: overlay(k) stays, and a repair archives it again (after the job)."""
        try:
            dom.start_commit(target, d["old"], d["base"])
        except Exception as e:      # noqa: BLE001 -- a thread's: `commit` merges as it always did
            log.info("%s: %s: the merge starts after the archive (%s)", dom.name, target, e)
            return
        self._early.add(d["old"])
        _crash("commit-early")

    def _wait_merge(self, dom, target):
        """Wait for a merge QEMU still runs on the disk (started early by an interrupted run)."""
        if dom.active():
            job = dom.block_job(target)
            if job and job.get("type") == dom.libvirt.VIR_DOMAIN_BLOCK_JOB_TYPE_COMMIT:
                dom.wait_job(target)

    def _merge(self, dom, target, d, res):
        """Merge overlay(k) into the base and make overlay(k+1) sit on the base."""
        lv = dom.libvirt
        for i in range(MERGE_ATTEMPTS):
            # A snapshot this process took put the new overlay over the old one: not merged yet
            # (or its merge was started during the archive: the job, running or done, says).
            if not (i == 0 and d["new"] in self._taken) and self._merged(dom, target, d):
                break
            if dom.active():
                job = dom.block_job(target)
                if job and job.get("type") != lv.VIR_DOMAIN_BLOCK_JOB_TYPE_COMMIT:
                    raise LibvirtFailed(f"merge {d['old']}", dom.name,
                                        f"another block job (type {job.get('type')}) runs on {target}")
                early = i == 0 and d["old"] in self._early    # its job was started during the archive
                if not job and not (early and self._merged(dom, target, d)):
                    dom.start_commit(target, d["old"], d["base"])
                if not job or early:
                    _crash("commit-started")
                self._start_beside()
                _, tail = dom.wait_job(target)
                res.commit_tail = max(res.commit_tail or 0.0, tail)
            else:
                self._start_beside()
                qemuimg.commit(d["old"])
                qemuimg.rebase_unsafe(d["new"], d["base"], d["base_format"])
        else:
            if qemuimg.backing_of(d["new"]) != d["base"]:
                raise MergeFailed(dom.name, d["old"], d["base"],
                                  f"{MERGE_ATTEMPTS} attempts; see /var/log/libvirt/qemu/{dom.name}.log")
        self._on_base.add(d["new"])
        if dom.inactive_mentions(d["old"]):
            dom.redefine({target: (d["new"], "qcow2")})
        else:
            self._unnamed.add(d["old"])     # asked just now: the cleanup that follows asks no more
        _fsync_path(d["base"])

    def _merged(self, dom, target, d):
        """True if the new overlay sits on the base. libvirt moves its live chain only once QEMU's
        commit has rewritten the new overlay's header, so its word "merged" spares a `qemu-img
        info`; anything else is asked of the header itself."""
        seen = dom.look()
        live = dict((x.target, x) for x in dom.disks(seen)[0]).get(target) if seen[0] else None
        if live is not None and live.path == d["new"] and live.backing == d["base"]:
            return True
        return qemuimg.backing_of(d["new"]) == d["base"]

    def _cleanup(self, dom, run):
        tops = dom.tops()
        for t, d in run["disks"].items():
            old = d["old"]
            if not (old and d["new"]) or not os.path.exists(old):
                continue
            # (the merge just read the new overlay's backing file: one qemu-img less)
            on_old = d["new"] not in self._on_base and qemuimg.backing_of(d["new"]) == old
            named = old not in self._unnamed and dom.inactive_mentions(old)
            self._unnamed.discard(old)
            if old in tops.values() or on_old or named:
                raise ChainInconsistent(dom.name, f"{old} is still in use after its merge; not deleted")
            os.unlink(old)
