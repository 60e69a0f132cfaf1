#!/usr/bin/env bash
# Start libvirtd and QEMU for Foundation's VM archiver, its tests and demo.
#
# Idempotent: installs the Debian packages only if missing, makes /dev/kvm
# group-accessible (while it is root-only libvirtd re-probes QEMU on every
# lookup and each `virsh define` takes ~36 s), starts virtlogd and libvirtd
# without systemd when they are not running, and waits until
# `virsh -c qemu:///system version` answers. Safe to run from CI, from the
# README's commands and from the test fixtures; exits non-zero with a clear
# message if libvirtd cannot be brought up.
#
#   scripts/libvirt.sh            # install if needed, start, wait
#   scripts/libvirt.sh --check    # only report whether libvirtd answers
set -u

URI=${LIBVIRT_DEFAULT_URI:-qemu:///system}
WAIT=${FOUNDATION_LIBVIRT_WAIT:-90}

say() { echo "libvirt.sh: $*" >&2; }

answers() { timeout 20 virsh -c "$URI" version >/dev/null 2>&1; }

if [ "${1:-}" = "--check" ]; then
    if answers; then say "libvirtd answers on $URI"; exit 0; fi
    say "libvirtd does not answer on $URI"; exit 1
fi

if [ "$(id -u)" != 0 ]; then
    if answers; then exit 0; fi
    say "libvirtd is not running and only root can start it: run 'sudo $0'"
    exit 1
fi

# 1. Packages (only when something is missing).
need=()
command -v libvirtd >/dev/null 2>&1 || [ -x /usr/sbin/libvirtd ] || need+=(libvirt-daemon-system libvirt-daemon-driver-qemu)
command -v virsh >/dev/null 2>&1 || need+=(libvirt-clients)
command -v qemu-system-x86_64 >/dev/null 2>&1 || need+=(qemu-system-x86)
command -v qemu-img >/dev/null 2>&1 || need+=(qemu-utils)
if [ ${#need[@]} -gt 0 ]; then
    say "installing ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null && \
        apt-get install -y -qq --no-install-recommends "${need[@]}" libvirt-dev pkg-config >/dev/null || {
        say "apt-get install ${need[*]} failed"; exit 1; }
fi

# 2. /dev/kvm group-accessible (harmless when there is no /dev/kvm: TCG).
if [ -e /dev/kvm ]; then
    getent group kvm >/dev/null || groupadd -r kvm
    chgrp kvm /dev/kvm && chmod 660 /dev/kvm || say "warning: could not make /dev/kvm group-accessible"
fi

# 3. Daemons, without systemd (under systemd, use the units if present).
if answers; then exit 0; fi
if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
    systemctl start virtlogd.socket libvirtd.service >/dev/null 2>&1 || true
fi
mkdir -p /run/libvirt /var/log/libvirt/qemu
pgrep -x virtlogd >/dev/null || /usr/sbin/virtlogd -d || say "warning: virtlogd did not start"
pgrep -x libvirtd >/dev/null || /usr/sbin/libvirtd -d || { say "libvirtd did not start"; exit 1; }

# 4. Wait for the first answer (the first one probes QEMU: ~10 s).
start=$(date +%s)
until answers; do
    if [ $(( $(date +%s) - start )) -ge "$WAIT" ]; then
        say "libvirtd started but does not answer on $URI after ${WAIT}s; see /var/log/libvirt/"
        exit 1
    fi
    sleep 1
done
say "libvirtd answers on $URI ($(( $(date +%s) - start ))s)"
