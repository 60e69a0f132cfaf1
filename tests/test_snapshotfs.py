"""The /snapshot tree over real FUSE mounts: structure, time travel, bytes, files, EIO.

Each archive kind runs the same tests: "store" archives the days into a
real store with write_image + Catalog; "images" is the stand-in manifest
of raw files (it tests the tree alone, and still runs when the store is
broken). Disk images hold real ext4, FAT and NTFS file systems built with
mkfs -d / mcopy / ntfscp, partitioned with sfdisk (GPT and MBR).
"""

import datetime as dt
import errno
import hashlib
import json
import os
import random
import shutil
import stat
import subprocess
import sys
import threading
import time

import pytest
import snapshotfs_support as T

from foundation.snapshotfs import rawstream
from foundation.snapshotfs.timeindex import TimeIndex, parse_when

pytestmark = [pytest.mark.fuse]

try:
    import pyfuse3  # noqa: F401
    HAVE_PYFUSE3 = True
except ImportError:
    HAVE_PYFUSE3 = False
pytsk3 = pytest.importorskip("pytsk3")
CAN_MOUNT = os.geteuid() == 0 and os.path.exists("/dev/fuse") and HAVE_PYFUSE3
needs_root = pytest.mark.skipif(not CAN_MOUNT, reason="FUSE mounts need root, /dev/fuse and pyfuse3")


def _store_available():
    try:
        from foundation.catalog import Catalog  # noqa: F401
        from foundation.image import ImageReader, write_image  # noqa: F401
        from foundation.store import Store  # noqa: F401
        return True
    except Exception:
        return False


KINDS = [pytest.param("images", id="images"),
         pytest.param("store", id="store", marks=pytest.mark.skipif(
             not _store_available(), reason="foundation.store/image/catalog not importable yet"))]

HAVE_NTFS = T.have("mkntfs") and T.have("ntfscp")
MIB = 1 << 20


def make_archiver(kind, workdir, **kw):
    os.makedirs(workdir, exist_ok=True)
    return T.ImagesArchiver(workdir) if kind == "images" else T.StoreArchiver(workdir, **kw)


def rnd(n, seed):
    return random.Random(seed).randbytes(n)


# day -> {"ext": files, "fat": files}; None deletes
DAYS = [
    (T.utc(2026, 11, 19, 3, 0, 0), {
        "ext": {"a.txt": b"version 1\n", "docs/old.txt": b"deleted on the 21st\n",
                "sub/big.bin": rnd(300_000, 1), "bin/tool.sh": b"#!/bin/sh\necho hi\n"},
        "fat": {"README.TXT": b"fat day 1\n", "DATA/X.BIN": rnd(100_000, 2)}}),
    (T.utc(2026, 11, 21, 3, 0, 0), {
        "ext": {"a.txt": b"version 2\n", "docs/old.txt": None, "new.txt": b"new on the 21st\n"},
        "fat": {"README.TXT": b"fat day 2, longer than before\n", "DATA/X.BIN": None}}),
    (T.utc(2026, 11, 21, 15, 30, 0), {
        "ext": {"a.txt": b"version 3, in the afternoon\n", "sub/big.bin": rnd(300_000, 1)[:200_000] + rnd(50_000, 3)},
        "fat": {}}),
]
FILE_MTIME = 1_700_000_000
NVRAM = b"UEFI variables " * 4000


