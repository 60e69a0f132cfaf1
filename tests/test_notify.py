"""Desktop notifications, end to end: a session bus per local account, a recording notification server.

Each test account gets /run/user/UID/bus from its own `dbus-daemon --session`
and a stand-in notification server (notify_listener.py, run as the account)
that records every Notify it receives. `foundation notify` runs as root,
as under systemd, and must reach members of the snapshot group only.
"""

import datetime as dt
import json
import os
import shutil
import subprocess
import time

import jeepney
import pytest

from tests.accounts import local_account, local_group, setpriv
from tests.test_cli_desktop import journal_record, run

HERE = os.path.dirname(os.path.abspath(__file__))
SYSTEM_PYTHON = "/usr/bin/python3"    # readable by any account, unlike a python under /root

pytestmark = pytest.mark.skipif(shutil.which("dbus-daemon") is None, reason="needs dbus-daemon (scripts/setup.sh)")


class Desktop:
    """A logged-in account: its session bus and a notification server recording what arrives."""

    def __init__(self, pw):
        self.pw = pw
        self.dir = f"/run/user/{pw.pw_uid}"
        os.makedirs(self.dir, mode=0o700)
        lib = os.path.join(self.dir, "lib")
        shutil.copytree(os.path.dirname(jeepney.__file__), os.path.join(lib, "jeepney"))
        shutil.copy(os.path.join(HERE, "notify_listener.py"), lib)
        self.log = os.path.join(self.dir, "received.jsonl")
        open(self.log, "w").close()
        subprocess.run(["chown", "-R", f"{pw.pw_uid}:{pw.pw_gid}", self.dir], check=True)
        self.bus = f"unix:path={self.dir}/bus"
        user = setpriv(pw)
        env = {"PATH": os.environ["PATH"], "HOME": self.dir, "PYTHONPATH": lib}
        self.procs = [subprocess.Popen([*user, "dbus-daemon", "--session", f"--address={self.bus}", "--nofork",
                                        "--print-address"], stdout=subprocess.PIPE, env=env, text=True)]
        self.procs[0].stdout.readline()            # the address: the bus is listening
        listener = subprocess.Popen([*user, SYSTEM_PYTHON, os.path.join(lib, "notify_listener.py"), self.bus, self.log],
                                    stdout=subprocess.PIPE, env=env, text=True)
        self.procs.append(listener)
        assert listener.stdout.readline().strip() == "ready"

    def received(self):
        time.sleep(0.1)
        with open(self.log) as f:
            return [json.loads(line) for line in f]

    def close(self):
        for p in reversed(self.procs):
            p.kill()
            p.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def desk(tmp_path, host_state):
    """(config path writer, member's Desktop, outsider's Desktop); the config's snapshot_group is the test's."""
    with local_group() as group, local_account([group]) as member, local_account() as outsider:
        desktops = []
        try:
            desktops = [Desktop(member), Desktop(outsider)]
            conf = tmp_path / "foundation.toml"

            def config(extra=""):
                conf.write_text(f'state_dir = "{host_state}"\nvms = ["web", "db"]\n'
                                f'snapshot_group = "{group}"\n{extra}')
                return str(conf)
            yield config, desktops[0], desktops[1]
        finally:
            for d in desktops:
                d.close()


def archive_run(state, vms=(), error=None, finished=None):
    """archive-run.json as `foundation archive` writes it (foundation/notify.py)."""
    finished = finished or dt.datetime.now(dt.timezone.utc)
    os.makedirs(state, exist_ok=True)
    with open(os.path.join(state, "archive-run.json"), "w") as f:
        json.dump({"version": 1, "finished": finished.isoformat(), "error": error,
                   "vms": [{"name": n, "status": s, "error": e} for n, s, e in vms]}, f)


