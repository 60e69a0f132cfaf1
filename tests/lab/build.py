#!/usr/bin/env python3
"""Build the lab's Debian 12 guest disks once, cached under a key made of everything that shapes them.

`python3 tests/lab/build.py` (root) prints the cache directory. The key is
a hash of the package list, this file and the workload, so an unchanged
recipe is never built twice (on CI, once per fresh machine, about 1.5-3
minutes); a finished build is marked by `done` and never modified (guests
run on qcow2 overlays over these files). Nothing needs a loop device:
mmdebstrap builds the root tree, `mkfs.ext4 -d` turns it into a file
system, mkfs.vfat + mtools make the ESP, mkswap the swap area, and the
three are written at their offsets in a GPT disk laid out with sfdisk.

    <cache>/disk.raw     GPT, 2 GiB: p1 ESP (systemd-boot, kernel, initrd),
                         p2 ext4 root, p3 swap
    <cache>/data.raw     512 MiB XFS, mounted by the guest at /data (nofail)
    <cache>/vmlinuz, initrd.img    for direct kernel boot (the BIOS variant)
    <cache>/lab.json     UUIDs, partition offsets, the kernel command line

The guest: Debian 12 (bookworm) from the host's apt sources, qemu-guest-agent
(started by udev when its channel appears; its freeze hook refuses while
/run/lab-fail-freeze exists), python3 for the workload service
(workload.py, started at boot), no network, periodic timers masked so
that a TCG guest spends its time on the workload.
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
CACHE = os.environ.get("FOUNDATION_LAB_CACHE", "/var/cache/foundation/lab")
SUITE = "bookworm"
PACKAGES = ["linux-image-amd64", "systemd-sysv", "qemu-guest-agent", "dbus", "udev", "python3",
            "systemd-boot-efi", "xfsprogs", "e2fsprogs"]
MASKED = ["apt-daily.timer", "apt-daily-upgrade.timer", "e2scrub_all.timer", "e2scrub_reap.service",
          "fstrim.timer", "man-db.timer", "dpkg-db-backup.timer", "systemd-tmpfiles-clean.timer"]
# A small initrd (the default takes every module: 35 MB to unpack under TCG): what a virtio ext4 root needs.
INITRD_MODULES = ["virtio_pci", "virtio_blk", "ext4", "crc32c_generic"]
MiB = 1 << 20
ESP_SIZE, ROOT_SIZE, SWAP_SIZE = 64 * MiB, 1536 * MiB, 128 * MiB
DISK_SIZE = 2048 * MiB
DATA_SIZE = 512 * MiB
ESP_TYPE = "C12A7328-F81F-11D2-BA4B-00A0C93EC93B"
LINUX_TYPE = "0FC63DAF-8483-4772-8E79-3D69D8477DE4"
SWAP_TYPE = "0657FD6D-A4AB-43C4-84E5-0933C84B4F4F"
NEEDS = {"mmdebstrap": "mmdebstrap", "mkfs.ext4": "e2fsprogs", "mkfs.vfat": "dosfstools", "mcopy": "mtools",
         "mkswap": "util-linux", "sfdisk": "fdisk", "mkfs.xfs": "xfsprogs"}


class BuildFailed(Exception):
    pass


def key():
    """The cache key: what the image is made of."""
    h = hashlib.sha256()
    h.update(" ".join([SUITE, *PACKAGES]).encode())
    for name in ("build.py", "workload.py"):
        with open(os.path.join(HERE, name), "rb") as f:
            h.update(f.read())
    return h.hexdigest()[:16]


def image(log=print):
    """The cache directory of the current recipe, built if missing; -> dict of lab.json plus `dir`."""
    d = os.path.join(CACHE, key())
    if not os.path.exists(os.path.join(d, "done")):
        _build(d, log)
    with open(os.path.join(d, "lab.json")) as f:
        info = json.load(f)
    info["dir"] = d
    return info


def _run(*argv, **kw):
    p = subprocess.run(argv, capture_output=True, text=True, **kw)
    if p.returncode != 0:
        raise BuildFailed(f"{' '.join(map(str, argv[:3]))}... failed ({p.returncode}): "
                          f"{(p.stderr or p.stdout).strip()[-2000:]}")
    return p.stdout


def _sources():
    """The host's apt sources for Debian (a file mmdebstrap pastes into the guest), or its default mirror."""
    for p in ("/etc/apt/sources.list.d/debian.sources", "/etc/apt/sources.list"):
        try:
            with open(p) as f:
                if SUITE in f.read():
                    return [p]
        except OSError:
            pass
    return []