@pytest.fixture(scope="module", params=KINDS)
def world(request, tmp_path_factory):
    """Three days of VM `web` (GPT: ext4 + FAT) and one of `db` (bare FAT + MBR NTFS), archived and mounted."""
    if not CAN_MOUNT:
        pytest.skip("FUSE mounts need root, /dev/fuse and pyfuse3")
    kind = request.param
    base = tmp_path_factory.mktemp(f"world-{kind}")
    arch = make_archiver(kind, str(base / "archive"))
    ext, fat = {}, {}
    days = []
    for i, (when, change) in enumerate(DAYS):
        for files, ch in ((ext, change["ext"]), (fat, change["fat"])):
            for k, v in ch.items():
                if v is None:
                    files.pop(k, None)
                else:
                    files[k] = v
        d = base / f"day{i}"
        T.write_tree(str(d / "ext"), ext, FILE_MTIME + i * 86400)
        os.chmod(d / "ext" / "bin" / "tool.sh", 0o750)
        os.chown(d / "ext" / "bin" / "tool.sh", 1000, 1000)
        T.write_tree(str(d / "fat"), fat, FILE_MTIME + i * 86400)
        T.mkfs_image("ext4", str(d / "ext.img"), 24 * MIB, str(d / "ext"))
        T.mkfs_image("vfat", str(d / "fat.img"), 16 * MIB, str(d / "fat"))
        disk = str(d / "vda.img")
        T.partitioned_disk(disk, 48 * MIB, [(str(d / "ext.img"), T.GPT_LINUX), (str(d / "fat.img"), T.GPT_MSDATA)])
        xml = T.domain_xml("web", "6b3c6a8e-52cf-4c39-9a39-0e2b4c8e7a01", {"vda": "/var/lib/libvirt/images/web.qcow2"})
        arch.add("web", when, {"vda": disk}, xml=xml, nvram=NVRAM if i == 0 else None)
        days.append({"when": when, "disk": disk, "ext": dict(ext), "fat": dict(fat),
                     "src": {"ext": str(d / "ext"), "fat": str(d / "fat")}})
    # db: a bare FAT disk and an MBR disk with NTFS, on the 21st only
    dbdir = base / "db"
    dbfat = {"NOTES.TXT": b"db notes\n", "SUB/DEEP/F.BIN": rnd(70_000, 5)}
    T.write_tree(str(dbdir / "fat"), dbfat, FILE_MTIME)
    T.mkfs_image("vfat", str(dbdir / "vda.img"), 12 * MIB, str(dbdir / "fat"))
    db_disks = {"vda": str(dbdir / "vda.img")}
    dbntfs = {"report.txt": b"ntfs file\n", "blob.bin": rnd(120_000, 6)}
    if HAVE_NTFS:
        T.write_tree(str(dbdir / "ntfs"), dbntfs, FILE_MTIME)
        T.mkfs_image("ntfs", str(dbdir / "ntfs.img"), 16 * MIB, str(dbdir / "ntfs"))
        T.partitioned_disk(str(dbdir / "vdb.img"), 24 * MIB, [(str(dbdir / "ntfs.img"), "7")], label="dos")
        db_disks["vdb"] = str(dbdir / "vdb.img")
    arch.add("db", T.utc(2026, 11, 21, 3, 0, 0), db_disks, xml=None)
    mnt = f"/tmp/fdntest-mnt-{kind}-{os.getpid()}"
    with T.Mounted(arch, mnt) as m:
        yield {"mnt": mnt, "days": days, "m": m, "arch": arch, "kind": kind,
               "db": {"disks": db_disks, "fat": dbfat, "ntfs": dbntfs}}
    shutil.rmtree(mnt, ignore_errors=True)


def sha(path, bs=1 << 20):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(bs)
            if not b:
                return h.hexdigest()
            h.update(b)


def ls(p):
    return sorted(os.listdir(p))


# -- structure and time travel ----------------------------------------------------

