"""`foundation status [VM...]`: the last run of each VM, its chain, the replicas, the next timer run.

Read-only, and useful when things are wrong: it reads the archiver's
journal (no store needed), checks each disk's chain against libvirt and
the image headers, adds the store's snapshot count when the store is
reachable, shows each configured replica's last replicate from this host
(foundation.replica.lastrun; no network), and asks systemd when the timer
fires next. Each VM opens with its health (foundation.vm.health): the last
good archive, its age, STALE past `stale_days`, the last error, the same
reading the desktop notifications use. --json prints the same data
(schema in docs/operation.md §9).
"""

import datetime
import json
import os
import subprocess

from foundation.cli.common import settings
from foundation.errors import Error

NAME = "status"
HELP = "show each VM's last archive run, its disk chains, the replicas' last runs and the next timer run"
TIMER = "foundation-archive.timer"


def add_arguments(p):
    p.add_argument("vms", nargs="*", metavar="VM", help="VMs to show (default: every VM ever archived "
                                                        "and the config file's `vms`)")
    p.add_argument("--libvirt-uri", help="libvirt connection (default: config `libvirt_uri`)")
    p.add_argument("--state-dir",
                   help="journal directory (default: config `state_dir`; env FOUNDATION_STATE_DIR)")
    p.add_argument("--json", action="store_true", help="print JSON (schema in docs/operation.md)")


def run(args):
    from foundation.vm import journal

    s = settings(args)
    conf, state_dir = s.config, s.state_dir
    recs = {r["name"]: r for r in journal.records(state_dir)}
    names = list(args.vms) or sorted(set(recs) | set(conf.vms if conf.vms != "all" else []))
    conn, why = _connect(s.libvirt_uri)
    counts, store_note = _store_counts(args)
    max_age = datetime.timedelta(days=conf.stale_days)
    if args.json:
        vms = [_vm_json(name, recs.get(name), conn, state_dir, counts, max_age) for name in names]
        print(json.dumps({"version": 1, "vms": vms, "stale_days": conf.stale_days, "libvirt": why,
                          "store": store_note, "replicas": _replicas(args, conf, state_dir),
                          "next_run": next_timer_run()}, indent=2, sort_keys=True))
        return 0
    lines = []
    for name in names:
        lines += _vm(name, recs.get(name), conn, state_dir, counts, max_age)
    if not names:
        lines.append(f"no VM has been archived yet (journal: {state_dir})")
    if why:
        lines.append(f"libvirt: {why}")
    if store_note:
        lines.append(f"store: {store_note}")
    lines += _replicas(args, conf, state_dir)
    lines.append(f"next run: {next_timer_run()}")
    print("\n".join(lines))
    return 0


def _connect(uri):
    from foundation.vm import connect

    try:
        return connect(uri), None
    except Error as e:
        return None, f"{e} (chains not checked)"


def _store_counts(args):
    from foundation.cli.common import open_store, store_path

    try:
        path = store_path(args)
    except Error:
        return None, None
    try:
        from foundation.catalog import Catalog

        with open_store(args, writable=False) as s:
            counts = {}
            for snap in Catalog.load(s).snapshots():
                n, _ = counts.get(snap.name, (0, None))
                counts[snap.name] = (n + 1, snap.time)
            return counts, None
    except Error as e:
        return None, f"{path}: {e}"


def _replicas(args, conf, state_dir):
    """A line per configured replica: its last replicate from this host, and the last success."""
    from foundation.cli.common import store_path
    from foundation.replica import lastrun, replicas_from_config
    from foundation.store.primary import read_config

    try:
        specs = replicas_from_config(conf)
        if not specs:
            return []
        path = store_path(args)
    except Error as e:
        return [f"replicas: {e}"]
    try:
        uuid = read_config(path, recovering=True)[0]["uuid"]
    except Error as e:
        return [f"replicas: {len(specs)} configured; their last runs are unknown while the store cannot be read ({e})"]
    runs = lastrun.load(state_dir, uuid)
    out = []
    for spec in specs:
        r = runs.get(lastrun.key(spec))
        label = f"replica {spec.name} ({spec.url})"
        if not r:
            out.append(f"{label}: never replicated from this host (run `foundation replicate`)")
        elif r.get("ok"):
            arena, offset = r.get("head", ["?", "?"])
            out.append(f"{label}: replicated {_when(r['attempt'])}, up to arena {arena} offset {offset}")
        else:
            since = f"last success {_when(r['success'])}" if r.get("success") else "never succeeded"
            out.append(f"{label}: FAILED {_when(r['attempt'])} ({since}): {r.get('error')}")
    return out


