"""QEMU's image tool, for what libvirt does not do: probes, maps, overlays, offline commits, conversions.

Every `qemu-img` Foundation runs goes through `run` here (one way to call
it, one error, QemuImgFailed, that callers may name in their own terms).

`qemu-img map` of one layer opened with `"backing": null` lists exactly
the clusters that layer holds (the writes of one day); everything else
about images (headers, backing chains, commits while the VM is shut off)
goes through `qemu-img` too. The one exception is the two maps a night
needs (`layer_map`, `chain_map`): plain qcow2 chains are read from their
own tables (image/qcow2.py, no process start), anything else still asks
`qemu-img`. The layer being archived is opened *without* `-U`: QEMU's
image locking then refuses us if anything still writes it (qcow2.py
applies the same locks), so a layer that is not really frozen is never
archived.
"""

import json
import os

from foundation.errors import Error
from foundation.image import qcow2


class QemuImgFailed(Error):
    """qemu-img {} failed: {}"""

    code = 60


class LayerBusy(QemuImgFailed):
    """Image {} is still open for writing by another process (Failed to get shared "write" lock). Is another process using the image? A layer still written is never archived."""

    status, stdout = 1, ""   # as a failed `qemu-img map` without -U would leave them


def run(args, what, ok=(0,)):
    """stdout of `qemu-img ARGS`; QemuImgFailed("what", its last error line) if its exit status is not
    in `ok`, with .status (None: qemu-img is missing) and .stdout for a caller that reads its report."""
    return Started(args, what, ok).result()