def test_top_levels_list_only_what_exists(world):
    mnt = world["mnt"]
    assert ls(mnt) == [".foundation", "2026", "latest"]
    assert ls(f"{mnt}/2026") == ["11"]
    assert ls(f"{mnt}/2026/11") == ["19", "21"]
    assert ls(f"{mnt}/2026/11/19") == ["030000", "web"]
    assert ls(f"{mnt}/2026/11/21") == ["030000", "153000", "db", "web"]
    assert ls(f"{mnt}/2026/11/21/030000") == ["db", "web"]
    assert ls(f"{mnt}/2026/11/21/153000") == ["web"]
    assert ls(f"{mnt}/2026/11/19/web") == ["changes", "changes.json", "domain.xml", "nvram.fd", "snapshot.json",
                                           "vda", "vda.raw"]
    assert ls(f"{mnt}/2026/11/21/web") == ["changes", "changes.json", "domain.xml", "snapshot.json", "vda",
                                           "vda.raw"]
    assert os.readlink(f"{mnt}/latest/web") == "../2026/11/21/153000/web"
    assert os.readlink(f"{mnt}/latest/db") == "../2026/11/21/030000/db"
    st = os.stat(f"{mnt}/2026/11/19/web/vda.raw")
    assert stat.S_ISREG(st.st_mode) and st.st_size == 48 * MIB
    assert st.st_mtime == DAYS[0][0].timestamp()


def _snapinfo(p):
    with open(os.path.join(p, "snapshot.json")) as f:
        return json.load(f)


def test_time_travel_resolves_without_listing(world):
    mnt = world["mnt"]
    # the 20th has no snapshot: it is the 19th, and is not listed
    assert "20" not in ls(f"{mnt}/2026/11")
    assert _snapinfo(f"{mnt}/2026/11/20/web")["path"] == "2026/11/19/030000/web"
    assert ls(f"{mnt}/2026/11/20") == ["web"]
    # the day's path is its newest snapshot; HHMMSS picks by time, and times between resolve back
    assert _snapinfo(f"{mnt}/2026/11/21/web")["path"] == "2026/11/21/153000/web"
    assert _snapinfo(f"{mnt}/2026/11/21/120000/web")["path"] == "2026/11/21/030000/web"
    assert _snapinfo(f"{mnt}/2026/11/21/020000/web")["path"] == "2026/11/19/030000/web"
    # far future resolves to the newest; before the first snapshot there is nothing
    assert _snapinfo(f"{mnt}/2027/01/01/web")["path"] == "2026/11/21/153000/web"
    assert _snapinfo(f"{mnt}/2027/01/01/db")["path"] == "2026/11/21/030000/db"
    for p in ("2026/11/18", "2026/10", "2025", "2026/11/19/db", "2026/13", "2026/11/31", "2026/11/21/246000",
              "2026/11/19/020000", "nonsense", "2026/11/21/web/nope"):
        assert not os.path.exists(f"{mnt}/{p}"), p
    # and the 20th holds the 19th's files
    with open(f"{mnt}/2026/11/20/web/vda/p1/docs/old.txt", "rb") as f:
        assert f.read() == b"deleted on the 21st\n"


def test_changes_of_a_day(world):
    """Each day's mkfs lays files out afresh: contents are compared, not taken from block positions."""
    with open(f"{world['mnt']}/2026/11/21/030000/web/changes") as f:
        lines = f.read().splitlines()
    assert lines[0] == "changes since 2026/11/19/030000/web"
    for line in ["-  vda/p1/docs/old.txt  (20 B)", "+  vda/p1/new.txt  (16 B)", "M  vda/p1/a.txt  (10 B -> 10 B)",
                 "U  vda/p1/sub/big.bin  (metadata only)", "-  vda/p2/DATA/X.BIN  (97.7 KiB)",
                 "M  vda/p2/README.TXT  (10 B -> 30 B)"]:
        assert line in lines
    with open(f"{world['mnt']}/2026/11/21/153000/web/changes.json") as f:
        rows = {r["path"]: r for r in map(json.loads, f)}
    assert (rows["/sub/big.bin"]["change"], rows["/sub/big.bin"]["content"]) == ("modified", True)
    assert rows["/a.txt"]["size_after"] == len(b"version 3, in the afternoon\n")
    assert "/new.txt" in rows and rows["/new.txt"]["content"] is False      # touched by the day's mkfs only


