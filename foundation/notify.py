"""Desktop notifications of failed nights and stale VMs, for the logged-in people who manage the VMs.

The archive runs as root under systemd, with no session bus of its own,
and a user's session bus (`/run/user/UID/bus`, made by logind at login)
accepts only its owner: D-Bus authenticates the peer's uid. So for each
logged-in member of the snapshot group (foundation.access) a child process
takes on that user's uid, gid and groups, connects to the bus and calls
org.freedesktop.Notifications.Notify (jeepney: pure Python, no GLib, no
notify-send). Nothing is installed per user and it works the first night;
a session with no notification server (an ssh login, a lingering user)
has no such name on its bus and is skipped without a word.

What to say comes from two records in the state directory (on the host):

`<state_dir>/archive-run.json`, written by every `foundation archive` (and
by a failing `archive --check`) into an existing state directory:
    {"version": 1, "finished": ISO time, "error": string | null,   # the run as a whole failed
     "vms": [{"name": ..., "status": "ok"|"unchanged"|"failed"|"skipped"|"not run", "error": ...}]}

`<state_dir>/notified.json`, what was already said, so nothing is said twice:
    {"run": the "finished" of the last run reported, "stale": {vm: ISO time of the last stale notice}}

Each failed VM of a run, a run that failed as a whole, and each stale VM
(last good archive older than `stale_days`) is one notification; a VM's
staleness is repeated at most once a day, and a VM reported failed is not
also reported stale that day.
"""

import json
import logging
import os
import pwd
import stat
from datetime import datetime, timedelta, timezone

from foundation import access
from foundation.errors import Error
from foundation.fields import Fields
from foundation.store.disk import read_record
from foundation.vm.health import GOOD, health, human_age, parse_time

log = logging.getLogger(__name__)

RUN_FILE = "archive-run.json"
SENT_FILE = "notified.json"
RUN_DIR = "/run/user"
APP = "Foundation"
ICON = "drive-harddisk"
STALE_REPEAT = timedelta(hours=20)   # a stale VM is retold each night, not on every call
TIMEOUT = 10.0
HELP = "`foundation status` shows every VM; the night's log: `journalctl -u foundation-archive`."


class Alert(Fields):
    def __init__(self, summary, body, urgency=2):
        self.summary, self.body = summary, body
        self.urgency = urgency  # freedesktop: 0 low, 1 normal, 2 critical (stays until dismissed)


def record_run(state_dir, results=(), error=None):
    """Write down what an archive run did (best effort: a record lost never fails the run).

    Only into an existing state directory (the service's StateDirectory=): a
    run that stops at a missing store leaves a host that never ran one as it was.
    """
    from foundation.store.disk import atomic_write

    doc = {"version": 1, "finished": _now().isoformat(), "error": str(error) if error else None,
           "vms": [{"name": r.name, "status": r.status, "error": r.error} for r in results]}
    path = os.path.join(state_dir, RUN_FILE)
    if not os.path.isdir(state_dir):
        return
    try:
        atomic_write(path, json.dumps(doc, indent=1).encode() + b"\n", sync=False)
    except (OSError, Error) as e:
        log.debug("archive run not recorded in %s: %s", path, e)


def alerts(conf, state_dir, records, latest=None, now=None, sent=None):
    """The notifications due now -> (alerts, the updated `sent` record).

    records: {name: journal record}; latest: {name: newest catalog snapshot time} (None: store unreachable).
    """
    now = now or _now()
    sent = dict(sent if sent is not None else read_record(os.path.join(state_dir, SENT_FILE)))
    stale_sent = dict(sent.get("stale") or {})
    out, failed = [], set()
    run = read_record(os.path.join(state_dir, RUN_FILE))
    if run.get("finished") and run["finished"] != sent.get("run"):
        day = _day(run["finished"])
        if run.get("error"):
            out.append(Alert(f"Foundation: the archive of {day} did not run",
                             f"No VM was archived on {day}: {run['error']}\n{HELP}"))
        for v in run.get("vms") or []:
            if v.get("status") in GOOD:
                continue
            failed.add(v["name"])
            stale_sent[v["name"]] = now.isoformat(timespec="seconds")    # told tonight: not stale again today
            h = health(v["name"], records.get(v["name"]), (latest or {}).get(v["name"]))
            out.append(Alert(f"Foundation: {v['name']} was not archived on {day}",
                             f"{v['name']}: {v.get('status')} on {day}: {v.get('error') or 'no reason recorded'}\n"
                             f"{_last_good(h, now)} {HELP}"))
        sent["run"] = run["finished"]
    max_age = timedelta(days=conf.stale_days)
    for name in _configured(conf, records):
        h = health(name, records.get(name), (latest or {}).get(name))
        last = stale_sent.get(name)
        if name in failed or not h.stale(max_age, now) or (last and now - parse_time(last) < STALE_REPEAT):
            continue
        what = f"has not been archived for {human_age(h.age(now))}" if h.last_good else "has no good archive"
        why = f"Its last run ({_day(h.last_run)}) {h.status}: {h.error}." if h.failed() and h.error else \
            "Is the backup disk plugged in, and the foundation-archive timer enabled?"
        out.append(Alert(f"Foundation: {name} {what}",
                         f"{_last_good(h, now)} {why}\n{HELP}", urgency=1))
        stale_sent[name] = now.isoformat(timespec="seconds")
    sent["stale"] = stale_sent
    return out, sent


