"""Guest disks as installers lay them out, read through a mounted /snapshot tree.

RHEL-like (GPT: FAT ESP, XFS /boot, LVM PV with an XFS root LV and swap),
Ubuntu-like (MBR: ext4 /boot, LVM in a logical partition with an ext4
root), LVM thin (an ext4 root in a thin pool, a linear LV beside it),
Fedora-like (GPT: btrfs with `root` and `home` subvolumes; needs
the optional extra), LUKS beside a plain /boot, and a disk whose XFS
superblock is damaged. Each is archived on two days with files added,
removed and rewritten; every file is compared with the directory it was
copied from: bytes, type, mode, owner, size, mtime, symlink target.
"""

import os
import random
import re
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
    "mkfs.exfat", "mount.exfat-fuse", "thin_restore", "thin_dump")
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
    # LVM thin: GPT, ext4 /boot, a PV whose thin pool holds the root; a linear home beside the pool
    src["thin-root"] = os.path.join(d, "thin-root")
    root_tree(src["thin-root"], day, seed=31)
    G.ext4(img("thin-root"), 24 * MIB, src["thin-root"])
    G.lvm_thin_pv(img("thin-pv"), 40 * MIB, "tvg", "pool", [("root", img("thin-root"), 32)], data_mib=16,
                  linear=[("home", img("ubuntu-boot")), ("swap", img("rhel-swap"))])
    G.disk(img("thin"), 56 * MIB, [(img("ubuntu-boot"), G.GPT_LINUX), (img("thin-pv"), G.GPT_LVM)])
    disks["thin"] = {"vda": img("thin")}
    where = {
        "rhel/vda/p1": src["esp"], "rhel/vda/p2": src["rhel-boot"], "rhel/vda/p3/rhel/root": src["rhel-root"],
        "ubuntu/vda/p1": src["ubuntu-boot"], "ubuntu/vda/p5/ubuntu-vg/ubuntu-lv": src["ubuntu-root"],
        "fedora/vda/p1": src["esp"], "fedora/vda/p2/root": src["fedora-root"],
        "fedora/vda/p2/home": src["fedora-home"], "secret/vda/p1": src["secret-boot"],
        "win/vda/p1": src["win-ntfs"], "win/vda/p2": src["win-exfat"],
        "thin/vda/p1": src["ubuntu-boot"], "thin/vda/p2/tvg/root": src["thin-root"],
        "thin/vda/p2/tvg/home": src["ubuntu-boot"],
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
                                 "ubuntu/vda/p5/ubuntu-vg/ubuntu-lv", "secret/vda/p1", "thin/vda/p2/tvg/root"])
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


def test_thin_volumes_shown_pool_hidden(guests):
    """A thin LV is read through its pool; the pool, its _tmeta/_tdata and swap are not shown."""
    mnt = guests["mnt"]
    for when, where in zip(DAYS, guests["days"]):
        v = f"{mnt}/{when:%Y/%m/%d}/thin/vda"
        assert sorted(os.listdir(v)) == ["p1", "p2"]
        assert sorted(os.listdir(f"{v}/p2/tvg")) == ["home", "root"]
        compare(f"{v}/p2/tvg/home", where["thin/vda/p2/tvg/home"])
    import json
    info = json.load(open(f"{mnt}/2026/11/21/thin/snapshot.json"))
    assert info["volumes"]["vda"] == {"p1": volinfo("ext4"), "p2/tvg/root": volinfo("ext4"),
                                      "p2/tvg/home": volinfo("ext4")}


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
    # an XFS copied after a sync while mounted: its log is dirty, and replayed as the kernel does
    xfs_live, xfs_crash = os.path.join(t, "xfs.img"), os.path.join(t, "xfs-crash.img")
    G.xfs(xfs_live, 24 * MIB, src)
    G.copied_while_mounted(xfs_live, xfs_crash, "mkdir $M/new; touch $M/new/a $M/new/b; sync", opts="loop")
    xfs_fixed = os.path.join(t, "xfs-fixed.img")
    shutil.copy(xfs_crash, xfs_fixed)
    G.files_of(xfs_fixed, os.path.join(t, "xfs-fixed"), opts="loop")
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
        assert info["volumes"]["vdd"][""] == volinfo("xfs", replayed=True)
        assert not [ln for ln in m.log().splitlines() if "vdd (xfs)" in ln]
        compare(f"{day}/vdd", os.path.join(t, "xfs-fixed"), utf8_only=True)
        assert sorted(os.listdir(f"{day}/vdd/new")) == ["a", "b"]
        shutil.rmtree(os.path.join(t, "live-fixed", "lost+found"), ignore_errors=True)
        compare(f"{day}/vdc", os.path.join(t, "live-fixed"))
        assert len(os.listdir(f"{day}/vdc/new")) == 40 and not os.path.exists(f"{day}/vdc/etc/shadow")
        assert info["volumes"]["vdc"][""]["replayed"] is True
        lines = [ln for ln in m.log().splitlines() if "cannot replay" in ln]
        assert len(lines) == 1 and "2026/11/19/030000/crashed/vdb (ext)" in lines[0], lines
    shutil.rmtree(mnt, ignore_errors=True)