def test_domain_xml_and_snapshot_json(world):
    mnt = world["mnt"]
    with open(f"{mnt}/2026/11/19/web/domain.xml") as f:
        assert "<name>web</name>" in f.read()
    info = _snapinfo(f"{mnt}/latest/web")
    assert info["name"] == "web" and info["disks"] == {"vda": 48 * MIB}
    assert dt.datetime.fromisoformat(info["time"]) == DAYS[2][0]
    assert not os.path.exists(f"{mnt}/2026/11/21/db/domain.xml")
    with open(f"{mnt}/2026/11/19/web/nvram.fd", "rb") as f:
        assert f.read() == NVRAM


# -- bytes -------------------------------------------------------------------------

def test_raw_images_equal_the_archived_disks(world):
    mnt = world["mnt"]
    paths = ["2026/11/19/030000/web", "2026/11/21/030000/web", "2026/11/21/153000/web"]
    for day, p in zip(world["days"], paths):
        assert sha(f"{mnt}/{p}/vda.raw") == sha(day["disk"]), p
    for dev, img in world["db"]["disks"].items():
        assert sha(f"{mnt}/2026/11/21/db/{dev}.raw") == sha(img)
    if world["kind"] == "store":
        # and equals what `restore` writes
        from foundation.catalog import Catalog
        from foundation.image import restore_image

        arch = world["arch"]
        out = os.path.join(arch.dir, "restored.raw")
        with arch.open_store() as s:
            for snap in Catalog.load(s).snapshots("web"):
                restore_image(s, snap.disks["vda"].root, out)
                p = f"{mnt}/{snap.time:%Y/%m/%d/%H%M%S}/web/vda.raw"
                assert sha(out) == sha(p), p
                os.unlink(out)


def _as_guest(tmp_path, tool):
    """A copy of `tool` named as QEMU is (what the server tells guests by)."""
    p = tmp_path / f"qemu-system-{tool}"
    shutil.copy(shutil.which(tool), p)
    return str(p)


def test_a_copy_reads_past_the_page_cache_a_guest_through_it(world, tmp_path):
    """A copier's reads of vda.raw are answered straight into its buffer (nothing left in the page
    cache); a program that runs guests (QEMU) reads through the cache. Both read the day's bytes."""
    mnt = world["mnt"]
    want = sha(world["days"][2]["disk"])
    p = f"{mnt}/2026/11/21/153000/web/vda.raw"
    assert os.stat(p).st_blksize == rawstream.BLKSIZE
    # fincore maps the file: as a copier it could not (direct replies are not mapped shared)
    fincore = _as_guest(tmp_path, "fincore")

    def cached():
        out = subprocess.run([fincore, "--bytes", "--noheadings", "--output", "RES", p],
                             capture_output=True, text=True, check=True).stdout
        return int(out.split()[0])

    fd = os.open(p, os.O_RDONLY)         # what earlier tests left in the cache goes
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    assert cached() == 0
    out = tmp_path / "copy.raw"
    subprocess.run(["dd", f"if={p}", f"of={out}", "bs=1M"], check=True, capture_output=True)
    assert sha(out) == want
    assert cached() == 0
    with open(out, "wb") as f:
        subprocess.run([_as_guest(tmp_path, "cat"), p], stdout=f, check=True)
    assert sha(out) == want
    assert cached() == 48 * MIB


def test_random_reads_of_raw_images(world):
    mnt = world["mnt"]
    src = world["days"][1]["disk"]
    r = random.Random(7)
    with open(f"{mnt}/2026/11/21/030000/web/vda.raw", "rb", buffering=0) as f, open(src, "rb") as g:
        for _ in range(200):
            off = r.randrange(0, 48 * MIB)
            n = r.choice([1, 511, 4096, 70_000, 1 << 20])
            f.seek(off)
            g.seek(off)
            assert f.read(n) == g.read(n)
        f.seek(48 * MIB - 10)
        assert len(f.read(100)) == 10
        assert f.read(100) == b""


