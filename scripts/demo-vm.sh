#!/usr/bin/env bash
# Foundation's main job on a real libvirt VM: a small VM (domain type qemu,
# no OS) with a raw and a qcow2 disk; between "nights" its disks are written
# through QEMU exactly as a guest would (HMP qemu-io); each night
# `foundation archive` snapshots it live, archives what changed and merges
# the day's overlay; one night it is shut off. At the end every night is
# restored from the store and compared byte for byte with what the guest
# had at that night's snapshot.
#
#   scripts/demo-vm.sh            # after scripts/setup.sh (scripts/demo.sh runs both)
#
# Everything lives in $DEMO_DIR (default /var/tmp/foundation-demo-vm), left
# in place for exploring; the demo VM is removed at the end. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."

DIR=${DEMO_DIR:-/var/tmp/foundation-demo-vm}
VM=foundation-demo
. scripts/venv.sh   # scripts/setup.sh's environment
if [ -x "$VENV/bin/foundation" ]; then FDN=("$VENV/bin/foundation"); elif command -v foundation >/dev/null 2>&1; then FDN=(foundation); else FDN=(python3 -m foundation); fi

say() { printf '\n== %s\n' "$*"; }

scripts/libvirt.sh

# A fresh start: an earlier demo's VM and files go.
if virsh -q dominfo "$VM" >/dev/null 2>&1; then
    virsh -q destroy "$VM" >/dev/null 2>&1 || true
    virsh -q undefine "$VM" >/dev/null
fi
rm -rf "$DIR"
mkdir -p "$DIR/disks" "$DIR/store" "$DIR/expected" "$DIR/restored"
chmod 755 "$DIR" "$DIR/disks"                       # QEMU runs as libvirt-qemu

say "a store (encrypted; the key stays outside it) and a config file"
"${FDN[@]}" --key-file "$DIR/demo.key" init "$DIR/store" --arena-size 1M --max-log-size 1G
cat > "$DIR/foundation.toml" <<EOF
store = "$DIR/store"
key_file = "$DIR/demo.key"
state_dir = "$DIR/state"
vms = ["$VM"]
EOF
cat "$DIR/foundation.toml"
export FOUNDATION_CONFIG="$DIR/foundation.toml"

say "a small VM under libvirt: $VM, vda raw 64 MiB + vdb qcow2 64 MiB, no OS"
qemu-img create -q -f raw "$DIR/disks/vda.raw" 64M
qemu-img create -q -f qcow2 "$DIR/disks/vdb.qcow2" 64M
cat > "$DIR/$VM.xml" <<EOF
<domain type='qemu'>
  <name>$VM</name>
  <memory unit='MiB'>64</memory>
  <vcpu>1</vcpu>
  <os><type arch='x86_64'>hvm</type></os>
  <devices>
    <disk type='file' device='disk'>
      <driver name='qemu' type='raw'/><source file='$DIR/disks/vda.raw'/>
      <target dev='vda' bus='virtio'/><alias name='ua-vda'/>
    </disk>
    <disk type='file' device='disk'>
      <driver name='qemu' type='qcow2'/><source file='$DIR/disks/vdb.qcow2'/>
      <target dev='vdb' bus='virtio'/><alias name='ua-vdb'/>
    </disk>
    <memballoon model='none'/>
  </devices>
</domain>
EOF
virsh -q define "$DIR/$VM.xml" >/dev/null
virsh -q start "$VM" >/dev/null

top() { virsh -q domblklist "$VM" | awk -v t="$1" '$1 == t {print $2}'; }

# The guest writes PATTERN at OFFSET, LENGTH bytes, into disk TARGET.
write() {
    local target=$1 pattern=$2 off=$3 len=$4
    if virsh -q domstate "$VM" | grep -q running; then
        virsh -q qemu-monitor-command "$VM" --hmp \
            "qemu-io -d /machine/peripheral/ua-$target/virtio-backend \"write -P $pattern $off $len\"" >/dev/null
    else
        qemu-io -f qcow2 -c "write -P $pattern $off $len" "$(top "$target")" >/dev/null
    fi
    echo "  guest writes $len bytes of $pattern at $off on $target"
}

# What the guest has now, read through its whole chain: the expected archive.
# (A running QEMU caches qcow2 metadata: flush it before reading with -U.)
expect() {
    for t in vda vdb; do
        if virsh -q domstate "$VM" | grep -q running; then
            virsh -q qemu-monitor-command "$VM" --hmp \
                "qemu-io -d /machine/peripheral/ua-$t/virtio-backend flush" >/dev/null
        fi
        qemu-img convert -U -O raw "$(top "$t")" "$DIR/expected/night$1-$t.raw"
    done
}

night() {
    say "night $1: foundation archive"
    "${FDN[@]}" archive
    expect "$1"
}

say "day 1"
write vda 0xab 0 1M
write vdb 0xcd 8M 4M
night 1

say "day 2"
write vda 0x11 512K 4k
write vdb 0x22 20M 1M
night 2

say "day 3: the VM is shut off and edited offline"
virsh -q destroy "$VM" >/dev/null
write vdb 0x33 40M 64k
night 3

say "day 4: started again"
virsh -q start "$VM" >/dev/null
write vda 0x44 32M 2M
night 4

say "foundation status"
"${FDN[@]}" status

say "foundation list"
"${FDN[@]}" list "$VM"

say "restore every night and compare with what the guest had"
n=0
for t in $("${FDN[@]}" list --json "$VM" | python3 -c 'import json,sys; print(*[s["time"] for s in json.load(sys.stdin)])'); do
    n=$((n + 1))
    for d in vda vdb; do
        out="$DIR/restored/night$n-$d.raw"
        "${FDN[@]}" restore "$VM@$t" "$out" --disk "$d" --force
        cmp "$out" "$DIR/expected/night$n-$d.raw"
    done
    echo "  night $n ($t): vda and vdb restored, identical to the guest's disks at the snapshot"
done
[ "$n" = 4 ] || { echo "expected 4 nights, found $n" >&2; exit 1; }

say "the VM's chain after the last night: base <- one overlay"
for d in vda vdb; do qemu-img info -U --backing-chain "$(top "$d")" | grep '^image:'; done

virsh -q destroy "$VM" >/dev/null 2>&1 || true
virsh -q undefine "$VM" >/dev/null
say "demo done: store, config and restored images are in $DIR"