def _only_the_damaged_read_fails(vol, names):
    """a.bin, damaged past its first 4 KiB, fails its whole read with the store's error; b.bin reads."""
    from foundation.errors import DataCorrupt
    from foundation.guestfs import ReadFailed

    ea, eb = names[b"a.bin"], names[b"b.bin"]
    fa = vol.open_file(ea.addr)
    with pytest.raises(ReadFailed) as ex:
        vol.read_file(fa, 0, ea.size, ea.size)
    assert isinstance(ex.value.cause, DataCorrupt)
    assert vol.read_file(fa, 0, 4096, ea.size) == b"A" * 4096        # before the damage
    fb = vol.open_file(eb.addr)
    assert vol.read_file(fb, 0, eb.size, eb.size) == b"B" * 200_000


@pytest.mark.parametrize("fs", ["xfs", "btrfs"])
def test_damaged_block_under_lvm_is_a_read_error_never_wrong_data(fs, tmp_path):
    """A store read that fails under libvslvm + libfsxfs (or Dissect) fails that read, not its neighbours."""
    if not CAN_BUILD:
        pytest.skip("needs root, xfsprogs, btrfs-progs, lvm2")
    if fs == "btrfs" and not HAVE_DISSECT_BTRFS:
        pytest.skip("btrfs needs the optional extra")
    from foundation.snapshotfs.volumes import DiskFiles

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
    _only_the_damaged_read_fails(vol, names)


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


def _view(vol):
    """{path: (mode, uid, gid, size, link target, bytes)} of a Volume, read through the tree's reader."""
    out = {}

    def walk(addr, path):
        for e in vol.list_dir(addr):
            p = f"{path}/{e.name.decode()}"
            data = vol.read_file(vol.open_file(e.addr), 0, e.size, e.size) if stat.S_ISREG(e.mode) else None
            out[p] = (e.mode, e.uid, e.gid, None if e.is_dir else e.size, e.link, data)
            if e.is_dir:
                walk(e.addr, p)
    walk(vol.root_addr, "")
    return out


def _kernel_view(img, dest):
    """The same map of what a kernel mount of a copy of img (which replays its log) shows, less the
    names that are not UTF-8 (libfsxfs does not return them)."""
    copy = img + ".kernel"
    shutil.copy(img, copy)
    G.files_of(copy, dest, opts="loop")              # read-write: XFS replays its log only so
    os.remove(copy)
    out = {}
    for root, dirs, files in os.walk(dest):
        for n in dirs + files:
            full = os.path.join(root, n)
            try:
                full.encode()
            except UnicodeEncodeError:
                continue
            st = os.lstat(full)
            link = os.readlink(full).encode() if stat.S_ISLNK(st.st_mode) else None
            data = open(full, "rb").read() if stat.S_ISREG(st.st_mode) else None
            out[full[len(dest):]] = (st.st_mode, st.st_uid, st.st_gid,
                                     None if stat.S_ISDIR(st.st_mode) else st.st_size, link, data)
    return out


def _repair_complaints(img, tmp):
    """What `xfs_repair -n` finds wrong in a copy of img with the replayed blocks written into it,
    beyond the superblock's free counters (lazy: the kernel, too, recounts them after recovery)."""
    from foundation.guestfs import xfslog

    data = open(img, "rb").read()
    blocks = xfslog.replay(lambda off, n: data[off:off + n], data[:512])
    copy = os.path.join(tmp, "replayed.img")
    shutil.copy(img, copy)
    bs = int.from_bytes(data[4:8], "big")
    with open(copy, "r+b") as f:
        for b, new in blocks.items():
            f.seek(b * bs)
            f.write(new)
    r = subprocess.run(["xfs_repair", "-n", "-o", "force_geometry", copy], capture_output=True, text=True)
    noise = ("Phase ", "        - ", "\t- ", "Cannot get host", "Repair may fail", "the image and the host",
             "ALERT:", "ignored because", "which may be resolved", "No modify flag", "sb_icount", "sb_ifree",
             "sb_fdblocks")
    return [ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip() and not ln.startswith(noise)]


