"""Lab guests in libvirt: define a BIOS or UEFI Debian guest over the cached image, talk to its agent.

Each guest runs on its own qcow2 overlays over the cached, read-only
disks (build.py), so the cache is never written and a second guest from
the same base costs only its own writes. Domain type `qemu` (TCG) always:
on these machines a Linux guest dies under KVM (../shared/FACTS.md);
256 MiB of RAM and a 64 MiB translation cache keep a guest near 350 MB of
host memory, so two run at once. The BIOS variant boots the kernel
directly (kernel and initrd from the cache), the UEFI one boots OVMF ->
systemd-boot on the disk's ESP with an NVRAM file of its own.
"""

import base64
import json
import os
import subprocess
import time

OVMF_CODE = "/usr/share/OVMF/OVMF_CODE_4M.fd"
OVMF_VARS = "/usr/share/OVMF/OVMF_VARS_4M.fd"
AGENT = "org.qemu.guest_agent.0"


def domain_xml(name, lab, vm_dir, firmware):
    """The domain of a lab guest whose overlays live in vm_dir (`bios` or `uefi`)."""
    c = lab["dir"]
    if firmware == "bios":
        os_xml = (f"<kernel>{c}/vmlinuz</kernel><initrd>{c}/initrd.img</initrd>"
                  f"<cmdline>{lab['cmdline']}</cmdline>")
    else:
        os_xml = (f"<loader readonly='yes' type='pflash'>{OVMF_CODE}</loader>"
                  f"<nvram template='{OVMF_VARS}'>{vm_dir}/VARS.fd</nvram>")
    disks = "".join(
        f"<disk type='file' device='disk'><driver name='qemu' type='qcow2'/>"
        f"<source file='{vm_dir}/{t}.qcow2'/><target dev='{t}' bus='virtio'/></disk>" for t in ("vda", "vdb"))
    return (f"<domain type='qemu'><name>{name}</name><memory unit='MiB'>256</memory><vcpu>1</vcpu>"
            f"<os><type arch='x86_64'>hvm</type>{os_xml}</os>"
            f"<features><acpi/><tcg><tb-cache unit='MiB'>64</tb-cache></tcg></features>"
            f"<on_reboot>restart</on_reboot><devices>{disks}"
            f"<serial type='file'><source path='{vm_dir}/serial.log'/><target port='0'/></serial>"
            f"<channel type='unix'><target type='virtio' name='{AGENT}'/></channel>"
            f"<rng model='virtio'><backend model='random'>/dev/urandom</backend></rng>"
            f"<memballoon model='none'/></devices></domain>")


def make_disks(lab, vm_dir):
    """vda.qcow2 and vdb.qcow2 in vm_dir over the cached disk.raw and data.raw."""
    for t, base in (("vda", "disk.raw"), ("vdb", "data.raw")):
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b",
                        os.path.join(lab["dir"], base), os.path.join(vm_dir, f"{t}.qcow2")], check=True)


def define(conn, name, lab, vm_dir, firmware):
    os.makedirs(vm_dir, exist_ok=True)
    os.chmod(vm_dir, 0o755)
    make_disks(lab, vm_dir)
    return conn.defineXML(domain_xml(name, lab, vm_dir, firmware))


class AgentError(Exception):
    pass


def agent(dom, command, args=None, timeout=10):
    """One guest agent command; -> its "return" value."""
    import libvirt
    import libvirt_qemu

    cmd = {"execute": command, **({"arguments": args} if args else {})}
    try:
        return json.loads(libvirt_qemu.qemuAgentCommand(dom, json.dumps(cmd), timeout, 0)).get("return")
    except libvirt.libvirtError as e:
        raise AgentError(e.get_error_message()) from None


def run(dom, *argv, timeout=120, check=True):
    """Run a command in the guest; -> (exit status, stdout text)."""
    pid = agent(dom, "guest-exec", {"path": argv[0], "arg": list(argv[1:]), "capture-output": True})["pid"]
    deadline = time.monotonic() + timeout
    while True:
        st = agent(dom, "guest-exec-status", {"pid": pid})
        if st.get("exited"):
            break
        if time.monotonic() > deadline:
            raise AgentError(f"{argv} still running after {timeout} s")
        time.sleep(0.2)
    out = base64.b64decode(st.get("out-data", "")).decode(errors="replace")
    err = base64.b64decode(st.get("err-data", "")).decode(errors="replace")
    if check and st.get("exitcode") != 0:
        raise AgentError(f"{argv} exited {st.get('exitcode')}: {err.strip() or out.strip()}")
    return st.get("exitcode"), out


def wait_agent(dom, timeout=600):
    """Seconds until the guest agent answers a ping (raises AgentError after `timeout`)."""
    t0 = time.monotonic()
    while True:
        try:
            agent(dom, "guest-ping", timeout=2)
            return time.monotonic() - t0
        except AgentError as e:
            if time.monotonic() - t0 > timeout:
                raise AgentError(f"{dom.name()}: no answer from the guest agent after {timeout} s: {e}") from None
            time.sleep(0.5)


def wait_workload(dom, timeout=600):
    """Wait until the workload has committed a file to the data disk (so /data is mounted)."""
    deadline = time.monotonic() + timeout
    wait_agent(dom, timeout)
    while True:
        rc, _ = run(dom, "/bin/grep", "-q", "^file /data/", "/var/lib/lab/committed.log", check=False)
        if rc == 0:
            return
        if time.monotonic() > deadline:
            raise AgentError(f"{dom.name()}: the workload wrote nothing to /data after {timeout} s: "
                             + run(dom, "/bin/systemctl", "status", "data.mount", "lab-workload", check=False)[1])
        time.sleep(1)


def read_file(dom, path):
    return run(dom, "/bin/cat", path)[1]


def shutdown(dom, timeout=180):
    """A clean shutdown through the agent; destroyed if it takes longer than `timeout`."""
    import libvirt

    if not dom.isActive():
        return
    try:
        agent(dom, "guest-shutdown", {"mode": "powerdown"}, timeout=5)
    except AgentError:
        pass                                  # the agent goes down with the guest and may not answer
    deadline = time.monotonic() + timeout
    while dom.isActive() and time.monotonic() < deadline:
        time.sleep(0.5)
    try:
        if dom.isActive():
            dom.destroy()
    except libvirt.libvirtError:
        pass


def main():
    """`python3 tests/lab/guest.py NAME bios|uefi [--start]`: a lab guest to try things by hand."""
    import argparse
    import sys

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import libvirt

    from lab import build

    ap = argparse.ArgumentParser(description="Define a lab guest in qemu:///system over the cached Debian image.")
    ap.add_argument("name")
    ap.add_argument("firmware", choices=("bios", "uefi"))
    ap.add_argument("--dir", help="where its overlays go (default /var/lib/libvirt/images/NAME)")
    ap.add_argument("--start", action="store_true", help="start it and wait for the guest agent")
    a = ap.parse_args()
    conn = libvirt.open("qemu:///system")
    dom = define(conn, a.name, build.image(log=lambda m: print(m, file=sys.stderr)),
                 a.dir or f"/var/lib/libvirt/images/{a.name}", a.firmware)
    print(f"defined {a.name} ({a.firmware}); the guest agent: virsh qemu-agent-command {a.name} "
          "'{\"execute\":\"guest-ping\"}'")
    if a.start:
        dom.create()
        print(f"the guest agent answered after {wait_agent(dom):.0f} s")


if __name__ == "__main__":
    main()