class Started:
    """`qemu-img ARGS` started and not waited for: the caller works meanwhile (a probe costs a
    process start, 10-20 ms warm and 50 ms or more cold) and asks for result() when it needs it;
    close() ends it if it never does."""

    def __init__(self, args, what, ok=(0,)):
        import subprocess  # here: a night of plain qcow2 layers starts no process and need not import it

        self.what, self.ok = what, ok
        try:
            self.p = subprocess.Popen(["qemu-img", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      stdin=subprocess.DEVNULL, text=True)
        except FileNotFoundError:
            self.p = None

    def result(self):
        """What run() returns, or raises."""
        if self.p is None:
            e = QemuImgFailed(self.what, "qemu-img is not installed (apt-get install qemu-utils)")
            e.status, e.stdout = None, ""
            raise e
        with self.p as p:
            out, err = p.communicate()
        if p.returncode not in self.ok:
            lines = (err or out).strip().splitlines()
            e = QemuImgFailed(self.what, lines[-1] if lines else f"exit status {p.returncode}")
            e.status, e.stdout = p.returncode, out
            raise e
        return out

    def close(self):
        if self.p is not None and self.p.returncode is None:
            self.p.kill()
            self.p.communicate()


def run_json(args, what):
    """`qemu-img ARGS --output=json`'s answer, parsed."""
    out = run(args, what)
    try:
        return json.loads(out)
    except json.JSONDecodeError:
        raise QemuImgFailed(what, "qemu-img printed something that is not JSON") from None


def info(path, fmt=None, share=True):
    """`qemu-img info` of one image as a dict (virtual-size, format, backing...)."""
    args = ["info", "--output=json"]
    if share:
        args.append("-U")
    if fmt:
        args += ["-f", fmt]
    return run_json(args + [path], f"info {path}")


def chain(path, share=True):
    """`qemu-img info --backing-chain`: the image and every backing file, top first."""
    args = ["info", "--backing-chain", "--output=json"]
    if share:
        args.append("-U")
    return run_json(args + [path], f"info --backing-chain {path}")


def backing_of(path):
    """The absolute backing file named in a qcow2 header, or None."""
    i = info(path, "qcow2")
    return i.get("full-backing-filename") or i.get("backing-filename")


def layer_map(path, share=False):
    """Extents of one qcow2 layer alone: list of (start, length, offset | None, zero).

    Only clusters allocated in this very file are listed (what the guest
    wrote while it was the top of the chain). `offset` is the host offset of
    the data in the file; `zero` marks clusters that read as zeros. Without
    `share`, fails if a process (QEMU) has the file open for writing.
    A plain qcow2 file is read directly (qcow2.py), else `qemu-img map`.
    """
    try:
        return qcow2.layer_map(path, lock=not share)
    except qcow2.Busy:
        raise LayerBusy(path) from None
    except (qcow2.Unsupported, OSError):
        pass                     # qemu-img says what is wrong with it, or maps what qcow2.py does not
    spec = json.dumps({"driver": "qcow2", "backing": None,
                       "file": {"driver": "file", "filename": os.path.abspath(path)}})
    args = ["map", "--output=json"] + (["-U"] if share else [])
    out = run_json(args + [f"json:{spec}"], f"map {path}")
    ext = []
    for e in out:
        if not e.get("present"):
            continue
        zero = bool(e.get("zero")) and not e.get("data")
        off = None if zero else e.get("offset")
        ext.append((e["start"], e["length"], off, zero))
    return ext


def chain_map(path, fmt, pool=None, layers_out=None):
    """Extents of a frozen image through its whole chain: list of (start, length, file | None, offset | None, zero).

    `file` and `offset` say where the bytes lie on the host when QEMU
    reports it (an uncompressed, unencrypted cluster of a layer without an
    external data file, or a raw layer): reading them there gives exactly
    what the guest reads. Extents without them (compressed clusters) must be
    read through QEMU; `zero` marks extents that read as zeros. With `pool`
    (an executor), the map runs beside the `info`; `layers_out` (a list) receives the `info
    --backing-chain` of each layer, top first (its virtual-size, for one). A chain of plain qcow2
    layers (over a raw file or none) is read directly (qcow2.py; `layers_out` then gets the
    filename, format and virtual-size of each), else by `qemu-img`.
    """
    if fmt == "qcow2":
        try:
            return qcow2.chain_map(path, layers_out)
        except (qcow2.Unsupported, OSError):
            pass
    args = (["map", "--output=json", "-U", "-f", fmt, path], f"map {path}")
    mapped = pool.submit(run_json, *args) if pool is not None else None
    layers = run_json(["info", "--backing-chain", "--output=json", "-U", "-f", fmt, path],
                      f"info --backing-chain {path}")
    layers = layers if isinstance(layers, list) else [layers]
    if layers_out is not None:
        layers_out.extend(layers)
    files = []
    for layer in layers:
        data_file = (layer.get("format-specific") or {}).get("data", {}).get("data-file")
        name = layer.get("filename", "")
        direct = layer.get("format") in ("raw", "qcow2") and not data_file and name.startswith("/")
        files.append(name if direct else None)
    out = []
    for e in mapped.result() if mapped is not None else run_json(*args):
        zero = bool(e.get("zero")) and not e.get("data")
        f = files[e.get("depth", 0)] if not zero and e.get("depth", 0) < len(files) else None
        off = e.get("offset") if f is not None else None
        out.append((e["start"], e["length"], f if off is not None else None, off, zero))
    return out


def create_overlay(path, backing, backing_fmt):
    """A new, empty qcow2 image over `backing` (a clone's disk for `boot`)."""
    run(["create", "-q", "-f", "qcow2", "-b", backing, "-F", backing_fmt, path],
         f"create {path}")


PART = ".part"  # a new layer's name while qemu-img writes it (NewLayer): never used by QEMU


class NewLayer:
    """A new, empty qcow2 layer over `backing` being made, as libvirt makes a snapshot's overlay, for
    a snapshot taken with REUSE_EXT: the backing's cluster size (and extended L2) when it is qcow2,
    mode 0600, the owner and group of the backing (the file QEMU writes now, so QEMU may write this
    one too). qemu-img writes path + PART while the caller works on; done() waits for it and links
    it to `path` whole, so `path` is never a torn header and never replaced (FileExistsError); the
    caller fsyncs the directory (once for all of a run's layers). close() abandons it. A PART left
    behind (a kill) is QEMU's never: drop_part, or the next making of the same name, removes it."""

    def __init__(self, path, backing, backing_fmt):
        self.path, self.part = path, path + PART
        drop_part(path)
        fd = os.open(self.part, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            try:
                st = os.stat(backing)
                try:
                    os.fchown(fd, st.st_uid, st.st_gid)
                except PermissionError:
                    pass         # not root: the file is ours, as QEMU's is
            finally:
                os.close(fd)
            opts = qcow2.layer_options(backing) if backing_fmt == "qcow2" else ""
            self.job = Started(["create", "-q", "-f", "qcow2", *(["-o", opts] if opts else []), "-b", backing,
                                "-F", backing_fmt, self.part], f"create {path}")
        except BaseException:
            drop_part(path)
            raise

    def done(self):
        try:
            self.job.result()
            os.link(self.part, self.path)
        finally:
            drop_part(self.path)

    def close(self):
        """Stop qemu-img if it still runs and drop the part (done() already did, if it ran)."""
        self.job.close()
        drop_part(self.path)


def drop_part(path):
    """Remove the PART of a layer made at `path`, if there is one."""
    try:
        os.unlink(path + PART)
    except FileNotFoundError:
        pass


def commit(path):
    """Merge a qcow2 layer into its backing file, leaving the layer as it was (-d).

    Idempotent: the layer keeps every cluster until it is deleted, so an
    interrupted commit is simply run again.
    """
    run(["commit", "-q", "-d", "-f", "qcow2", path], f"commit {path}")


def rebase_unsafe(path, backing, backing_fmt):
    """Point a qcow2 header at another backing file without touching data (after a commit)."""
    run(["rebase", "-u", "-f", "qcow2", "-b", backing, "-F", backing_fmt, path],
         f"rebase {path}")
