"""Who may look at the /snapshot tree: root and the snapshot group, tested with real local accounts.

A guest file owned by uid U, mode 0600, is archived; the host has an
account with the same uid U outside the group. The tree must keep it out
(the guest's uid is not the host's), let a member of the group list the
tree (guest modes still apply to the member), and still let libvirt's
QEMU read a raw image by its full path (booted clones use it as backing).
"""

import os
import pwd
import shutil
import subprocess

import pytest
import snapshotfs_support as T

from tests.accounts import as_user, local_account, local_group, setpriv

pytestmark = [pytest.mark.fuse]
pyfuse3 = pytest.importorskip("pyfuse3")
pytest.importorskip("pytsk3")
if os.geteuid() != 0 or not os.path.exists("/dev/fuse"):
    pytest.skip("FUSE mounts need root and /dev/fuse", allow_module_level=True)

WHEN = T.utc(2026, 11, 21, 3, 0, 0)
KEY = b"-----BEGIN OPENSSH PRIVATE KEY----- guest secret\n"


@pytest.fixture
def tree(tmp_path):
    with local_group() as group, local_account([group]) as member, local_account() as outsider:
        src = tmp_path / "fs"
        T.write_tree(str(src), {"pub.txt": b"public\n", "home/u/.ssh/id_ed25519": KEY})
        for p in ("home/u", "home/u/.ssh"):
            os.chmod(src / p, 0o700)
        os.chmod(src / "home/u/.ssh/id_ed25519", 0o600)
        for p in ("home/u", "home/u/.ssh", "home/u/.ssh/id_ed25519"):
            os.chown(src / p, outsider.pw_uid, outsider.pw_gid)    # the guest user's uid is the outsider's
        disk = str(tmp_path / "vda.img")
        T.mkfs_image("ext4", disk, 16 << 20, str(src))
        os.makedirs(tmp_path / "archive")
        arch = T.ImagesArchiver(str(tmp_path / "archive"))
        arch.add("web", WHEN, {"vda": disk}, xml=T.domain_xml("web", "6b3c6a8e-52cf-4c39-9a39-0e2b4c8e7a01",
                                                             {"vda": "/var/lib/libvirt/images/web.qcow2"}))
        mnt = f"/tmp/fdntest-access-{os.getpid()}"
        with T.Mounted(arch, mnt, extra=["--group", group]):
            yield {"mnt": mnt, "member": member, "outsider": outsider, "group": group,
                   "snap": f"{mnt}/2026/11/21/030000/web"}
        shutil.rmtree(mnt, ignore_errors=True)


def test_member_lists_outsider_cannot(tree):
    mnt, snap = tree["mnt"], tree["snap"]
    secret = f"{snap}/vda/home/u/.ssh/id_ed25519"
    with open(secret, "rb") as f:
        assert f.read() == KEY                                 # it is there: root reads it
    r = as_user(tree["member"], "ls", mnt)
    assert r.returncode == 0 and "2026" in r.stdout.split(), r.stderr
    r = as_user(tree["member"], "cat", f"{snap}/vda/pub.txt", f"{snap}/domain.xml")
    assert r.returncode == 0 and r.stdout.startswith("public\n<domain"), r.stderr
    r = as_user(tree["member"], "cat", f"{snap}/changes")
    assert r.returncode == 0 and "+  vda/home/u/.ssh/id_ed25519" in r.stdout, r.stderr
    r = as_user(tree["member"], "cat", secret)                 # guest modes still hold for members
    assert r.returncode != 0 and "Permission denied" in r.stderr
    out = tree["outsider"]
    for cmd in (["ls", mnt], ["ls", f"{mnt}/2026/11/21"], ["ls", snap], ["cat", secret],
                ["cat", f"{snap}/vda/pub.txt"], ["cat", f"{snap}/domain.xml"], ["cat", f"{snap}/snapshot.json"],
                ["cat", f"{snap}/changes"], ["cat", f"{snap}/changes.json"],      # guest file names
                ["readlink", "-v", f"{mnt}/latest/web"]):
        r = as_user(out, *cmd)
        assert r.returncode != 0 and "Permission denied" in r.stderr, (cmd, r.stdout, r.stderr)
    st = os.stat(mnt)
    assert (st.st_mode & 0o777, st.st_gid) == (0o751, os.stat(f"{snap}/vda").st_gid)


def test_same_uid_as_guest_user_reads_nothing(tree):
    """A second host account with the guest user's uid, outside the group: still nothing."""
    with local_account(uid=tree["outsider"].pw_uid) as twin:
        r = as_user(twin, "cat", f"{tree['snap']}/vda/home/u/.ssh/id_ed25519")
        assert r.returncode != 0 and "Permission denied" in r.stderr
    # joining the group opens the tree, and then the guest's own modes decide
    with local_account([tree["group"]], uid=tree["outsider"].pw_uid) as member_twin:
        r = as_user(member_twin, "cat", f"{tree['snap']}/vda/home/u/.ssh/id_ed25519")
        assert r.returncode == 0 and r.stdout.encode() == KEY, r.stderr


def test_qemu_still_reaches_raw_images(tree):
    try:
        qemu = pwd.getpwnam("libvirt-qemu")
    except KeyError:
        pytest.skip("no libvirt-qemu account (libvirt not installed)")
    raw = f"{tree['snap']}/vda.raw"
    r = subprocess.run([*setpriv(qemu), "tail", "-c", "+1048577", raw], capture_output=True)
    assert r.returncode == 0, r.stderr
    with open(raw, "rb") as f:
        f.seek(1 << 20)
        assert r.stdout == f.read() and len(r.stdout) == (16 << 20) - (1 << 20)
    r = as_user(qemu, "ls", tree["mnt"])
    assert r.returncode != 0 and "Permission denied" in r.stderr