XFS_DAY2 = ("rm $M/etc/shadow; echo rewritten > $M/etc/hostname; chmod 600 $M/etc/hostname; "
            "mv $M/usr/bin/tool $M/usr/bin/renamed; mkdir $M/many; "
            "for i in $(seq 1 400); do echo \"entry $i\" > $M/many/file-with-a-long-name-$i; done; "
            "head -c 200000 /dev/urandom >> $M/var/lib/big.bin; ln -s ../many $M/etc/many; "
            # an attribute fork beside inline data and extents; a symlink target in a block of its own
            "python3 -c 'import os, sys; [os.setxattr(p, b\"user.k\", b\"v\" * 60) for p in sys.argv[1:]]' "
            "$M/etc/hostname $M/many/file-with-a-long-name-9 $M/many; ln -s /$(printf 'x%.0s' $(seq 300)) $M/far; "
            "chown 1000:100 $M/many/file-with-a-long-name-7; xfs_io -c fsync $M/var/lib/big.bin; "
            # 300 extents: the file's data fork becomes a btree, logged as its root (DBROOT)
            "xfs_io -f " + " ".join(f"-c 'pwrite -S {o % 251} {o * 8192} 4096'" for o in range(300)) +
            " -c fsync $M/var/frag.bin >/dev/null; "
            "mkdir $M/late; head -c 5000 /dev/urandom > $M/late/last.bin; xfs_io -c fsync $M/late/last.bin")


def _xfs_crashed(tmp_path, seed, script):
    """(dir, image after `script` and a shutdown with the log forced, view of the image before it);
    the file system starts as root_tree(seed), or empty for seed None."""
    if os.geteuid() != 0 or not G.have("mkfs.xfs", "xfs_io", "xfs_logprint", "unshare"):
        pytest.skip("needs root and xfsprogs")
    from foundation.guestfs import DiskFiles

    t = str(tmp_path)
    src = os.path.join(t, "src")
    os.makedirs(src)
    if seed is not None:
        root_tree(src, 0, seed=seed)
    img, crash = os.path.join(t, "xfs.img"), os.path.join(t, "crash.img")
    G.xfs(img, 24 * MIB, src)
    clean = _view(DiskFiles(G.Bytes(img)).volumes()[""])
    G.xfs_crashed(img, crash, script)
    return t, crash, clean


def test_crash_consistent_xfs_log_is_replayed(tmp_path, monkeypatch):
    """An XFS shut down with committed transactions only in its log reads as a kernel mount of a copy
    (which replays the log) shows it; with its last log record torn, as far as the last whole commit."""
    from foundation.guestfs import DiskFiles

    t, crash, clean = _xfs_crashed(tmp_path, 11, XFS_DAY2)
    printed = G.run(["xfs_logprint", "-t", crash])
    # logged: an inode core with its data fork's btree root, one with an attribute fork
    logged = {int(f, 16) for f in re.findall(r"INODE: .* flags:0x([0-9a-f]+) ", printed)}
    assert "state: <DIRTY>" in printed and 0x9 in logged and any(f & 0x40 for f in logged)

    vol = DiskFiles(G.Bytes(crash)).volumes()[""]
    assert (vol.replayed, vol.unreplayed) == (True, False)
    got, want = _view(vol), _kernel_view(crash, os.path.join(t, "kernel"))
    assert got == want
    assert len([p for p in got if p.startswith("/many/")]) == 400 and "/etc/shadow" not in got
    assert _repair_complaints(crash, t) == []          # replayed metadata with its LSNs and CRCs right
    assert got["/etc/hostname"][0] == stat.S_IFREG | 0o600 and got["/etc/hostname"][5] == b"rewritten\n"
    assert got != clean and "/late/last.bin" in got and got["/var/frag.bin"][3] == 299 * 8192 + 4096
    assert got["/far"][4] == b"/" + b"x" * 300
    with monkeypatch.context() as m:                 # the changes are in the log only: unreplayed, they are lost
        m.setattr("foundation.guestfs.xfslog.replay", lambda read, sb: {})
        lies = _view(DiskFiles(G.Bytes(crash)).volumes()[""])
    assert "/late/last.bin" not in lies and len([p for p in lies if p.startswith("/many/")]) < 400

    # the last record torn (a byte of it lost): the kernel drops it, and so does the replay
    torn = os.path.join(t, "torn.img")
    shutil.copy(crash, torn)
    log, recs = G.xfs_records(torn)
    with open(torn, "r+b") as f:
        f.seek(log + recs[-1] * 512 + 512 + 100)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    vol = DiskFiles(G.Bytes(torn)).volumes()[""]
    got, want = _view(vol), _kernel_view(torn, os.path.join(t, "kernel-torn"))
    assert got == want
    assert "/late/last.bin" not in got and "/var/lib/big.bin" in got and vol.replayed