def notify(config, *extra):
    r = run("--config", config, "notify", *extra)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_failed_night_and_stale_vm(desk, host_state):
    config, member, outsider = desk
    now = dt.datetime.now(dt.timezone.utc)
    state = str(host_state)
    journal_record(state, "web", "failed", now - dt.timedelta(minutes=5), error="disk vda: qemu-img map failed")
    journal_record(state, "db", "ok", now - dt.timedelta(days=3, hours=2))
    archive_run(state, [("web", "failed", "disk vda: qemu-img map failed")])
    out = notify(config())
    day = now.astimezone().strftime("%Y-%m-%d")
    got = member.received()
    assert [g["summary"] for g in got] == [f"Foundation: web was not archived on {day}",
                                           "Foundation: db has not been archived for 3 days"]
    assert got[0]["body"].startswith(f"web: failed on {day}: disk vda: qemu-img map failed\n")
    assert "`foundation status`" in got[0]["body"] and got[0]["urgency"] == 2
    assert "Last good archive: " in got[1]["body"] and "(3 days ago)" in got[1]["body"]
    assert "backup disk plugged in" in got[1]["body"] and got[1]["urgency"] == 1
    assert got[0]["app"] == "Foundation"
    assert outsider.received() == []                 # not in the snapshot group: told nothing
    assert f"told {member.pw.pw_name}" in out
    # Said once: the same run and a stale VM already told today are not repeated.
    notify(config())
    assert len(member.received()) == 2


def test_night_that_did_not_run(desk, host_state):
    """The store check failed (the disk is not plugged in): one notification naming the day and the reason."""
    config, member, outsider = desk
    store = "/nonexistent/backup/foundation"
    host_state.mkdir()                               # as the service's StateDirectory= makes it
    r = run("--config", config(f'store = "{store}"\n'), "archive", "--check")
    assert r.returncode == 10
    notify(config(f'store = "{store}"\n'))
    day = dt.datetime.now().strftime("%Y-%m-%d")
    got = member.received()
    assert len(got) == 1
    assert got[0]["summary"] == f"Foundation: the archive of {day} did not run"
    assert got[0]["body"].startswith(f"No VM was archived on {day}: Store {store} does not exist or is not mounted. "
                                     "Plug in and mount the backup disk")


def test_all_well_and_never(desk, host_state):
    config, member, _ = desk
    now = dt.datetime.now(dt.timezone.utc)
    state = str(host_state)
    journal_record(state, "web", "ok", now - dt.timedelta(hours=3))
    journal_record(state, "db", "unchanged", now - dt.timedelta(hours=3))
    archive_run(state, [("web", "ok", None), ("db", "unchanged", None)])
    notify(config())
    assert member.received() == []
    # notify = "never": a failed run and a stale VM, and still nothing.
    journal_record(state, "db", "ok", now - dt.timedelta(days=5))
    archive_run(state, [("web", "failed", "boom")])
    assert "notifications are off" in notify(config('notify = "never"\n'))
    assert member.received() == []
    # A longer stale_days: db (5 days) is not stale at 7; web's failure is told.
    notify(config("stale_days = 7\n"))
    assert [g["summary"].split(" was ")[0] for g in member.received()] == ["Foundation: web"]


def test_no_desktop_is_silent(tmp_path, host_state):
    """No session bus anywhere for the group: nothing sent, nothing fails."""
    with local_group() as group:
        conf = tmp_path / "foundation.toml"
        conf.write_text(f'state_dir = "{host_state}"\nvms = ["web"]\nsnapshot_group = "{group}"\n')
        archive_run(str(host_state), [("web", "failed", "boom")])
        out = notify(str(conf), "--dry-run")
        assert out.startswith("due: Foundation: web was not archived on ") and "web: failed on " in out
        out = notify(str(conf))
        assert f"told nobody (no desktop session of group {group})" in out


@pytest.mark.libvirt
def test_failed_archive_run_is_told_once(desk, host_state, make_store):
    """A real `foundation archive` of a VM libvirt does not know: one notification naming it and the reason."""
    config, member, _ = desk
    store = make_store(encrypt=False)
    conf = config(f'store = "{store.path}"\n')
    host_state.mkdir()
    r = run("--config", conf, "archive", "fdn-no-such-vm")
    assert r.returncode == 1
    notify(conf)
    got = member.received()
    assert len(got) == 1, got
    day = dt.datetime.now().strftime("%Y-%m-%d")
    assert got[0]["summary"] == f"Foundation: fdn-no-such-vm was not archived on {day}"
    assert "fdn-no-such-vm" in got[0]["body"].splitlines()[0] and "No good archive of it is known." in got[0]["body"]
