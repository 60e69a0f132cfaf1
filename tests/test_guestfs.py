"""Guest disks as installers lay them out, read through a mounted /snapshot tree.

RHEL-like (GPT: FAT ESP, XFS /boot, LVM PV with an XFS root LV and swap),
Ubuntu-like (MBR: ext4 /boot, LVM in a logical partition with an ext4
root), Fedora-like (GPT: btrfs with `root` and `home` subvolumes; needs
the optional extra), LUKS beside a plain /boot, and a disk whose XFS
superblock is damaged. Each is archived on two days with files added,
removed and rewritten; every file is compared with the directory it was
copied from: bytes, type, mode, owner, size, mtime, symlink target.
"""

import os
import random
import shutil
import stat
import subprocess

import pytest

import guest_images as G
import snapshotfs_support as T

pytestmark = [pytest.mark.fuse, pytest.mark.slow]

try:
    import pyfuse3  # noqa: F401
    HAVE_PYFUSE3 = True
except ImportError:
    HAVE_PYFUSE3 = False
try:
    import dissect.btrfs  # noqa: F401
    HAVE_DISSECT_BTRFS = True
except ImportError:
    HAVE_DISSECT_BTRFS = False
pytest.importorskip("pyfsxfs")
pytest.importorskip("pyvslvm")
CAN_BUILD = os.geteuid() == 0 and os.path.exists("/dev/fuse") and HAVE_PYFUSE3 and G.have(
    "mkfs.xfs", "mkfs.btrfs", "pvcreate", "cryptsetup", "losetup", "unshare", "mkswap", "mkntfs", "ntfscp",
    "mkfs.exfat", "mount.exfat-fuse")
MIB = G.MIB
DAYS = [T.utc(2026, 11, 19), T.utc(2026, 11, 21)]
MTIME = 1_700_000_000


def rnd(n, seed):
    return random.Random(seed).randbytes(n)