def test_xfs_log_hole_ends_it_and_damage_is_one_line(tmp_path, caplog):
    """A record the crash left unwritten ends the log there, as in the kernel; a log record damaged far
    before the head is one log line and the disk as it lies, never a crash."""
    from foundation.guestfs import DiskFiles

    # many small commits, so that the first record of the log is more than eight records before the head
    t, crash, clean = _xfs_crashed(tmp_path, None, "for i in $(seq 1 12); do echo $i > $M/f$i; "
                                                 "xfs_io -c fsync $M/f$i; done")
    log, recs = G.xfs_records(crash)
    assert len(recs) > 9
    # a hole: the second last record never written but for its last block (log writes finish out of
    # order), where a search by cycle numbers can step over it; the log ends before it
    hole = os.path.join(t, "hole.img")
    shutil.copy(crash, hole)
    with open(hole, "r+b") as f:
        f.seek(log + recs[-2] * 512)
        f.write(bytes((recs[-1] - recs[-2] - 1) * 512))
    vol = DiskFiles(G.Bytes(hole)).volumes()[""]
    got = _view(vol)
    assert got == _kernel_view(hole, os.path.join(t, "kernel-hole")) and vol.replayed
    assert "/f1" in got and "/f12" not in got
    # a bad CRC far before the head: damage, not a torn write
    with open(crash, "r+b") as f:
        f.seek(log + recs[0] * 512 + 512 + 40)
        f.write(b"\xde\xad")
    with caplog.at_level("WARNING"):
        vol = DiskFiles(G.Bytes(crash), label="2026/11/25/030000/web/vda").volumes()[""]
    assert (vol.replayed, vol.unreplayed) == (False, True)
    assert _view(vol) == clean
    lines = [r.getMessage() for r in caplog.records if "(xfs)" in r.getMessage()]
    assert lines == [f"2026/11/25/030000/web/vda (xfs): cannot replay the log: the log record at block {recs[0]} "
                     "fails its CRC; shown as the disk holds it"]


def test_xfs_log_wrapping_its_end_is_replayed(tmp_path):
    """A log whose live part runs over its end back to its start (tail after head) replays as the kernel does."""
    from foundation.guestfs import DiskFiles

    if os.geteuid() != 0 or not G.have("mkfs.xfs", "xfs_io", "xfs_logprint", "unshare"):
        pytest.skip("needs root and xfsprogs")
    t = str(tmp_path)
    img = os.path.join(t, "xfs.img")
    # the smallest log mkfs allows, written round more than twice; where the tail lands depends on
    # when the kernel checkpoints, so try a few amounts of work until the live log wraps
    for n in (2600, 3500, 2900, 1900):
        G.blank(img, 64 * MIB)
        G.run(["mkfs.xfs", "-q", "-f", "-l", "size=1368b", img], env=G.SMALL_XFS)
        crash = os.path.join(t, f"crash-{n}.img")
        G.xfs_crashed(img, crash, f"mkdir $M/d; for r in 1 2 3 4 5 6; do i=0; while [ $i -lt {n} ]; do "
                                  "echo $r > $M/d/f-$r-$i; i=$((i+1)); done; rm -f $M/d/f-$((r-1))-*; done; "
                                  "xfs_io -c fsync $M/d/f-6-1")
        out = G.run(["xfs_logprint", "-t", crash])
        tail, head = (int(out.split(f"{w}: ")[1].split()[0]) for w in ("log tail", "head"))
        if tail > head:
            break
    assert tail > head, "no amount of work left the live log wrapped"
    vol = DiskFiles(G.Bytes(crash)).volumes()[""]
    assert vol.replayed
    got = _view(vol)
    assert got == _kernel_view(crash, os.path.join(t, "kernel")) and len(got) == n + 1