# -- files inside the disks -------------------------------------------------------

def _walk(root):
    out = {}
    for d, dirs, files in os.walk(root):
        for n in files:
            p = os.path.join(d, n)
            out[os.path.relpath(p, root)] = p
    return out


def test_ext4_files_equal_what_was_written(world):
    mnt = world["mnt"]
    paths = ["2026/11/19/030000/web", "2026/11/21/030000/web", "2026/11/21/153000/web"]
    for day, p in zip(world["days"], paths):
        root = f"{mnt}/{p}/vda/p1"
        seen = _walk(root)
        seen.pop("lost+found", None)
        assert sorted(seen) == sorted(day["ext"]), p
        for rel, data in day["ext"].items():
            with open(seen[rel], "rb") as f:
                assert f.read() == data, (p, rel)
            src = os.lstat(os.path.join(day["src"]["ext"], rel))
            st = os.lstat(seen[rel])
            assert (st.st_mode, st.st_uid, st.st_gid, st.st_size) == \
                (src.st_mode, src.st_uid, src.st_gid, src.st_size), (p, rel)
            assert st.st_mtime == src.st_mtime
        assert stat.S_ISDIR(os.stat(f"{root}/lost+found").st_mode)
    # deleted later, still there in the past
    assert os.path.exists(f"{mnt}/2026/11/19/web/vda/p1/docs/old.txt")
    assert not os.path.exists(f"{mnt}/2026/11/21/web/vda/p1/docs/old.txt")
    assert ls(f"{mnt}/2026/11/19/web/vda") == ["p1", "p2"]


def test_fat_files_equal_what_was_written(world):
    mnt = world["mnt"]
    paths = ["2026/11/19/030000/web", "2026/11/21/030000/web", "2026/11/21/153000/web"]
    for day, p in zip(world["days"], paths):
        seen = _walk(f"{mnt}/{p}/vda/p2")
        assert sorted(seen) == sorted(day["fat"]), p
        for rel, data in day["fat"].items():
            with open(seen[rel], "rb") as f:
                assert f.read() == data
            st = os.stat(seen[rel])
            assert st.st_size == len(data) and stat.S_IMODE(st.st_mode) == 0o444
            src = os.stat(os.path.join(day["src"]["fat"], rel))
            assert abs(st.st_mtime - src.st_mtime) <= 2     # FAT keeps 2-second times
    assert os.path.exists(f"{mnt}/2026/11/19/web/vda/p2/DATA/X.BIN")
    assert not os.path.exists(f"{mnt}/2026/11/21/web/vda/p2/DATA/X.BIN")


def test_bare_fat_disk_and_mbr_ntfs(world):
    mnt = world["mnt"]
    db = world["db"]
    seen = _walk(f"{mnt}/2026/11/21/db/vda")
    assert sorted(seen) == sorted(db["fat"])
    for rel, data in db["fat"].items():
        with open(seen[rel], "rb") as f:
            assert f.read() == data
    if not HAVE_NTFS:
        pytest.skip("mkntfs/ntfscp not installed (apt-get install ntfs-3g)")
    assert ls(f"{mnt}/2026/11/21/db/vdb") == ["p1"]
    assert ls(f"{mnt}/2026/11/21/db/vdb/p1") == sorted(db["ntfs"])     # no $MFT & co.
    for rel, data in db["ntfs"].items():
        with open(f"{mnt}/2026/11/21/db/vdb/p1/{rel}", "rb") as f:
            assert f.read() == data


def test_tree_is_read_only(world):
    mnt = world["mnt"]
    for p in ("2026/11/19/web/vda.raw", "2026/11/19/web/vda/p1/a.txt"):
        with pytest.raises(OSError) as e:
            open(f"{mnt}/{p}", "r+b")
        assert e.value.errno in (errno.EROFS, errno.EACCES)
    with pytest.raises(OSError):
        os.mkdir(f"{mnt}/2026/11/19/web/x")


