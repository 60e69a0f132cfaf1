"""The per-VM journal: one small JSON file, replaced atomically, written before every step.

A run records what it is about to do (the step, the files it will create,
the chain it expects) *before* doing it, so a run killed at any instant
leaves a file that names the step in progress. The next run reads it and
finishes or undoes that step (the table is in `archiver.py`). The file is
written to a temporary name, fsynced, renamed over the old one and the
directory fsynced: after a crash it holds either the old or the new record,
never a torn one.

Layout of the state directory (default /var/lib/foundation):

    vm/<uuid>.json   the journal: chain of each disk, the run in progress, the last run
    vm/<uuid>.lock   flock()ed by the process working on that VM

Record (version 1):

    {"version": 1, "uuid": ..., "name": ...,
     "seq": k,                          # number of the newest overlay ever made
     "disks": {"vda": {"base": path, "base_format": "raw"|"qcow2",
                       "top": path,     # overlay(k), or the base before the first run
                       "base_id": run id | null}},   # the run whose snapshot the base holds
     "run": null | {"id", "step", "started", "time", "live", "quiesce", "quiesced", "skipped_disks",
                    "not_quiesced", "pause", "frozen",   # the snapshot's policy, why not quiesced, seconds
                    "domain_xml", "disks": {"vda": {"base", "base_format", "old", "new", "base_id",
                                                    "qemu_direct"}}},   # QEMU bypasses the page cache
                                                                        # (absent in older runs: false)
     "last": null | {"finished", "status", "error", "changed_bytes", "consistency",
                     "repaired": [...], "snapshots": [...], "seconds"}}
"""

import fcntl
import json
import os

from foundation.errors import Error
from foundation.store.disk import atomic_write, flock

VERSION = 1


class VMBusy(Error):
    """VM {} is being archived by another Foundation process; skipped."""

    code = 65


class JournalCorrupt(Error):
    """The journal {} cannot be read ({}). Look at it, then move it away to let Foundation re-learn the VM's chain from libvirt."""

    code = 66


def vm_dir(state_dir):
    return os.path.join(state_dir, "vm")


def journal_path(state_dir, uuid):
    return os.path.join(vm_dir(state_dir), f"{uuid}.json")


def load(state_dir, uuid):
    """The VM's record, or None if Foundation never worked on it."""
    path = journal_path(state_dir, uuid)
    try:
        with open(path, encoding="utf-8") as f:
            rec = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise JournalCorrupt(path, e) from None
    if not isinstance(rec, dict) or rec.get("version") != VERSION:
        raise JournalCorrupt(path, f"unknown version {rec.get('version') if isinstance(rec, dict) else '?'}")
    return rec


def save(state_dir, rec):
    """Replace the VM's record atomically and durably."""
    d = vm_dir(state_dir)
    os.makedirs(d, exist_ok=True)
    path = journal_path(state_dir, rec["uuid"])
    atomic_write(path, json.dumps(rec, indent=1, sort_keys=True).encode(), mode=0o600,
                 tmp=f"{path}.tmp{os.getpid()}", full=None)


def records(state_dir):
    """Every VM record in the state directory (for `foundation status`)."""
    out = []
    try:
        names = sorted(os.listdir(vm_dir(state_dir)))
    except FileNotFoundError:
        return out
    for n in names:
        if n.endswith(".json"):
            try:
                rec = load(state_dir, n[:-5])
            except JournalCorrupt:
                continue
            if rec:
                out.append(rec)
    return out


class Lock:
    """An exclusive flock on vm/<uuid>.lock; raises VMBusy if another process holds it.

    The kernel drops the lock when its holder dies, so a killed run never
    leaves a stale lock behind.
    """

    def __init__(self, state_dir, uuid, name):
        os.makedirs(vm_dir(state_dir), exist_ok=True)
        self.path = os.path.join(vm_dir(state_dir), f"{uuid}.lock")
        self.name = name
        self.fd = None

    def __enter__(self):
        self.fd = flock(self.path, fcntl.LOCK_EX, lambda _: VMBusy(self.name), write_pid=True, mode=0o600)
        return self

    def __exit__(self, *exc):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