def _thin_disk(t, thins, data_mib, linear=()):
    """A GPT disk: ext4 /boot on p1, on p2 a PV with a thin pool (see G.lvm_thin_pv); returns
    (disk image, {thin LV: {virtual block: data block}}, byte offset of _tmeta in the disk)."""
    boot = os.path.join(t, "boot")
    T.write_tree(boot, {"vmlinuz": b"kernel"})
    G.ext4(os.path.join(t, "boot.img"), 8 * MIB, boot)
    pv = os.path.join(t, "pv.img")
    lv_mib = sum(-(-os.path.getsize(img) // MIB) for _, img in linear)
    maps, pe_start = G.lvm_thin_pv(pv, (4 + data_mib + lv_mib) * MIB, "tvg", "pool", thins, data_mib, linear=linear)
    disk = os.path.join(t, "vda.img")
    G.disk(disk, (16 + data_mib + lv_mib) * MIB, [(os.path.join(t, "boot.img"), G.GPT_LINUX), (pv, G.GPT_LVM)])
    return disk, maps, 9 * MIB + pe_start           # p2 starts after the 1 MiB gap and the 8 MiB /boot


def test_thin_pool_reads_as_thin_dump_maps(tmp_path):
    """Every block of a thin LV, through a pool btree of several levels, is what thin_dump maps:
    mapped blocks hold their data, unmapped ones read as zeros; a damaged node is an error."""
    if not (os.geteuid() == 0 and G.have("pvcreate", "losetup", "thin_restore", "thin_dump")):
        pytest.skip("needs root, lvm2 and thin-provisioning-tools")
    from foundation.guestfs import thin
    from foundation.guestfs.sources import Slice

    t = str(tmp_path)
    chunk = 64 << 10
    # 700 chunks, every 5th one empty: 560 mappings fill several btree leaves
    data = b"".join(bytes(chunk) if i % 5 == 3 else rnd(chunk, i) for i in range(700))
    img = os.path.join(t, "lv.img")
    with open(img, "wb") as f:
        f.write(data)
    disk, maps, tmeta = _thin_disk(t, [("lv", img, 48)], data_mib=40)
    src = G.Bytes(disk)
    pool = thin.Pool(Slice(src, tmeta, MIB), Slice(src, tmeta + MIB, 40 * MIB), chunk)
    lv = thin.ThinLv(pool, 1, 48 * MIB)
    got = {v: pool.lookup(lv.root, v) >> 24 for v in range(48 * MIB // chunk) if pool.lookup(lv.root, v) is not None}
    assert got == maps["lv"] and len(got) == 560
    assert len({n for n in pool.nodes}) > 3                      # a root and several leaves
    assert lv.read(0, lv.size) == data + bytes(48 * MIB - len(data))
    assert lv.read(3 * chunk - 5, 10) == data[3 * chunk - 5:3 * chunk + 5]     # across a mapped and a hole
    # a leaf with one byte changed: its reads fail, they never return other data
    leaf = next(n for n, (is_leaf, _, _) in pool.nodes.items() if is_leaf)
    with open(disk, "r+b") as f:
        f.seek(tmeta + leaf * 4096 + 100)
        f.write(b"\x55")
    pool = thin.Pool(Slice(G.Bytes(disk), tmeta, MIB), Slice(G.Bytes(disk), tmeta + MIB, 40 * MIB), chunk)
    with pytest.raises(thin.ThinError, match=f"thin pool metadata block {leaf} is damaged"):
        thin.ThinLv(pool, 1, 48 * MIB).read(0, lv.size)


def test_damaged_thin_pool_is_one_log_line(tmp_path, caplog):
    """A thin pool whose superblock is damaged: one line naming day, disk, partition, pool and
    reason; its thin LVs are left out, the linear LV and the other partition are shown."""
    if not (CAN_BUILD and G.have("thin_restore", "thin_dump")):
        pytest.skip("needs root, lvm2 and thin-provisioning-tools")
    from foundation.guestfs import DiskFiles

    t = str(tmp_path)
    src = os.path.join(t, "src")
    T.write_tree(src, {"a.txt": b"thin\n"})
    G.ext4(os.path.join(t, "root.img"), 8 * MIB, src)
    disk, _, tmeta = _thin_disk(t, [("root", os.path.join(t, "root.img"), 8),
                                    ("home", os.path.join(t, "root.img"), 8), ("ghost", None, 8)], data_mib=8,
                                linear=[("data", os.path.join(t, "root.img"))])
    df = DiskFiles(G.Bytes(disk))
    assert sorted(df.volumes()) == ["p1", "p2/tvg/data", "p2/tvg/home", "p2/tvg/root"]
    assert df.failed == {"p2/tvg/ghost": "thin device 3 is not in the pool's metadata"}     # its own line
    with open(disk, "r+b") as f:
        f.seek(tmeta + 200)
        f.write(b"\xff" * 8)
    caplog.clear()
    df = DiskFiles(G.Bytes(disk), label="2026/11/25/030000/vm/vda")
    with caplog.at_level("WARNING"):
        vols = df.volumes()
    assert sorted(vols) == ["p1", "p2/tvg/data"]
    e = vols["p2/tvg/data"]
    assert [x.name for x in e.list_dir(e.root().addr)] == [b"lost+found", b"a.txt"]
    lines = [r.getMessage() for r in caplog.records if "cannot read" in r.getMessage()]
    assert lines == ["cannot read 2026/11/25/030000/vm/vda/p2/tvg/pool (thin pool): thin pool superblock checksum "
                     "is wrong; the rest of the disk is shown"]


def test_failed_read_under_a_thin_pool(tmp_path, caplog):
    """A store read that fails in a thin pool's data fails that file's read, not its neighbour's;
    one that fails in its metadata is one log line for the pool, the rest of the disk shown."""
    if not (CAN_BUILD and G.have("thin_restore", "thin_dump")):
        pytest.skip("needs root, lvm2 and thin-provisioning-tools")
    from foundation.guestfs import DiskFiles

    t = str(tmp_path)
    src = os.path.join(t, "src")
    T.write_tree(src, {"a.bin": b"A" * 12 * MIB, "b.bin": b"B" * 200_000})
    G.ext4(os.path.join(t, "root.img"), 24 * MIB, src)
    disk, maps, tmeta = _thin_disk(t, [("root", os.path.join(t, "root.img"), 24)], data_mib=20)
    with open(os.path.join(t, "root.img"), "rb") as f:
        c = f.read().find(b"A" * 4096) // (64 << 10) + 96               # a pool chunk 6 MiB into a.bin
    s = G.Bytes(disk)
    df = DiskFiles(s, label="test/vda")
    vol = df.volumes()["p2/tvg/root"]
    names = {e.name: e for e in vol.list_dir(vol.root().addr)}
    bad = tmeta + MIB + maps["root"][c] * (64 << 10) + 100
    s.bad = (bad, bad + 1)
    df.bytes.cache.clear()                 # opening ext4 read the whole LV: as if long evicted
    _only_the_damaged_read_fails(vol, names)
    s.bad = (tmeta + 100, tmeta + 101)                   # the pool's superblock
    df = DiskFiles(s, label="2026/11/25/030000/vm/vda")
    with caplog.at_level("WARNING"):
        assert sorted(df.volumes()) == ["p1"]
    lines = [r.getMessage() for r in caplog.records if "cannot read" in r.getMessage()]
    assert lines == ["cannot read 2026/11/25/030000/vm/vda/p2/tvg/pool (thin pool): Archived data is damaged: "
                     "test damage at arena 3; the rest of the disk is shown"]


def test_dissect_is_imported_only_for_a_btrfs_volume(monkeypatch):
    # its import (~50 ms of CPU, 3 MB) was paid by every listing that probed a disk, btrfs or not
    import sys

    from foundation.guestfs import btrfs

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    p = subprocess.run([sys.executable, "-c", "import sys, foundation.guestfs, foundation.snapshotfs.changes; "
                        "print(any(m.startswith('dissect') for m in sys.modules))"],
                       capture_output=True, text=True, check=True, env={**os.environ, "PYTHONPATH": root})
    assert p.stdout.split() == ["False"], p.stderr
    monkeypatch.setattr(btrfs, "_dissect", lambda: None)   # the optional extra not installed
    with pytest.raises(RuntimeError, match="optional AGPL extra"):
        btrfs.BtrfsVolume(None, "p2", None)