# -- a live archive: new nights appear, open files keep their snapshot ---------------

def _ext_disk(workdir, name, files, size=8 * MIB):
    src = os.path.join(workdir, name + ".d")
    shutil.rmtree(src, ignore_errors=True)
    T.write_tree(src, files, FILE_MTIME)
    img = os.path.join(workdir, name + ".img")
    T.mkfs_image("ext4", img, size, src)
    return img


@pytest.mark.parametrize("kind", KINDS)
@needs_root
def test_new_nights_appear_while_reading(kind, tmp_path):
    arch = make_archiver(kind, str(tmp_path / "archive"))
    imgs = [_ext_disk(str(tmp_path), "d0", {"f.txt": b"night 0\n", "big": rnd(2 * MIB, 10)})]
    arch.add("live", T.utc(2026, 1, 1), {"vda": imgs[0]})
    want0 = open(imgs[0], "rb").read()
    mnt = f"/tmp/fdntest-live-{kind}-{os.getpid()}"
    errors = []
    with T.Mounted(arch, mnt) as m:
        f = open(f"{mnt}/latest/live/vda.raw", "rb", buffering=0)     # opened before the new nights
        g = open(f"{mnt}/latest/live/vda/f.txt", "rb", buffering=0)
        stop = threading.Event()

        def reader():
            r = random.Random(1)
            while not stop.is_set():
                try:
                    with open(f"{mnt}/2026/01/01/live/vda.raw", "rb", buffering=0) as h:
                        off = r.randrange(0, len(want0) - 70_000)
                        h.seek(off)
                        if h.read(65536) != want0[off:off + 65536]:
                            errors.append(f"wrong bytes at {off}")
                except OSError as e:
                    errors.append(repr(e))

        threads = [threading.Thread(target=reader) for _ in range(2)]
        for t in threads:
            t.start()
        try:
            for night in range(1, 4):
                img = _ext_disk(str(tmp_path), f"d{night}", {"f.txt": f"night {night}\n".encode(),
                                                             "big": rnd(2 * MIB, 10 + night)})
                arch.add("live", T.utc(2026, 1, 1 + night), {"vda": img})
                imgs.append(img)
                deadline = time.monotonic() + 10
                day = f"{1 + night:02d}"
                while day not in os.listdir(f"{mnt}/2026/01"):
                    assert time.monotonic() < deadline, "new night did not appear"
                    time.sleep(0.1)
                with open(f"{mnt}/latest/live/vda/f.txt", "rb") as h:
                    assert h.read() == f"night {night}\n".encode()
                assert sha(f"{mnt}/2026/01/{day}/live/vda.raw") == sha(img)
        finally:
            stop.set()
            for t in threads:
                t.join()
        # the handles opened on night 0 still read night 0
        assert f.read() == want0
        assert g.read() == b"night 0\n"
        f.close()
        g.close()
        assert ls(f"{mnt}/2026/01") == ["01", "02", "03", "04"]
    assert not errors, errors[:5]
    assert m.clean_exit, "SIGTERM did not unmount cleanly"


