"""Local accounts and groups made for one test (useradd, groupadd), removed afterwards."""

import contextlib
import os
import pwd
import subprocess
import uuid


@contextlib.contextmanager
def local_group():
    name = f"fdn-g{uuid.uuid4().hex[:8]}"
    subprocess.run(["groupadd", name], check=True)
    try:
        yield name
    finally:
        subprocess.run(["groupdel", name], check=False)


@contextlib.contextmanager
def local_account(groups=(), uid=None):
    """A new account (no home) in `groups` -> its pwd entry."""
    name = f"fdn-u{uuid.uuid4().hex[:8]}"
    cmd = ["useradd", "--no-create-home", "--shell", "/bin/sh", "--user-group"]
    if groups:
        cmd += ["--groups", ",".join(groups)]
    if uid is not None:
        cmd += ["--uid", str(uid), "--non-unique"]
    subprocess.run([*cmd, name], check=True)
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", name], check=False)


def setpriv(pw):
    """The setpriv prefix that runs a command as the account (by name: two accounts may share a uid)."""
    groups = ",".join(str(g) for g in os.getgrouplist(pw.pw_name, pw.pw_gid))
    return ["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", f"--groups={groups}", "--"]


def as_user(pw, *cmd, **kw):
    """Run cmd as the account (its uid, gid and groups) -> CompletedProcess."""
    return subprocess.run([*setpriv(pw), *cmd],
                          capture_output=True, text=True, env={"PATH": os.environ["PATH"], "HOME": "/"}, **kw)
