"""Who may manage the VMs, and so may see their past: one group.

libvirt already answers this question: its read-write socket belongs to a
group (`unix_sock_group`, `libvirt` on Debian and Fedora) whose members
can start, stop and read every VM. The same group may read the /snapshot
tree and is told when a night fails; `snapshot_group` in the config file
names another. A group that does not exist on this machine means nobody
but root.
"""

import grp
import os
import pwd
import re

DEFAULT_GROUP = "libvirt"
LIBVIRT_CONFS = ("/etc/libvirt/libvirtd.conf", "/etc/libvirt/virtqemud.conf")


def libvirt_group():
    """The group libvirt grants VM control to (its socket group), or `libvirt`."""
    for path in LIBVIRT_CONFS:
        try:
            with open(path) as f:
                for line in f:
                    m = re.match(r'\s*unix_sock_group\s*=\s*"([^"]+)"', line)
                    if m:
                        return m.group(1)
        except OSError:
            continue
    return DEFAULT_GROUP


def group_name(conf=None):
    """The configured `snapshot_group`, else libvirt's."""
    return getattr(conf, "snapshot_group", None) or libvirt_group()


def group_id(name):
    """The group's gid, or None when there is no such group."""
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        return None


def is_member(uid, gid):
    """True when the account `uid` belongs to group `gid` (primary or supplementary)."""
    if gid is None:
        return False
    try:
        pw = pwd.getpwuid(uid)
    except KeyError:
        return False
    return gid in os.getgrouplist(pw.pw_name, pw.pw_gid)