def save_sent(state_dir, sent):
    from foundation.store.disk import atomic_write

    try:
        atomic_write(os.path.join(state_dir, SENT_FILE), json.dumps(sent, indent=1).encode() + b"\n", sync=False)
    except (OSError, Error) as e:
        log.warning("cannot record the notifications sent in %s: %s", state_dir, e)


def sessions(gid, run_dir=RUN_DIR):
    """[(pwd entry, bus address)] of the logged-in members of group `gid` with a session bus."""
    out = []
    try:
        names = sorted(os.listdir(run_dir))
    except OSError:
        return out
    for n in names:
        if not n.isdigit():
            continue
        uid = int(n)
        bus = os.path.join(run_dir, n, "bus")
        try:
            st = os.lstat(bus)
            pw = pwd.getpwuid(uid)
        except (OSError, KeyError):
            continue
        if stat.S_ISSOCK(st.st_mode) and st.st_uid == uid and access.is_member(uid, gid):
            out.append((pw, f"unix:path={bus}"))
    return out


def send(alert, gid, run_dir=RUN_DIR):
    """Show `alert` on every logged-in member's desktop -> the names of the users who got it."""
    import jeepney.io.blocking  # noqa: F401 -- imported as root: the user may not read our site-packages
    told = []
    for pw, bus in sessions(gid, run_dir):
        if _as_user(pw, lambda: _notify(bus, alert)):
            told.append(pw.pw_name)
    return told


def _notify(bus, alert):
    from jeepney import DBusAddress, MessageType, new_method_call
    from jeepney.io.blocking import open_dbus_connection

    addr = DBusAddress("/org/freedesktop/Notifications", bus_name="org.freedesktop.Notifications",
                       interface="org.freedesktop.Notifications")
    msg = new_method_call(addr, "Notify", "susssasa{sv}i",
                          (APP, 0, ICON, alert.summary, alert.body, [], {"urgency": ("y", alert.urgency)}, -1))
    with open_dbus_connection(bus=bus, auth_timeout=TIMEOUT) as conn:
        reply = conn.send_and_get_reply(msg, timeout=TIMEOUT)
    return reply.header.message_type == MessageType.method_return


def _as_user(pw, fn):
    """Run fn() in a child process with the user's ids (the bus checks them) -> its truth."""
    pid = os.fork()
    if pid == 0:
        ok = False
        try:
            if os.geteuid() != pw.pw_uid:        # root (the service); a user running it tells only themselves
                os.setgroups(os.getgrouplist(pw.pw_name, pw.pw_gid))
                os.setgid(pw.pw_gid)
                os.setuid(pw.pw_uid)
            ok = bool(fn())
        except BaseException as e:      # noqa: BLE001 -- a desktop that does not answer is no error
            log.debug("no notification for %s: %s", pw.pw_name, e)
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


def _configured(conf, records):
    names = conf.vms if conf.vms != "all" else sorted(records)
    return [n for n in names if n not in conf.exclude]


def _last_good(h, now):
    if h.last_good is None:
        return "No good archive of it is known."
    return f"Last good archive: {h.last_good.astimezone():%Y-%m-%d %H:%M} ({human_age(h.age(now))} ago)."


def _day(t):
    return parse_time(t).astimezone().strftime("%Y-%m-%d") if t else "?"


def _now():
    return datetime.now(timezone.utc)