def _build(d, log):
    missing = [pkg for tool, pkg in NEEDS.items() if not shutil.which(tool) and not os.path.exists(f"/sbin/{tool}")]
    if missing:
        raise BuildFailed(f"missing tools; run scripts/setup.sh (apt-get install {' '.join(sorted(set(missing)))})")
    os.makedirs(CACHE, exist_ok=True)
    for p in (os.path.dirname(CACHE), CACHE):
        os.chmod(p, 0o755)                     # libvirt's QEMU reads the disks as backing files
    work = f"{d}.tmp{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    root = os.path.join(work, "root")
    ids = {k: str(uuid.uuid5(uuid.NAMESPACE_URL, f"foundation-lab:{key()}:{k}")) for k in ("root", "swap", "data")}
    esp_id = hashlib.sha256(key().encode()).hexdigest()[:8].upper()
    cmdline = f"root=UUID={ids['root']} rw console=ttyS0 quiet"
    log(f"lab: building the Debian guest in {d} (mmdebstrap, 1-3 minutes)")
    initramfs = ('mkdir -p "$1/etc/initramfs-tools/conf.d" && echo MODULES=list > "$1/etc/initramfs-tools/conf.d/lab"'
                 f' && printf "%s\\n" {" ".join(INITRD_MODULES)} > "$1/etc/initramfs-tools/modules"')
    _run("mmdebstrap", "--variant=apt", f"--include={','.join(PACKAGES)}", f"--setup-hook={initramfs}",
         SUITE, root, *_sources(),
         env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"), timeout=1800)
    _configure(root, ids, cmdline)
    kernel = sorted(f for f in os.listdir(os.path.join(root, "boot")) if f.startswith("vmlinuz-"))[-1]
    version = kernel[len("vmlinuz-"):]
    for src, dst in ((f"boot/vmlinuz-{version}", "vmlinuz"), (f"boot/initrd.img-{version}", "initrd.img")):
        shutil.copyfile(os.path.join(root, src), os.path.join(work, dst))
    # the three file systems, each in a file of its own
    esp, rootfs, swap = (os.path.join(work, n) for n in ("esp.img", "root.img", "swap.img"))
    _run("mkfs.vfat", "-C", "-i", esp_id, "-n", "ESP", esp, str(ESP_SIZE // 1024))
    boot = os.path.join(work, "espfiles")
    os.makedirs(os.path.join(boot, "loader", "entries"))
    os.makedirs(os.path.join(boot, "EFI", "BOOT"))
    shutil.copyfile(os.path.join(root, "usr/lib/systemd/boot/efi/systemd-bootx64.efi"),
                    os.path.join(boot, "EFI", "BOOT", "BOOTX64.EFI"))
    shutil.copyfile(os.path.join(work, "vmlinuz"), os.path.join(boot, "vmlinuz"))
    shutil.copyfile(os.path.join(work, "initrd.img"), os.path.join(boot, "initrd.img"))
    _write(os.path.join(boot, "loader", "loader.conf"), "default debian.conf\ntimeout 0\n")
    _write(os.path.join(boot, "loader", "entries", "debian.conf"),
           f"title Debian 12 (lab)\nlinux /vmlinuz\ninitrd /initrd.img\noptions {cmdline}\n")
    _run("mcopy", "-s", "-i", esp, *[os.path.join(boot, n) for n in sorted(os.listdir(boot))], "::/")
    _run("mkfs.ext4", "-q", "-F", "-L", "root", "-U", ids["root"], "-d", root, rootfs, f"{ROOT_SIZE // MiB}M")
    with open(swap, "wb") as f:
        f.truncate(SWAP_SIZE)
    _run("mkswap", "-U", ids["swap"], "-L", "swap", swap)
    # the GPT disk, and each file system written at its partition's offset
    disk = os.path.join(work, "disk.raw")
    with open(disk, "wb") as f:
        f.truncate(DISK_SIZE)
    parts = [(esp, ESP_TYPE, "esp"), (rootfs, LINUX_TYPE, "root"), (swap, SWAP_TYPE, "swap")]
    script, start = ["label: gpt"], MiB
    offsets = {}
    for path, typ, name in parts:
        size = os.path.getsize(path)
        script.append(f"start={start // 512}, size={size // 512}, type={typ}, name={name}")
        offsets[name] = {"offset": start, "size": size}
        start += size
    _run("sfdisk", "-q", disk, input="\n".join(script) + "\n")
    for path, _, name in parts:
        _run("dd", f"if={path}", f"of={disk}", "bs=1M", f"seek={offsets[name]['offset'] // MiB}",
             "conv=notrunc,sparse", "status=none")
        os.unlink(path)
    data = os.path.join(work, "data.raw")
    with open(data, "wb") as f:
        f.truncate(DATA_SIZE)
    _run("mkfs.xfs", "-q", "-L", "data", "-m", f"uuid={ids['data']}", data)
    shutil.rmtree(root)
    shutil.rmtree(boot)
    info = {"key": key(), "uuids": ids, "partitions": offsets, "cmdline": cmdline, "kernel": version,
            "disk_size": DISK_SIZE, "data_size": DATA_SIZE}
    _write(os.path.join(work, "lab.json"), json.dumps(info, indent=1) + "\n")
    for n in os.listdir(work):
        os.chmod(os.path.join(work, n), 0o444)
    os.chmod(work, 0o755)
    _write(os.path.join(work, "done"), "")
    shutil.rmtree(d, ignore_errors=True)
    os.rename(work, d)
    for old in os.listdir(CACHE):          # earlier recipes' images (a build in progress has no `done`)
        if old != key() and os.path.exists(os.path.join(CACHE, old, "done")):
            shutil.rmtree(os.path.join(CACHE, old), ignore_errors=True)
    log(f"lab: built {d}")


def _write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def _configure(root, ids, cmdline):
    """The guest's own files: fstab, hostname, the workload service, masked timers."""
    def put(rel, text, mode=0o644):
        p = os.path.join(root, rel.lstrip("/"))
        _write(p, text)
        os.chmod(p, mode)

    put("/etc/fstab", f"UUID={ids['root']} / ext4 rw,errors=remount-ro 0 1\n"
                      f"UUID={ids['swap']} none swap sw,nofail 0 0\n"
                      f"UUID={ids['data']} /data xfs nofail,x-systemd.device-timeout=10min 0 0\n")
    put("/etc/hostname", "lab\n")
    put("/etc/hosts", "127.0.0.1 localhost\n127.0.1.1 lab\n")
    os.makedirs(os.path.join(root, "data"), exist_ok=True)
    with open(os.path.join(HERE, "workload.py")) as f:
        put("/usr/local/bin/lab-workload", f.read(), 0o755)
    # qemu-ga runs this before freezing: a freeze fails while /run/lab-fail-freeze exists (tests make it so)
    put("/etc/qemu/qemu-ga.conf", "[general]\nfsfreeze-hook=/usr/local/sbin/lab-fsfreeze-hook\n")
    put("/usr/local/sbin/lab-fsfreeze-hook",
        '#!/bin/sh\n[ "$1" = freeze ] && [ -e /run/lab-fail-freeze ] && echo "lab: freeze refused" >&2 && exit 1\n'
        "exit 0\n", 0o755)
    put("/etc/systemd/system/lab-workload.service",
        "[Unit]\nDescription=Foundation lab workload (files and SQLite, logged once durable)\n"
        "After=local-fs.target data.mount\n\n[Service]\nExecStart=/usr/local/bin/lab-workload\nRestart=always\n"
        "RestartSec=1\n\n[Install]\nWantedBy=multi-user.target\n")
    wants = os.path.join(root, "etc/systemd/system/multi-user.target.wants")
    os.makedirs(wants, exist_ok=True)
    os.symlink("/etc/systemd/system/lab-workload.service", os.path.join(wants, "lab-workload.service"))
    for unit in MASKED:
        p = os.path.join(root, "etc/systemd/system", unit)
        if not os.path.lexists(p):
            os.symlink("/dev/null", p)
    # the kernel command line, for a reader of the image
    put("/etc/kernel/cmdline", cmdline + "\n")


if __name__ == "__main__":
    try:
        print(image(log=lambda m: print(m, file=sys.stderr))["dir"])
    except BuildFailed as e:
        print(f"lab: {e}", file=sys.stderr)
        sys.exit(1)