def root_tree(path, day, seed):
    """A small Linux root: owners, modes, a symlink, a hard link, a sparse file; day 1 changes it."""
    files = {
        "etc/hostname": (f"guest {seed} day {day}\n".encode(), 0o644, 0, 0),
        "etc/shadow": (b"root:*:19000:0:99999:7:::\n", 0o640, 0, 42),
        "usr/bin/tool": (b"#!/bin/sh\necho tool\n", 0o755, 0, 0),
        "var/lib/big.bin": (rnd(1_500_000, seed), 0o600, 0, 0),
    }
    if day == 0:
        files["home/user/notes.txt"] = (b"removed on day 2\n", 0o600, 1000, 1000)
    else:
        files["etc/hostname"] = (f"guest {seed} rewritten on day 2, longer\n".encode(), 0o644, 0, 0)
        files["var/log/new.log"] = (rnd(70_000, seed + 1), 0o640, 0, 4)
        os.makedirs(os.path.join(path, "home/user"), exist_ok=True)
    for rel, (data, mode, uid, gid) in files.items():
        p = os.path.join(path, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(data)
        os.chmod(p, mode)
        os.chown(p, uid, gid)
    os.chown(os.path.join(path, "home/user"), 1000, 1000)
    with open(os.path.join(os.fsencode(path), b"etc/caf\xe9.latin1"), "wb") as f:     # a name that is not UTF-8
        f.write(b"bytes are names\n")
    os.symlink("/usr/share/zoneinfo/UTC", os.path.join(path, "etc/localtime"))
    os.link(os.path.join(path, "usr/bin/tool"), os.path.join(path, "usr/bin/tool2"))
    with open(os.path.join(path, "var/lib/sparse.img"), "wb") as f:
        f.seek(3 * MIB)
        f.write(b"end of a sparse file\n")
    for d, dirs, fs in os.walk(path, topdown=False):
        for n in fs + dirs:
            os.utime(os.path.join(d, n), (MTIME + day * 86400, MTIME + day * 86400), follow_symlinks=False)


def boot_tree(path, day):
    T.write_tree(path, {"vmlinuz": rnd(400_000, 50 + day), "grub/grub.cfg": f"day {day}\n".encode()},
                 MTIME + day * 86400)


def build(base, day):
    """{vm: {dev: image}} for one day, and {vm/dev/volume: source dir} to compare with."""
    d = os.path.join(base, f"day{day}")
    src = {}
    for name in ("rhel-root", "ubuntu-root", "fedora-root", "fedora-home", "secret-boot"):
        src[name] = os.path.join(d, name)
        root_tree(src[name], day, seed=len(name))
    for name in ("rhel-boot", "ubuntu-boot", "esp"):
        src[name] = os.path.join(d, name)
        boot_tree(src[name], day)
    img = lambda n: os.path.join(d, n + ".img")                      # noqa: E731
    disks = {}
    # RHEL: GPT, FAT ESP, XFS /boot, LVM PV with XFS root and swap
    G.vfat(img("esp"), 8 * MIB, src["esp"])
    G.xfs(img("rhel-boot"), 24 * MIB, src["rhel-boot"])
    G.xfs(img("rhel-root"), 40 * MIB, src["rhel-root"])
    G.swap(img("rhel-swap"), 8 * MIB)
    G.lvm_pv(img("rhel-pv"), 56 * MIB, "rhel", [("root", img("rhel-root")), ("swap", img("rhel-swap"))])
    G.disk(img("rhel"), 96 * MIB, [(img("esp"), G.GPT_ESP), (img("rhel-boot"), G.GPT_LINUX),
                                   (img("rhel-pv"), G.GPT_LVM)])
    disks["rhel"] = {"vda": img("rhel")}
    # Ubuntu: MBR, ext4 /boot, LVM in logical partition 5 with an ext4 root
    G.ext4(img("ubuntu-boot"), 8 * MIB, src["ubuntu-boot"])
    G.ext4(img("ubuntu-root"), 24 * MIB, src["ubuntu-root"])
    G.lvm_pv(img("ubuntu-pv"), 32 * MIB, "ubuntu-vg", [("ubuntu-lv", img("ubuntu-root"))])
    G.disk(img("ubuntu"), 48 * MIB, [(img("ubuntu-boot"), "83"), (img("ubuntu-pv"), ("logical", "8e"))],
           label="dos")
    disks["ubuntu"] = {"vda": img("ubuntu")}
    # Fedora: GPT, ESP, btrfs with subvolumes root and home
    top = os.path.join(d, "fedora-top")
    os.makedirs(top)
    G.btrfs(img("fedora-btrfs"), 128 * MIB, top, {"root": src["fedora-root"], "home": src["fedora-home"]})
    G.disk(img("fedora"), 144 * MIB, [(img("esp"), G.GPT_ESP), (img("fedora-btrfs"), G.GPT_LINUX)])
    disks["fedora"] = {"vda": img("fedora")}
    # LUKS2 beside a plain /boot; a bare LUKS1 disk
    G.ext4(img("secret-boot"), 16 * MIB, src["secret-boot"])
    G.luks(img("secret-luks2"), 20 * MIB, 2)
    G.disk(img("secret"), 40 * MIB, [(img("secret-boot"), G.GPT_LINUX), (img("secret-luks2"), G.GPT_LINUX)])
    G.luks(img("secret-luks1"), 8 * MIB, 1)
    G.luks(img("secret-home"), 20 * MIB, 2)
    G.lvm_pv(img("secret-pv"), 36 * MIB, "sec", [("home", img("secret-home")), ("swap", img("rhel-swap"))])
    disks["secret"] = {"vda": img("secret"), "vdb": img("secret-luks1"), "vdc": img("secret-pv")}
    # Windows-like: GPT, NTFS and exFAT
    for name, files in (("win-ntfs", {"report.txt": f"day {day}\n".encode(), "blob.bin": rnd(300_000, 9)}),
                        ("win-exfat", {"photos/a.jpg": rnd(200_000, 10 + day), "notes.txt": b"exfat\n"})):
        src[name] = os.path.join(d, name)
        T.write_tree(src[name], files)
    if day == 1:
        os.remove(os.path.join(src["win-ntfs"], "blob.bin"))
    G.ntfs(img("win-ntfs"), 16 * MIB, src["win-ntfs"])
    G.exfat(img("win-exfat"), 16 * MIB, src["win-exfat"])
    G.disk(img("win"), 40 * MIB, [(img("win-ntfs"), G.GPT_MSDATA), (img("win-exfat"), G.GPT_MSDATA)])
    disks["win"] = {"vda": img("win")}
    where = {
        "rhel/vda/p1": src["esp"], "rhel/vda/p2": src["rhel-boot"], "rhel/vda/p3/rhel/root": src["rhel-root"],
        "ubuntu/vda/p1": src["ubuntu-boot"], "ubuntu/vda/p5/ubuntu-vg/ubuntu-lv": src["ubuntu-root"],
        "fedora/vda/p1": src["esp"], "fedora/vda/p2/root": src["fedora-root"],
        "fedora/vda/p2/home": src["fedora-home"], "secret/vda/p1": src["secret-boot"],
        "win/vda/p1": src["win-ntfs"], "win/vda/p2": src["win-exfat"],
    }
    return disks, where


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Each day's guest disks, built once: [({vm: {dev: image}}, {vm/dev/volume: source dir})]."""
    if not CAN_BUILD:
        pytest.skip("needs root, /dev/fuse, pyfuse3 and scripts/setup.sh's file-system tools")
    base = str(tmp_path_factory.mktemp("guests"))
    days = [build(base, day) for day in range(len(DAYS))]
    # a RHEL disk whose XFS /boot superblock is damaged (magic kept, geometry garbage)
    broken = os.path.join(base, "broken.img")
    shutil.copy(days[1][0]["rhel"]["vda"], broken)
    with open(broken, "r+b") as f:
        f.seek(9 * MIB + 4)                      # p2 starts after the 1 MiB gap and the 8 MiB ESP
        f.write(b"\xff" * 200)
    return days, broken


@pytest.fixture(scope="module", params=["images", "store"])
def guests(request, built, tmp_path_factory):
    """The guests archived as raw image files, or into a real store, and mounted."""
    days, broken = built
    work = str(tmp_path_factory.mktemp(f"archive-{request.param}"))
    if request.param == "images":
        arch = T.ImagesArchiver(work)
    else:
        arch = T.StoreArchiver(work, encrypt=False)
    for when, (disks, _) in zip(DAYS, days):
        for vm, ds in disks.items():
            arch.add(vm, when, ds)
    arch.add("broken", DAYS[1], {"vda": broken})
    mnt = f"/tmp/fdntest-guests-{request.param}-{os.getpid()}"
    with T.Mounted(arch, mnt) as m:
        yield {"mnt": mnt, "days": [where for _, where in days], "m": m}
    shutil.rmtree(mnt, ignore_errors=True)


def volinfo(type_name, encrypted=False, replayed=False, unreplayed=False):
    """A volume as snapshot.json describes it."""
    return {"type": type_name, "encrypted": encrypted, "replayed": replayed, "unreplayed": unreplayed}


def utf8(name):
    try:
        name.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def compare(tree, src, posix=True, utf8_only=False):
    """Every entry under src equals the tree's: names, types, bytes, links, and with posix, owners.
    With utf8_only, names that are not UTF-8 must be absent (libfsxfs cannot read them)."""
    seen, want, inodes = set(), set(), {}
    for d, dirs, files in os.walk(tree):
        for n in dirs + files:
            seen.add(os.path.relpath(os.path.join(d, n), tree))
    for d, dirs, files in os.walk(src):
        for n in dirs + files:
            if utf8_only and not utf8(n):
                continue
            rel = os.path.relpath(os.path.join(d, n), src)
            want.add(rel)
            s, t = os.lstat(os.path.join(src, rel)), os.lstat(os.path.join(tree, rel))
            if posix:
                assert (t.st_mode, t.st_uid, t.st_gid) == (s.st_mode, s.st_uid, s.st_gid), rel
                assert t.st_mtime_ns == s.st_mtime_ns, rel
            if s.st_nlink > 1 and not stat.S_ISDIR(s.st_mode):          # hard links: one inode
                assert inodes.setdefault(s.st_ino, t.st_ino) == t.st_ino, rel
                assert t.st_nlink == s.st_nlink, rel
            if stat.S_ISLNK(s.st_mode):
                assert os.readlink(os.path.join(tree, rel)) == os.readlink(os.path.join(src, rel)), rel
            elif stat.S_ISREG(s.st_mode):
                assert t.st_size == s.st_size, rel
                with open(os.path.join(src, rel), "rb") as a, open(os.path.join(tree, rel), "rb") as b:
                    assert a.read() == b.read(), rel
    seen.discard("lost+found")
    assert seen == want


@pytest.mark.parametrize("vol", ["rhel/vda/p2", "rhel/vda/p3/rhel/root", "ubuntu/vda/p1",
                                 "ubuntu/vda/p5/ubuntu-vg/ubuntu-lv", "secret/vda/p1"])
def test_files_as_the_guest_wrote_them(guests, vol):
    xfs = vol.startswith("rhel")
    for day, (when, where) in enumerate(zip(DAYS, guests["days"])):
        compare(f"{guests['mnt']}/{when:%Y/%m/%d}/{vol}", where[vol], utf8_only=xfs)
    old, new = (f"{guests['mnt']}/{w:%Y/%m/%d}/{vol}" for w in DAYS)
    if not vol.startswith("rhel/vda/p2") and vol != "ubuntu/vda/p1":     # root file systems
        assert os.path.exists(f"{old}/home/user/notes.txt")
        assert not os.path.exists(f"{new}/home/user/notes.txt")       # removed on day 2
        assert open(f"{new}/var/log/new.log", "rb").read() == open(f"{where[vol]}/var/log/new.log", "rb").read()
        a, b = os.stat(f"{new}/usr/bin/tool"), os.stat(f"{new}/usr/bin/tool2")
        assert a.st_nlink == b.st_nlink == 2 and a.st_ino == b.st_ino      # hard links: one inode
        assert os.stat(f"{old}/usr/bin/tool").st_ino != a.st_ino
        assert sorted(os.listdir(os.fsencode(f"{new}/etc")))[0] == (b"caf\xe9.latin1" if not xfs else b"hostname")
    if xfs and "root" in vol:
        lines = [ln for ln in guests["m"].log().splitlines()
                 if "not UTF-8" in ln and "rhel/vda/p3/rhel/root" in ln]
        assert lines and ": 1 names are not UTF-8" in lines[0], lines


@pytest.mark.parametrize("vol", ["rhel/vda/p1", "win/vda/p1", "win/vda/p2"])
def test_fat_exfat_ntfs_are_read(guests, vol):
    for when, where in zip(DAYS, guests["days"]):
        compare(f"{guests['mnt']}/{when:%Y/%m/%d}/{vol}", where[vol], posix=False)
    assert os.path.exists(f"{guests['mnt']}/2026/11/19/win/vda/p1/blob.bin")
    assert not os.path.exists(f"{guests['mnt']}/2026/11/21/win/vda/p1/blob.bin")


def test_layout_names(guests):
    mnt = guests["mnt"]
    assert sorted(os.listdir(f"{mnt}/2026/11/21/rhel/vda")) == ["p1", "p2", "p3"]
    assert os.listdir(f"{mnt}/2026/11/21/rhel/vda/p3") == ["rhel"]
    assert os.listdir(f"{mnt}/2026/11/21/rhel/vda/p3/rhel") == ["root"]        # swap is not shown
    assert sorted(os.listdir(f"{mnt}/2026/11/21/ubuntu/vda")) == ["p1", "p5"]
    import json
    info = json.load(open(f"{mnt}/2026/11/21/rhel/snapshot.json"))
    assert info["volumes"]["vda"] == {
        "p1": volinfo("fat12"),
        "p2": volinfo("xfs"),
        "p3/rhel/root": volinfo("xfs")}


def test_luks_is_named_and_empty(guests):
    mnt = guests["mnt"]
    for when in DAYS:
        v = f"{mnt}/{when:%Y/%m/%d}/secret"
        assert sorted(os.listdir(f"{v}/vda")) == ["p1", "p2.encrypted"]
        assert os.listdir(f"{v}/vda/p2.encrypted") == []
        assert os.listdir(f"{v}/vdb") == []           # a bare LUKS disk: named in snapshot.json only
        assert os.listdir(f"{v}/vdc") == ["sec"]      # LVM on the bare disk; LUKS in an LV, swap hidden
        assert os.listdir(f"{v}/vdc/sec") == ["home.encrypted"]
        assert os.listdir(f"{v}/vdc/sec/home.encrypted") == []
    import json
    info = json.load(open(f"{mnt}/2026/11/21/secret/snapshot.json"))
    assert info["volumes"]["vda"]["p2"] == volinfo("luks2", encrypted=True)
    assert info["volumes"]["vdb"][""] == volinfo("luks1", encrypted=True)
    assert info["volumes"]["vdc"] == {"sec/home": volinfo("luks2", encrypted=True)}


@pytest.mark.skipif(not HAVE_DISSECT_BTRFS, reason="btrfs needs the optional extra: pip install '.[btrfs]'")
def test_btrfs_subvolumes(guests):
    for when, where in zip(DAYS, guests["days"]):
        base = f"{guests['mnt']}/{when:%Y/%m/%d}/fedora/vda/p2"
        assert sorted(os.listdir(base)) == ["home", "root"]
        compare(f"{base}/root", where["fedora/vda/p2/root"])
        compare(f"{base}/home", where["fedora/vda/p2/home"])


def test_damaged_superblock_is_one_log_line(guests):
    mnt = guests["mnt"]
    v = f"{mnt}/2026/11/21/broken/vda"
    assert sorted(os.listdir(v)) == ["p1", "p3"]
    compare(f"{v}/p3/rhel/root", guests["days"][1]["rhel/vda/p3/rhel/root"], utf8_only=True)
    lines = [ln for ln in guests["m"].log().splitlines() if "cannot read" in ln and "broken" in ln]
    assert len(lines) == 1, lines
    assert "2026/11/21/030000/broken/vda/p2 (xfs)" in lines[0] and "the rest of the disk is shown" in lines[0]


def test_crash_consistent_ext4_is_replayed(tmp_path):
    """A day whose ext4 journal holds a committed transaction shows what e2fsck (or the guest) would."""
    if not CAN_BUILD:
        pytest.skip("needs root, /dev/fuse, pyfuse3 and scripts/setup.sh's file-system tools")
    t = str(tmp_path)
    src = os.path.join(t, "src")
    root_tree(src, 0, seed=7)
    before, after = os.path.join(t, "before.img"), os.path.join(t, "after.img")
    G.ext4(before, 24 * MIB, src)
    shutil.copy(before, after)
    with open(os.path.join(t, "synced.txt"), "wb") as f:
        f.write(rnd(20_000, 8))
    G.debugfs(after, f"write {t}/synced.txt var/synced.txt", "rm home/user/notes.txt",
              "rm etc/hostname", f"write {t}/synced.txt etc/hostname", "sif etc/hostname mode 0100600")
    crash = os.path.join(t, "crash.img")
    G.unreplayed(before, after, crash)
    # the same journal, but its superblock unreadable: one log line, the disk as it lies
    broken = os.path.join(t, "broken.img")
    shutil.copy(crash, broken)
    jblock = int(G.run(["debugfs", "-R", "bmap <8> 0", broken]).split()[0])
    with open(broken, "r+b") as f:
        f.seek(jblock * 4096 + 16)
        f.write(b"\xff" * 8)                          # s_maxlen, s_first: nonsense
    # what e2fsck makes of it, on a copy
    fixed = os.path.join(t, "fixed.img")
    shutil.copy(crash, fixed)
    subprocess.run(["e2fsck", "-fy", fixed], capture_output=True)
    G.files_of(fixed, os.path.join(t, "fixed"))
    G.files_of(before, os.path.join(t, "before"))
    # a copy taken while the kernel had it mounted: its own journal (64-bit, checksum v3) holds the writes
    live, live_crash = os.path.join(t, "live.img"), os.path.join(t, "live-crash.img")
    G.ext4(live, 24 * MIB, src)
    writes = ('mkdir $M/new; for i in $(seq 1 40); do echo "file $i" > $M/new/f$i; done; '
              'rm $M/etc/shadow; head -c 300000 /dev/urandom > $M/var/lib/big.bin')
    G.copied_while_mounted(live, live_crash, writes)
    live_fixed = os.path.join(t, "live-fixed.img")
    shutil.copy(live_crash, live_fixed)
    subprocess.run(["e2fsck", "-fy", live_fixed], capture_output=True)
    G.files_of(live_fixed, os.path.join(t, "live-fixed"))
    # an XFS copied after a sync while mounted: its log is dirty, and nothing replays it
    xfs_live, xfs_crash = os.path.join(t, "xfs.img"), os.path.join(t, "xfs-crash.img")
    G.xfs(xfs_live, 24 * MIB, src)
    G.copied_while_mounted(xfs_live, xfs_crash, "mkdir $M/new; touch $M/new/a $M/new/b; sync", opts="loop")
    # crash inside an LVM logical volume, as on Ubuntu; broken on a bare disk
    G.lvm_pv(os.path.join(t, "pv.img"), 32 * MIB, "ubuntu-vg", [("ubuntu-lv", crash)])
    disk = os.path.join(t, "vda.img")
    G.disk(disk, 40 * MIB, [(os.path.join(t, "pv.img"), G.GPT_LVM)])
    os.makedirs(os.path.join(t, "archive"))
    arch = T.ImagesArchiver(os.path.join(t, "archive"))
    arch.add("crashed", DAYS[0], {"vda": disk, "vdb": broken, "vdc": live_crash, "vdd": xfs_crash})
    mnt = f"/tmp/fdntest-crash-{os.getpid()}"
    with T.Mounted(arch, mnt) as m:
        day = f"{mnt}/2026/11/19/crashed"
        shutil.rmtree(os.path.join(t, "fixed", "lost+found"), ignore_errors=True)
        compare(f"{day}/vda/p1/ubuntu-vg/ubuntu-lv", os.path.join(t, "fixed"))
        assert open(f"{day}/vda/p1/ubuntu-vg/ubuntu-lv/var/synced.txt", "rb").read() == rnd(20_000, 8)
        assert not os.path.exists(f"{day}/vda/p1/ubuntu-vg/ubuntu-lv/home/user/notes.txt")
        shutil.rmtree(os.path.join(t, "before", "lost+found"), ignore_errors=True)
        compare(f"{day}/vdb", os.path.join(t, "before"))
        import json
        info = json.load(open(f"{day}/snapshot.json"))
        assert info["volumes"]["vda"]["p1/ubuntu-vg/ubuntu-lv"]["replayed"] is True
        assert info["volumes"]["vdb"][""]["replayed"] is False and info["volumes"]["vdb"][""]["unreplayed"]
        assert info["volumes"]["vdd"][""] == volinfo("xfs", unreplayed=True)
        assert [ln for ln in m.log().splitlines() if "vdd (xfs)" in ln] == [
            "WARNING foundation.guestfs.disk: 2026/11/19/030000/crashed/vdd (xfs): its log holds transactions the "
            "guest would replay at mount, which libfsxfs does not; shown as the disk holds it"]
        shutil.rmtree(os.path.join(t, "live-fixed", "lost+found"), ignore_errors=True)
        compare(f"{day}/vdc", os.path.join(t, "live-fixed"))
        assert len(os.listdir(f"{day}/vdc/new")) == 40 and not os.path.exists(f"{day}/vdc/etc/shadow")
        assert info["volumes"]["vdc"][""]["replayed"] is True
        lines = [ln for ln in m.log().splitlines() if "cannot replay" in ln]
        assert len(lines) == 1 and "2026/11/19/030000/crashed/vdb (ext)" in lines[0], lines
    shutil.rmtree(mnt, ignore_errors=True)


@pytest.mark.parametrize("fs", ["xfs", "btrfs"])
def test_damaged_block_under_lvm_is_a_read_error_never_wrong_data(fs, tmp_path):
    """A store read that fails under libvslvm + libfsxfs (or Dissect) fails that read, not its neighbours."""
    if not CAN_BUILD:
        pytest.skip("needs root, xfsprogs, btrfs-progs, lvm2")
    if fs == "btrfs" and not HAVE_DISSECT_BTRFS:
        pytest.skip("btrfs needs the optional extra")
    from foundation.errors import DataCorrupt
    from foundation.snapshotfs.volumes import DiskFiles, ReadFailed

    t = str(tmp_path)
    src = os.path.join(t, "src")
    T.write_tree(src, {"a.bin": b"A" * 200_000, "b.bin": b"B" * 200_000})
    img = os.path.join(t, "fs.img")
    if fs == "xfs":
        G.xfs(img, 24 * MIB, src)
    else:
        G.btrfs(img, 128 * MIB, src, {})
    G.lvm_pv(os.path.join(t, "pv.img"), 136 * MIB, "vg", [("lv", img)])
    s = G.Bytes(os.path.join(t, "pv.img"))
    df = DiskFiles(s, label="test/vda")
    vol = df.volumes()["vg/lv"]
    assert vol.type_name == fs
    names = {e.name: e for e in vol.list_dir(vol.root_addr)}
    i = s.data.find(b"A" * 4096)
    s.bad = (i + 131072, i + 131073)      # these readers read 64 KiB at a time: damage 128 KiB in
    ea, eb = names[b"a.bin"], names[b"b.bin"]
    fa = vol.open_file(ea.addr)
    with pytest.raises(ReadFailed) as ex:
        vol.read_file(fa, 0, ea.size, ea.size)
    assert isinstance(ex.value.cause, DataCorrupt)
    assert vol.read_file(fa, 0, 4096, ea.size) == b"A" * 4096        # before the damage
    fb = vol.open_file(eb.addr)
    assert vol.read_file(fb, 0, eb.size, eb.size) == b"B" * 200_000


def test_volume_group_on_two_disks_is_one_log_line(tmp_path, caplog):
    """A group spread over two physical volumes is not guessed at: one line, the rest of the disk shown."""
    if not CAN_BUILD:
        pytest.skip("needs root and lvm2")
    from foundation.snapshotfs.volumes import DiskFiles

    t = str(tmp_path)
    a, b = os.path.join(t, "a.img"), os.path.join(t, "b.img")
    G.blank(a, 16 * MIB)
    G.blank(b, 16 * MIB)
    with G.Loop(a) as da, G.Loop(b) as db:
        lvm = ["--devices", da, "--devices", db, "--config",
               "devices { use_devicesfile = 0 } backup { backup = 0 archive = 0 }"]
        G.run(["pvcreate", "-q"] + lvm + [da, db])
        G.run(["vgcreate", "-q", "--setautoactivation", "n"] + lvm + ["wide", da, db])
        G.run(["lvcreate", "-q"] + lvm + ["--driverloaded", "n", "-an", "-Zn", "-Wn", "-l", "100%FREE", "-n", "lv",
                                          "wide"])
    boot = os.path.join(t, "boot")
    T.write_tree(boot, {"vmlinuz": b"kernel"})
    G.ext4(os.path.join(t, "boot.img"), 8 * MIB, boot)
    disk = os.path.join(t, "vda.img")
    G.disk(disk, 32 * MIB, [(os.path.join(t, "boot.img"), G.GPT_LINUX), (a, G.GPT_LVM)])

    df = DiskFiles(G.Bytes(disk), label="2026/11/25/030000/wide/vda")
    with caplog.at_level("WARNING"):
        vols = df.volumes()
    assert list(vols) == ["p1"]
    assert df.failed == {"p2": "volume group wide spans 2 physical volumes; only groups on one are read"}
    lines = [r.getMessage() for r in caplog.records if "cannot read" in r.getMessage()]
    assert lines == ["cannot read 2026/11/25/030000/wide/vda/p2 (lvm): volume group wide spans 2 physical volumes; "
                     "only groups on one are read; the rest of the disk is shown"]


@pytest.mark.parametrize("revoked", [False, True])
def test_journal_revoke_is_honoured_as_e2fsck_does(revoked, tmp_path):
    """A block journaled in one transaction and revoked in a later one is not replayed."""
    if not G.have("debugfs", "e2fsck"):
        pytest.skip("needs e2fsprogs")
    from foundation.snapshotfs.volumes import DiskFiles

    t = str(tmp_path)
    src = os.path.join(t, "src")
    T.write_tree(src, {"a.txt": b"old content\n"})
    img = os.path.join(t, "fs.img")
    G.ext4(img, 8 * MIB, src)
    block = int(G.run(["debugfs", "-R", "bmap /a.txt 0", img]).split()[0])
    new = os.path.join(t, "new")
    with open(new, "wb") as f:
        f.write(b"journaled!\n".ljust(4096, b"\0"))
    cmds = ["jo", f"jw -b {block} {new}", "jc"] + (["jo", f"jw -r {block}", "jc"] if revoked else [])
    G.debugfs(img, *cmds)
    fixed = os.path.join(t, "fixed.img")
    shutil.copy(img, fixed)
    subprocess.run(["e2fsck", "-fy", fixed], capture_output=True)
    for path in (img, fixed):
        vol = DiskFiles(G.Bytes(path)).volumes()[""]
        e = {x.name: x for x in vol.list_dir(vol.root_addr)}[b"a.txt"]
        got = vol.read_file(vol.open_file(e.addr), 0, e.size, e.size)
        assert got == (b"old content\n" if revoked else b"journaled!\n\0"), path
        assert vol.replayed == (path == img and not revoked)