@needs_root
def test_mount_refuses_a_live_tree_and_clears_a_stale_one(tmp_path):
    arch = make_archiver("images", str(tmp_path / "archive"))
    arch.add("vm", T.utc(2026, 3, 1), {"vda": _ext_disk(str(tmp_path), "d", {"x": b"x"})})
    mnt = str(tmp_path / "mnt")
    with T.Mounted(arch, mnt) as m:
        r = subprocess.run([sys.executable, "-m", "foundation", *arch.mount_args(), mnt],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode != 0 and "already mounted" in r.stderr, r.stderr
        m.proc.kill()                         # a server that dies leaves a dead mount behind
        m.proc.wait()
        with pytest.raises(OSError) as e:
            os.listdir(mnt)
        assert e.value.errno == errno.ENOTCONN
        with T.Mounted(arch, mnt, log_path=str(tmp_path / "second.log")):
            assert ls(f"{mnt}/2026/03/01/vm/vda") == ["lost+found", "x"]


# -- damage: EIO and a log line, never wrong data ---------------------------------------

def _flip_byte_in_arena(arch, wanted):
    """Flip one byte of the stored copy of block `wanted` (found by content in the arena files)."""
    for p in arch.arena_files():
        data = open(p, "rb").read()
        i = data.find(wanted)
        if i >= 0:
            with open(p, "r+b") as f:
                f.seek(i + len(wanted) // 2)
                b = f.read(1)
                f.seek(i + len(wanted) // 2)
                f.write(bytes([b[0] ^ 0xFF]))
            return p
    return None


@pytest.mark.parametrize("kind", KINDS)
@needs_root
def test_damaged_block_is_eio_with_a_log_line(kind, tmp_path):
    # unencrypted, so the block (random, hence stored uncompressed) can be found in the arena files
    # Small arenas: the damaged block ends up in a sealed arena (a read-only Store.open
    # verifies the open arena's records and refuses to open when one is damaged).
    arch = make_archiver(kind, str(tmp_path / "archive"),
                         **({"encrypt": False, "arena_size": 256 << 10} if kind == "store" else {}))
    payload = rnd(4096, 99)
    files = {"good.txt": b"fine\n", "bad.bin": payload * 4}
    img = _ext_disk(str(tmp_path), "d0", files)
    raw = open(img, "rb").read()
    boff = raw.find(payload)
    assert boff >= 0 and boff % 4096 == 0
    if kind == "images":
        arch.add("hurt", T.utc(2026, 2, 1), {"vda": img}, damaged={"vda": [[boff, 4096]]})
    else:
        arch.add("hurt", T.utc(2026, 2, 1), {"vda": img})
        more = _ext_disk(str(tmp_path), "d1", {"filler.bin": rnd(1 * MIB, 98)})
        arch.add("filler", T.utc(2026, 2, 2), {"vda": more})
        hit = _flip_byte_in_arena(arch, payload)
        assert hit, "block not found in the arenas (compressed?)"
        assert hit != arch.arena_files()[-1], "damaged block is in the open arena"
    mnt = f"/tmp/fdntest-eio-{kind}-{os.getpid()}"
    with T.Mounted(arch, mnt) as m:
        p = f"{mnt}/2026/02/01/hurt"
        with open(f"{p}/vda.raw", "rb", buffering=0) as f:
            f.seek(boff)
            with pytest.raises(OSError) as e:
                f.read(4096)
            assert e.value.errno == errno.EIO
            f.seek(0)
            assert f.read(4096) == raw[:4096]              # the rest still reads
        with open(f"{p}/vda/good.txt", "rb") as f:
            assert f.read() == b"fine\n"
        with pytest.raises(OSError) as e:
            with open(f"{p}/vda/bad.bin", "rb") as f:
                f.read()
        assert e.value.errno == errno.EIO
        # many failures later (their exceptions garbage-collected), the server is still up
        for i in range(30):
            with open(f"{p}/vda.raw", "rb", buffering=0) as f:
                f.seek(boff + 1000 * (i % 3))   # (a read starting before it would return short)
                with pytest.raises(OSError):
                    f.read(65536)
        assert m.proc.poll() is None
        assert ls(p)
        time.sleep(0.2)
        log = m.log()
    lines = [ln for ln in log.splitlines() if "EIO" in ln and "vda.raw" in ln]
    assert lines, log
    assert "damage" in log or "damaged" in log or "corrupt" in log.lower(), log


# -- pure logic, no mount -------------------------------------------------------------

class _S:
    def __init__(self, name, t, id=None):
        self.name, self.time, self.id = name, t, id or f"{name}{t:%d%H}"


def test_time_index_rules():
    U = dt.timezone.utc
    snaps = [_S("a", T.utc(2026, 11, 19)), _S("a", T.utc(2026, 11, 21, 3)), _S("a", T.utc(2026, 11, 21, 15, 30)),
             _S("b", T.utc(2026, 11, 21, 3)), _S("a", T.utc(2025, 12, 31, 23, 59, 59))]
    ix = TimeIndex(snaps, U)
    assert ix.year_names() == ["2025", "2026"]
    assert ix.month_names(2026) == ["11"] and ix.day_names(2026, 11) == ["19", "21"]
    assert ix.at_day("a", dt.date(2026, 11, 20)).time == T.utc(2026, 11, 19)
    assert ix.at_day("b", dt.date(2026, 11, 20)) is None
    assert ix.at("a", dt.datetime(2026, 11, 21, 3, 0, 0)).time == T.utc(2026, 11, 21, 3)
    assert ix.at("a", dt.datetime(2026, 11, 21, 2, 59, 59)).time == T.utc(2026, 11, 19)
    assert ix.day_listing(dt.date(2026, 11, 21)) == (["a", "b"], ["030000", "153000"])
    assert ix.day_listing(dt.date(2026, 11, 20)) == (["a"], [])
    assert ix.day_listing(dt.date(2025, 1, 1)) == ([], [])
    assert ix.canonical(snaps[2]) == "2026/11/21/153000/a"
    assert {n: s.time for n, s in ix.latest().items()} == {"a": T.utc(2026, 11, 21, 15, 30), "b": T.utc(2026, 11, 21, 3)}
    # local days follow the time zone
    ix2 = TimeIndex(snaps, dt.timezone(dt.timedelta(hours=-5)))
    assert ix2.day_names(2026, 11) == ["18", "20", "21"]


def test_parse_when():
    assert parse_when("2026-11-21")[0] == dt.datetime(2026, 11, 21, 23, 59, 59)
    assert parse_when("2026/11/21")[1] == dt.date(2026, 11, 21)
    assert parse_when("2026-11-21T03:15")[0] == dt.datetime(2026, 11, 21, 3, 15, 59)
    assert parse_when("2026-11-21 03:15:07")[0] == dt.datetime(2026, 11, 21, 3, 15, 7)
    assert parse_when("2026-11-21T031507")[2] is True
    for bad in ("yesterday", "2026-13-01", "2026-11-21T25:00"):
        with pytest.raises(ValueError):
            parse_when(bad)


def test_volumes_report_read_failures_tsk_swallows(tmp_path):
    """Every failed read under a TSK call fails the call, even when TSK carries on."""
    from foundation.errors import DataCorrupt
    from foundation.snapshotfs.volumes import DiskFiles, ReadFailed

    img = _ext_disk(str(tmp_path), "x", {"a.txt": b"a" * 10_000, "b.txt": b"b" * 10_000})
    data = open(img, "rb").read()

    class Src:
        size = len(data)
        bad = None

        def read(self, off, n):
            if self.bad and off < self.bad[1] and self.bad[0] < off + n:
                raise DataCorrupt("test damage")
            return data[off:off + n]

    i = data.find(b"a" * 4096)
    src = Src()
    src.bad = (i, i + 1)                  # damaged from the start, as in a store
    df = DiskFiles(src)
    vol = df.volumes()[""]
    names = {e.name: e for e in vol.list_dir(vol.root_addr)}
    assert set(names) == {b"a.txt", b"b.txt", b"lost+found"}
    e, eb = names[b"a.txt"], names[b"b.txt"]
    f = vol.open_file(e.addr)
    with pytest.raises(ReadFailed) as ex:
        vol.read_file(f, 0, e.size, e.size)
    assert isinstance(ex.value.cause, DataCorrupt)
    fb = vol.open_file(eb.addr)
    assert vol.read_file(fb, 0, eb.size, eb.size) == b"b" * 10_000   # its neighbour still reads
