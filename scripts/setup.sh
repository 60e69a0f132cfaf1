#!/usr/bin/env bash
# Set up everything Foundation needs on a fresh Debian 12 machine, as root:
# the Debian packages (compiler headers for the C core, QEMU, libvirt, FUSE,
# file-system tools for the tests, mmdebstrap and OVMF for the Debian guest
# lab of tests/lab/), the Python package with its C core
# built by cffi, the replica test servers (scripts/servers.sh install: pyftpdlib, vsftpd,
# and MinIO built with Go once into /var/cache/foundation) and a running
# libvirtd. Idempotent; safe to run again.
#
# The package goes into a virtual environment of its own (FOUNDATION_VENV, default
# /opt/foundation), made from $PYTHON (default python3), with /usr/local/bin/foundation
# linked to its command: Debian 12's Python refuses packages installed beside its own
# (PEP 668), and a daemon that starts every night should not run the start-up hooks
# (.pth files) other packages leave in the system's site-packages (docs/operation.md).
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "setup.sh: $*" >&2; }

if [ "$(id -u)" != 0 ]; then
    say "run as root (sudo $0): it installs Debian packages and starts libvirtd"
    exit 1
fi

# (python3-venv, -dev, -pip: the package's own environment and its C extensions; g++: pytsk3
# builds The Sleuth Kit from source where pip finds no wheel)
PKGS=(gcc g++ make pkg-config libssl-dev libzstd-dev python3-dev python3-venv python3-pip
      qemu-utils qemu-system-x86 libvirt-daemon-system libvirt-daemon-driver-qemu libvirt-clients libvirt-dev
      fuse3 libfuse3-dev e2fsprogs dosfstools mtools fdisk parted ntfs-3g
      dbus-daemon man-db
      xfsprogs lvm2 thin-provisioning-tools btrfs-progs cryptsetup-bin exfatprogs exfat-fuse util-linux util-linux-extra   # guest file systems, fincore (tests)
      mmdebstrap ovmf)                  # the Debian guest lab (tests/lab/build.py)
missing=()
for p in "${PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    say "installing Debian packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

. scripts/venv.sh
PY=$(base_python)
# zstd 1.5.7 writes the same records as Debian 12's 1.5.4 for ~15 % less CPU a block: built
# once from its PyPI source into a cache; if that fails the system's libzstd serves (same bytes).
# FOUNDATION_ZSTD=system keeps the system's; FOUNDATION_ZSTD=DIR names a built one.
if [ -z "${FOUNDATION_ZSTD:-}" ]; then
    say "building zstd 1.5.7 for the C core (once; cached in ${FOUNDATION_CACHE:-/var/cache/foundation})"
    if FOUNDATION_ZSTD=$(PYTHON=$PY scripts/zstd.sh); then
        export FOUNDATION_ZSTD
    else
        say "zstd 1.5.7 could not be built (see above); the C core links the system's libzstd"
        unset FOUNDATION_ZSTD
    fi
elif [ "$FOUNDATION_ZSTD" = system ]; then
    unset FOUNDATION_ZSTD
else
    export FOUNDATION_ZSTD
fi
# An environment made from another interpreter (an older setup, or another $PYTHON) is made again:
# the one named above is the one the nightly job runs on.
want=$($PY -c 'import os, sys; print(os.path.realpath(sys.executable))') || { say "$PY does not run"; exit 1; }
if [ -f "$VENV/pyvenv.cfg" ] && [ -x "$VENV/bin/python" ]; then
    have=$(realpath "$VENV/bin/python")
    if [ "$have" != "$want" ]; then
        say "making $VENV again from $want (it was made from $have)"
        rm -rf "$VENV"
    fi
fi
if [ ! -x "$VENV/bin/python" ]; then
    say "making the virtual environment $VENV ($($PY --version))"
    $PY -m venv "$VENV" || { say "$PY -m venv failed (Debian: apt-get install python3-venv)"; exit 1; }
fi
say "installing the foundation package and its C core into $VENV ($($VPY --version))"
export PIP_ROOT_USER_ACTION=ignore
# editable_mode=compat: the checkout is named by a plain path in a .pth file, which costs the
# interpreter's start nothing (the default mode imports a finder module at every start)
$VPY -m pip install -q --disable-pip-version-check -e ".[vm,fuse,replica,test,man]" \
    --config-settings editable_mode=compat || { say "pip install failed (see above)"; exit 1; }
$VPY -c "from foundation import native; assert native.backend == 'native', native.backend" || {
    say "the C core did not build; see the pip output above"; exit 1; }
ln -sfn "$VENV/bin/foundation" /usr/local/bin/foundation

say "installing the man page and the bash completion"
mkdir -p /usr/local/share/man/man1 /usr/local/share/bash-completion/completions
$VPY -m foundation.cli.manpage /usr/local/share/man/man1/foundation.1
$VPY -m foundation completion > /usr/local/share/bash-completion/completions/foundation

say "installing the replica test servers (FTP, FTPS, MinIO; the first MinIO build takes about 6 minutes)"
PYTHON=$VPY scripts/servers.sh install || { say "the replica test servers could not be installed (see above)"; exit 1; }

if [ -x scripts/libvirt.sh ]; then
    scripts/libvirt.sh || say "warning: libvirtd did not start; VM tests will be skipped"
fi
say "ready"