def _record(name, rec, conn, state_dir):
    """(the VM's journal record or None, an error reading it or None)."""
    from foundation.vm import journal

    if rec is None and conn is not None:
        try:
            from foundation.vm.domain import Domain

            return journal.load(state_dir, Domain(conn, name).uuid), None
        except Error as e:
            return None, str(e)
    return rec, None


def _latest(name, counts):
    return (counts or {}).get(name, (0, None))[1]


def _vm_json(name, rec, conn, state_dir, counts, max_age):
    from foundation.vm.health import health

    rec, err = _record(name, rec, conn, state_dir)
    h = health(name, rec, _latest(name, counts))
    d = h.to_json()
    d["stale"] = h.stale(max_age)
    d["lookup_error"] = err
    d["snapshots"] = counts.get(name, (0, None))[0] if counts is not None else None
    d["last"] = (rec or {}).get("last")
    d["disks"] = {t: {"base": v.get("base"), "top": v.get("top")} for t, v in sorted((rec or {}).get("disks", {}).items())}
    return d


def _glance(h, max_age):
    """The health line: last good archive and its age, STALE past max_age."""
    from foundation.vm.health import human_age

    mark = "  STALE" if h.stale(max_age) else ""
    if h.last_good is None:
        return f"  last good: none yet{mark}"
    return f"  last good: {_when(h.last_good)} ({human_age(h.age())} ago){mark}"


def _vm(name, rec, conn, state_dir, counts, max_age):
    from foundation.vm.health import health

    out = [name]
    rec, err = _record(name, rec, conn, state_dir)
    if err:
        out.append(f"  {err}")
        return out
    if rec is None:
        out.append("  never archived")
        return out
    out.append(_glance(health(name, rec, _latest(name, counts)), max_age))
    last = rec.get("last")
    if last:
        mb = (last.get("changed_bytes") or 0) / 1e6
        out.append(f"  last run:  {_when(last.get('finished'))}  {last.get('status')}, {mb:.1f} MB changed, "
                   f"{last.get('consistency') or '-'}, {last.get('seconds', 0):.1f} s")
        if last.get("error"):
            out.append(f"             {last['error']}")
        for note in last.get("repaired") or []:
            out.append(f"             repaired: {note}")
    run = rec.get("run")
    if run:
        out.append(f"  INTERRUPTED: the run of {_when(run['started'])} stopped at step '{run['step']}'; "
                   f"the next run repairs it (interrupted at '{run['step']}')")
    out += _chains(name, rec, conn)
    if counts is not None:
        n, t = counts.get(name, (0, None))
        out.append(f"  store:     {n} snapshot(s)" + (f", latest {_when(t)}" if t else ""))
    return out


def _when(t):
    """An ISO time (or datetime) as 'YYYY-MM-DD HH:MM:SS UTC'."""
    import datetime

    if not t:
        return "?"
    if isinstance(t, str):
        t = datetime.datetime.fromisoformat(t)
    return t.astimezone(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _chains(name, rec, conn):
    from foundation.image import qemuimg
    from foundation.vm.domain import Domain

    if conn is None:
        return []
    try:
        tops = Domain(conn, name).tops()
    except Error as e:
        return [f"  chain:     {e}"]
    out = []
    for t, d in sorted(rec.get("disks", {}).items()):
        top = tops.get(t)
        try:
            ch = [i["filename"] for i in qemuimg.chain(top)] if top else []
        except Error as e:
            out.append(f"  {t}: {e}")
            continue
        files = " <- ".join(reversed([os.path.basename(f) for f in ch]))
        if top == d["top"] and ch[1:2] == [d["base"]]:
            state = "base <- overlay, as journaled"
        elif top == d["top"] == d["base"]:
            state = "base only (first run pending)"
        elif rec.get("run"):
            state = "mid-run; the next run repairs it"
        else:
            state = "differs from the journal: the next run archives this disk whole"
        out.append(f"  {t}: {files}  ({state})")
    return out


def next_timer_run():
    if not os.path.isdir("/run/systemd/system"):
        return f"unknown: systemd is not running here, so {TIMER} is not active"
    try:
        p = subprocess.run(["systemctl", "show", TIMER, "--property=NextElapseUSecRealtime",
                            "--property=ActiveState", "--value"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unknown: {e}"
    vals = p.stdout.split("\n")
    nxt = vals[0].strip() if vals else ""
    active = vals[1].strip() if len(vals) > 1 else ""
    if p.returncode != 0 or active != "active" or not nxt or nxt == "n/a":
        return f"none: {TIMER} is not active (systemctl enable --now {TIMER})"
    return f"{nxt} ({TIMER})"
