"""`foundation diff` and `foundation find` over days of real guest file systems.

One VM with three disks (GPT: ext4 + FAT; MBR: ext4; bare ext4) lives
five days: files are added, removed, renamed, grown, touched and
rewritten in place with the same size and mtime, one day changes only
free space, and the last day's ext4 on vda is damaged. Every answer is
checked against the list of what was done. An NTFS disk checks resident
data and clusters rewritten in place.
"""

import json
import os
import shutil

import pytest

pytsk3 = pytest.importorskip("pytsk3")

from foundation.cli import main  # noqa: E402
import snapshotfs_support as T  # noqa: E402
from guest_days import MIB, GuestDisk, GuestFS, rnd  # noqa: E402

DAYS = ["2026-10-01", "2026-10-02", "2026-10-03", "2026-10-04", "2026-10-05"]


@pytest.fixture(scope="module", params=["hash", "value"])
def world(request, tmp_path_factory):
    """Five days of VM web in a store of each mode (in value mode refs are log addresses)."""
    base = tmp_path_factory.mktemp(f"changes-{request.param}")
    arch = T.StoreArchiver(str(base / "archive"), mode=request.param)
    w = str(base)
    ext = GuestFS("ext4", f"{w}/ext.img", 24 * MIB, {
        "a.txt": b"version 1\n", "docs/old.txt": b"removed on day 1, back on day 3\n",
        "sub/big.bin": rnd(300_000, 1), "bin/tool.sh": b"#!/bin/sh\necho hi\n", "keep.txt": b"kept\n",
        "same.bin": rnd(100_000, 2)})
    fat = GuestFS("vfat", f"{w}/fat.img", 16 * MIB, {"README.TXT": b"fat day 0\n", "DATA/X.BIN": rnd(100_000, 3)})
    mbr = GuestFS("ext4", f"{w}/mbr.img", 16 * MIB, {"log.txt": b"log line\n" * 100})
    bare = GuestFS("ext4", f"{w}/bare.img", 16 * MIB, {"notes.txt": b"notes\n", "photo.bin": rnd(200_000, 4)})
    disks = {"vda": GuestDisk(f"{w}/vda.img", 48 * MIB, [ext, fat], "gpt"),
             "vdb": GuestDisk(f"{w}/vdb.img", 20 * MIB, [mbr], "dos"),
             "vdc": GuestDisk(f"{w}/vdc.img", 16 * MIB, [bare], None)}

    def day(i):
        for d in disks.values():
            d.sync()
        y, m, dd = map(int, DAYS[i].split("-"))
        arch.add("web", T.utc(y, m, dd), {k: d.path for k, d in disks.items()})

    day(0)
    ext.write("a.txt", b"version 2, longer\n")
    ext.remove("docs/old.txt")
    ext.write("new.txt", b"new on day 1\n")
    ext.rewrite_in_place("sub/big.bin", 150_000, b"X" * 5000)     # same size, same mtime, same inode
    ext.set_mtime("keep.txt", "20250101")
    fat.write("README.TXT", b"fat day 1, longer than before\n")
    fat.remove("DATA/X.BIN")
    fat.write("NEW.TXT", b"new fat file\n")
    mbr.rename("log.txt", "log.old")
    bare.rewrite_in_place("photo.bin", 4096 * 20 + 7, b"\xff" * 3)
    day(1)
    ext.scribble_free(2 * MIB, 7)
    mbr.scribble_free(1 * MIB, 8)
    bare.scribble_free(1 * MIB, 9)
    day(2)
    ext.write("docs/old.txt", b"removed on day 1, back on day 3\n")
    ext.write("a.txt", b"version 3 has grown: " + b"x" * 10_000)
    ext.write("newdir/inside.txt", b"in a new directory\n")
    mbr.write("log.old", b"log line\n" * 300)
    fat.rewrite_in_place("README.TXT", 0, b"F")
    day(3)
    ext.damage_superblock()
    bare.remove("notes.txt")
    day(4)
    key = ["--key-file", arch.key_file] if arch.key_file else []
    return {"args": ["--store", arch.store_path] + key, "state": str(base / "state"), "arch": arch}


def cli(world, capsys, *argv):
    capsys.readouterr()
    code = main(world["args"] + list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def diff(world, capsys, i, j, *extra):
    code, out, err = cli(world, capsys, "diff", f"web@{DAYS[i]}", f"web@{DAYS[j]}", "--json", *extra)
    rows = [json.loads(line) for line in out.splitlines()]
    return code, {(r["disk"], r["partition"], r["path"]): (r["change"], r["size_before"], r["size_after"])
                  for r in rows}, err


def test_diff_lists_exactly_what_changed(world, capsys):
    code, got, err = diff(world, capsys, 0, 1)
    assert code == 0, err
    assert got == {
        ("vda", "p1", "/a.txt"): ("modified", 10, 18),
        ("vda", "p1", "/docs/old.txt"): ("removed", 32, None),
        ("vda", "p1", "/new.txt"): ("added", None, 13),
        ("vda", "p1", "/sub/big.bin"): ("modified", 300_000, 300_000),     # rewritten in place
        ("vda", "p1", "/keep.txt"): ("modified", 5, 5),                    # touched only
        ("vda", "p2", "/README.TXT"): ("modified", 10, 30),
        ("vda", "p2", "/DATA/X.BIN"): ("removed", 100_000, None),
        ("vda", "p2", "/NEW.TXT"): ("added", None, 13),
        ("vdb", "p1", "/log.txt"): ("removed", 900, None),
        ("vdb", "p1", "/log.old"): ("added", None, 900),
        ("vdc", "", "/photo.bin"): ("modified", 200_000, 200_000),         # 3 bytes in place
    }


def test_diff_tells_content_from_metadata(world, capsys):
    code, out, _ = cli(world, capsys, "diff", f"web@{DAYS[0]}", f"web@{DAYS[1]}", "--json")
    rows = {r["path"]: r for r in map(json.loads, out.splitlines())}
    assert rows["/keep.txt"]["content"] is False
    assert rows["/sub/big.bin"]["content"] is True
    code, out, _ = cli(world, capsys, "diff", f"web@{DAYS[0]}", f"web@{DAYS[1]}")
    lines = out.splitlines()
    assert lines[0].startswith("comparing web@2026-10-01T03:00:00") and "web@2026-10-02T03:00:00" in lines[0]
    assert "U  vda/p1/keep.txt  (metadata only)" in lines
    assert "M  vda/p1/sub/big.bin  (293.0 KiB -> 293.0 KiB)" in lines
    assert "+  vda/p2/NEW.TXT  (13 B)" in lines
    assert "-  vdb/p1/log.txt  (900 B)" in lines
    assert lines[-1].startswith("3 added, 3 removed, 5 modified, 0 changed type; -97.6 KiB")


def test_free_space_only_day_lists_nothing(world, capsys):
    code, got, err = diff(world, capsys, 1, 2)
    assert (code, got, err) == (0, {}, "")


def test_diff_across_days_and_one_disk(world, capsys):
    code, got, _ = diff(world, capsys, 1, 3, "--disk", "vda")
    assert code == 0
    assert got == {
        ("vda", "p1", "/a.txt"): ("modified", 18, 10_021),
        ("vda", "p1", "/docs/old.txt"): ("added", None, 32),
        ("vda", "p1", "/newdir"): ("added", None, 0),
        ("vda", "p1", "/newdir/inside.txt"): ("added", None, 19),
        ("vda", "p2", "/README.TXT"): ("modified", 30, 30),               # one byte, in place
    }
    code, got, _ = diff(world, capsys, 3, 1, "--disk", "vdb")
    assert got == {("vdb", "p1", "/log.old"): ("modified", 2700, 900)}


def test_damaged_file_system_is_named_never_listed(world, capsys):
    code, got, err = diff(world, capsys, 3, 4)
    assert code == 70
    assert got == {("vdc", "", "/notes.txt"): ("removed", 6, None)}      # the other disks still answer
    assert err.count("\n") == 1
    assert "web@2026-10-05T03:00:00" in err and "disk vda" in err and "partition p1" in err
    assert "cannot be read" in err


def test_find_answers_every_day_of_every_version(world, capsys):
    state = ["--state-dir", world["state"]]
    code, out, err = cli(world, capsys, "find", "a.txt", "--json", *state)
    rows = [json.loads(x) for x in out.splitlines()]
    assert code == 70 and "2026-10-05" in err and "disk vda" in err and "not searched" in err
    assert [(r["day"], r["size"], r["changed"]) for r in rows] == [
        ("2026-10-01", 10, True), ("2026-10-02", 18, True), ("2026-10-03", 18, False),
        ("2026-10-04", 10_021, True)]
    r = rows[0]
    assert set(r) >= {"vm", "snapshot", "day", "disk", "partition", "path", "size", "changed"}
    assert (r["vm"], r["disk"], r["partition"], r["path"]) == ("web", "vda", "p1", "/a.txt")
    assert r["snapshot"].startswith("web@2026-10-01T03:00:00")
    # the snapshot string is what restore takes
    code, _, err = cli(world, capsys, "restore", r["snapshot"], os.path.join(world["state"], "x.raw"), "--disk", "vdc")
    assert code == 0, err

    def days(pattern, *extra):
        _, out, _ = cli(world, capsys, "find", pattern, "--json", *state, *extra)
        return [(r["day"], r["path"], r["changed"]) for r in map(json.loads, out.splitlines())]

    # back on day 3 with the same bytes: not changed since it was last seen
    assert days("old.txt") == [("2026-10-01", "/docs/old.txt", True), ("2026-10-04", "/docs/old.txt", False)]
    # rewritten in place, same size and mtime: changed on day 1 only
    assert days("big.bin") == [("2026-10-01", "/sub/big.bin", True), ("2026-10-02", "/sub/big.bin", True),
                               ("2026-10-03", "/sub/big.bin", False), ("2026-10-04", "/sub/big.bin", False)]
    assert days("photo.bin", "--since", "2026-10-02", "--until", "2026-10-03") == [
        ("2026-10-02", "/photo.bin", True), ("2026-10-03", "/photo.bin", False)]
    assert days("log.*") == [("2026-10-01", "/log.txt", True), ("2026-10-02", "/log.old", True),
                             ("2026-10-03", "/log.old", False), ("2026-10-04", "/log.old", True),
                             ("2026-10-05", "/log.old", False)]
    assert days("/newdir/*") == [("2026-10-04", "/newdir/inside.txt", True)]
    assert days("*.TXT", "--until", "2026-10-01") == [("2026-10-01", "/README.TXT", True)]
    assert days("nothing-like-this") == []


def test_find_index_is_rebuilt_and_follows_new_days(world, capsys, tmp_path):
    state = ["--state-dir", str(tmp_path / "state")]
    code, out, _ = cli(world, capsys, "find", "notes.txt", "--json", *state)
    assert [json.loads(x)["day"] for x in out.splitlines()] == DAYS[:4]
    listing = tmp_path / "state" / "files"
    (db,) = [x for x in os.listdir(listing) if x.endswith(".sqlite")]
    assert oct(os.stat(listing / db).st_mode & 0o777) == "0o600"
    os.unlink(listing / db)
    code, out2, _ = cli(world, capsys, "find", "notes.txt", "--json", *state)
    assert out2 == out
    code, out3, _ = cli(world, capsys, "find", "notes.txt", "--json", "--rebuild", *state)
    assert out3 == out


def test_only_files_in_changed_blocks_are_read(world, capsys, monkeypatch):
    from foundation.snapshotfs import changes

    read = []
    real = changes.same_bytes

    def spy(x, p, y, q, spans=None):
        read.append((q.name, sum(n for _, n in spans) if spans else q.size))
        return real(x, p, y, q, spans)

    walked = set()
    real_list = changes.Side.list_dir

    def spy_list(side, vol, addr):
        walked.add((side.label[-3:], vol.name))
        return real_list(side, vol, addr)

    monkeypatch.setattr(changes, "same_bytes", spy)
    monkeypatch.setattr(changes.Side, "list_dir", spy_list)
    assert diff(world, capsys, 1, 2)[1] == {}
    assert read == []                      # free space only: no file is read
    assert ("vda", "p2") not in walked     # nor the FAT partition walked: none of its blocks changed
    assert ("vda", "p1") in walked
    assert len(diff(world, capsys, 0, 1)[1]) == 11
    # same size and extents, blocks changed: only those blocks are compared
    assert sorted(read) == [(b"big.bin", 8192), (b"photo.bin", 4096)]


def _can_mount():
    try:
        import pyfuse3  # noqa: F401
    except ImportError:
        return False
    return os.geteuid() == 0 and os.path.exists("/dev/fuse")


@pytest.mark.skipif(not _can_mount(), reason="FUSE mounts need root, /dev/fuse and pyfuse3")
def test_snapshot_tree_lists_each_days_changes(world, capsys):
    mnt = f"/tmp/fdntest-changes-{os.getpid()}"
    _, want, _ = cli(world, capsys, "diff", f"web@{DAYS[0]}", f"web@{DAYS[1]}", "--json")
    _, human_out, _ = cli(world, capsys, "diff", f"web@{DAYS[0]}", f"web@{DAYS[1]}")
    with T.Mounted(world["arch"], mnt):
        day = os.path.join(mnt, "2026", "10", "02", "web")
        assert {"changes", "changes.json"} <= set(os.listdir(day))
        with open(os.path.join(day, "changes.json")) as f:
            assert f.read() == want
        with open(os.path.join(day, "changes")) as f:
            text = f.read().splitlines()
        assert text[0] == "changes since 2026/10/01/030000/web"
        assert text[1:] == human_out.splitlines()[1:-1]
        assert os.stat(os.path.join(day, "changes")).st_size == len("\n".join(text)) + 1
        with open(os.path.join(mnt, "2026", "10", "03", "web", "changes")) as f:
            assert f.read() == "changes since 2026/10/02/030000/web\n"        # free space only
        with open(os.path.join(mnt, "2026", "10", "05", "web", "changes")) as f:
            last = f.read().splitlines()
        assert last[1].startswith("! vda: ") and "partition p1" in last[1] and "cannot be read" in last[1]
        assert last[2:] == ["-  vdc/notes.txt  (6 B)"]
        with open(os.path.join(mnt, "2026", "10", "01", "web", "changes.json")) as f:
            first = [json.loads(x) for x in f]
        assert {r["change"] for r in first} == {"added"} and {"path": "/sub/big.bin"}.items() <= next(
            r for r in first if r["path"] == "/sub/big.bin").items()


def test_listings_updated_after_archiving_only_warn_on_failure(world, capsys, tmp_path, caplog):
    import argparse
    import logging

    from foundation.cli.find import update_listings

    arch = world["arch"]
    args = argparse.Namespace(store=arch.store_path, key_file=arch.key_file, config=None)
    with caplog.at_level(logging.INFO):
        update_listings(args, ["web"], str(tmp_path / "state"))
    assert "file listings: 15 snapshot disk(s) added" in caplog.text   # 5 days x 3 disks
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    caplog.clear()
    update_listings(args, ["web"], str(blocker))
    assert "file listings not updated" in caplog.text and "`foundation find` adds them" in caplog.text
    # what the archive step listed is what find answers, without indexing again
    code, out, _ = cli(world, capsys, "find", "inside.txt", "--json", "--state-dir", str(tmp_path / "state"))
    assert [json.loads(x)["day"] for x in out.splitlines()] == ["2026-10-04"]


def _differing_blocks(x, y, bs=4096):
    n = max(len(x), len(y))
    x, y = x.ljust(n, b"\0"), y.ljust(n, b"\0")
    out = []
    for o in range(0, n, bs):
        if x[o:o + bs] != y[o:o + bs]:
            if out and out[-1][0] + out[-1][1] == o:
                out[-1] = (out[-1][0], out[-1][1] + min(bs, n - o))
            else:
                out.append((o, min(bs, n - o)))
    return out


def test_changed_ranges_are_exactly_the_changed_blocks(make_store, mode):
    from foundation.image import write_image
    from foundation.image.tree import BytesSource
    from foundation.snapshotfs.changes import changed_ranges

    opener = make_store(mode=mode, max_log_size=256 << 20, arena_size=4 << 20)
    base = bytearray(rnd(3 << 20, 1))            # 768 leaves: a tree of depth 2 (fanout 128 or 512)
    base[1 << 20:(1 << 20) + (600 << 10)] = bytes(600 << 10)   # an all-zero region: null subtrees
    days = [bytes(base)]
    d = bytearray(base)
    d[5000:5003] = b"abc"                        # one block
    d[(1 << 20) + 4096 * 3:(1 << 20) + 4096 * 5] = rnd(8192, 2)   # inside the zeros
    d[-1] ^= 1                                   # the last block
    days.append(bytes(d))
    d = bytearray(d)
    d[4096 * 200:4096 * 520] = rnd(4096 * 320, 3)  # across level-1 nodes
    days.append(bytes(d))
    days.append(bytes(d) + rnd(10_000, 4))       # grown, same depth
    with opener() as s:
        roots = [write_image(s, BytesSource(x), len(x)) for x in days]
        for i in range(len(days)):
            for j in range(len(days)):
                assert changed_ranges(s, roots[i], roots[j]) == _differing_blocks(days[i], days[j]), (i, j)


class _DamagedFile:
    """A raw image whose bytes [lo, hi) read as a damaged store block would."""

    def __init__(self, path, lo, hi):
        self.fd, self.size, self.lo, self.hi = os.open(path, os.O_RDONLY), os.path.getsize(path), lo, hi

    def read(self, offset, length):
        from foundation.errors import DataCorrupt

        if offset < self.hi and self.lo < offset + length:
            raise DataCorrupt(f"record at arena 3 offset {self.lo} fails its MAC")
        return os.pread(self.fd, min(length, self.size - offset), offset)


def test_damaged_metadata_is_a_clear_error_not_a_shorter_list(tmp_path):
    from foundation.errors import FilesUnreadable
    from foundation.snapshotfs.changes import Side, compare_disks

    fs = GuestFS("ext4", str(tmp_path / "e.img"), 8 * MIB, {f"d/f{i}.txt": b"x" * i for i in range(50)})
    (d,) = [e for e in fs.extents("d")]           # the directory's block, which lists the 50 files
    good = Side(_DamagedFile(fs.path, 0, 0), "web@day1 disk vda")
    bad = Side(_DamagedFile(fs.path, d[0], d[0] + d[1]), "web@day2 disk vda")
    assert len(list(compare_disks(None, good, None, "vda"))) == 52      # lost+found, d, 50 files
    with pytest.raises(FilesUnreadable) as e:
        list(compare_disks(good, bad, None, "vda"))
    assert str(e.value).startswith("web@day2 disk vda: the guest file system cannot be read (")
    assert "fails its MAC" in str(e.value)
    assert e.value.code == 70


def test_find_listings_damaged_or_unwritable(world, capsys, tmp_path):
    state = tmp_path / "state"
    code, out, _ = cli(world, capsys, "find", "photo.bin", "--json", "--state-dir", str(state))
    assert code == 70 and len(out.splitlines()) == 5
    (db,) = (state / "files").glob("*.sqlite")
    db.write_bytes(b"this is not an SQLite database" * 100)
    code, out2, err = cli(world, capsys, "find", "photo.bin", "--json", "--state-dir", str(state))
    assert (code, out2) == (70, out)                # dropped and built again
    blocked = tmp_path / "file"
    blocked.write_text("")
    code, out, err = cli(world, capsys, "find", "photo.bin", "--state-dir", str(blocked / "sub"))
    assert (code, out) == (2, "")
    assert err.startswith(f"foundation: cannot keep the file listings in {blocked}/sub/files: ")
    assert err.rstrip().endswith("pass --state-dir DIR or set FOUNDATION_STATE_DIR")


def test_find_prints_one_line_a_day(world, capsys, tmp_path):
    code, out, err = cli(world, capsys, "find", "README.TXT", "--until", "2026-10-02", "--state-dir", str(tmp_path))
    assert code == 0 and err == ""          # the damaged day is after --until
    assert out.splitlines() == ["web@2026-10-01T03:00:00.000000Z  vda/p2/README.TXT  10 B  changed",
                                "web@2026-10-02T03:00:00.000000Z  vda/p2/README.TXT  30 B  changed"]
    code, out, err = cli(world, capsys, "find", "newdir", "--vm", "web", "--state-dir", str(tmp_path))
    assert out.splitlines() == ["web@2026-10-04T03:00:00.000000Z  vda/p1/newdir/  0 B  changed"]
    code, out, err = cli(world, capsys, "find", "x", "--vm", "nosuchvm", "--state-dir", str(tmp_path))
    assert code == 30 and "nosuchvm" in err and "web" in err


@pytest.mark.skipif(not shutil.which("ntfscp"), reason="NTFS images need ntfs-3g (apt)")
def test_ntfs_resident_and_in_place_changes(tmp_path, capsys, monkeypatch):
    from foundation.snapshotfs import changes

    compared = {}
    real = changes.same_bytes

    def spy(x, p, y, q, spans=None):
        compared[q.name] = spans
        return real(x, p, y, q, spans)

    monkeypatch.setattr(changes, "same_bytes", spy)
    arch = T.StoreArchiver(str(tmp_path / "archive"))
    ntfs = GuestFS("ntfs", str(tmp_path / "ntfs.img"), 16 * MIB, {
        "small.txt": b"resident in its MFT record\n", "big.bin": rnd(200_000, 1), "keep.bin": rnd(100_000, 2)})
    disk = GuestDisk(str(tmp_path / "vda.img"), 20 * MIB, [ntfs], "dos")
    arch.add("nt", T.utc(2026, 10, 1), {"vda": disk.path})
    ntfs.rewrite_in_place("big.bin", 100_000, b"\0" * 10)        # data clusters only
    ntfs.write("small.txt", b"RESIDENT in its MFT record\n")      # same size, inside the MFT
    disk.sync()
    arch.add("nt", T.utc(2026, 10, 2), {"vda": disk.path})
    world = {"args": ["--store", arch.store_path, "--key-file", arch.key_file]}
    code, out, err = cli(world, capsys, "diff", "nt@2026-10-01", "nt@2026-10-02", "--json")
    rows = {r["path"]: (r["change"], r["size_before"], r["size_after"], r["content"])
            for r in map(json.loads, out.splitlines())}
    assert code == 0, err
    assert rows == {"/big.bin": ("modified", 200_000, 200_000, True),
                    "/small.txt": ("modified", 27, 27, True)}
    # the cluster that changed, against resident data read whole (its runs are not blocks)
    assert compared == {b"big.bin": [(98_304, 4096)], b"small.txt": None}


def test_block_numbers_trusted_only_for_a_file_system_on_the_disk_itself(tmp_path):
    """A volume read from other bytes than a slice of the disk (as inside LVM) is compared by content."""
    from foundation.guestfs.sources import SourceImg
    from foundation.snapshotfs.changes import Side
    from foundation.snapshotfs.volumes import TskVolume

    files = {"a.txt": b"same name, same size\n"}
    one = GuestFS("ext4", str(tmp_path / "one.img"), 8 * MIB, files)
    disk = GuestDisk(str(tmp_path / "vda.img"), 12 * MIB, [one], "gpt")
    side = Side(_DamagedFile(disk.path, 0, 0), "web@day disk vda")
    p1 = side.volumes()["p1"]
    (a,) = [e for e in side.list_dir(p1, p1.root().addr) if e.name == b"a.txt"]
    assert side.extents(p1, a.addr)[0][1] == disk.starts[0] + one.extents("a.txt")[0][0]
    assert side.span(p1) == (disk.starts[0], disk.starts[0] + 8 * MIB)
    img = SourceImg(_DamagedFile(one.path, 0, 0), [])           # the same file system, other bytes
    elsewhere = TskVolume(side.files, "p1/vg/lv", pytsk3.FS_Info(img), img)
    assert side.extents(elsewhere, a.addr) is None and side.span(elsewhere) is None


def test_a_disk_without_a_file_system_is_given_up_after_reads_at_its_start(tmp_path):
    """No table, no file system: a few reads near the start, not TSK's YAFFS2 probe over ~30 MiB."""
    from foundation.guestfs.disk import DiskFiles

    path = str(tmp_path / "noise.img")
    with open(path, "wb") as f:
        f.write(rnd(64 * MIB, "noise"))
    src = _DamagedFile(path, 0, 0)
    read, reads = src.read, []
    src.read = lambda offset, length: reads.append(offset) or read(offset, length)
    files = DiskFiles(src, "web@day disk vda")
    assert files.volumes() == {} and files.failed == {}
    # the partition tables (the GPT backup at the end) and the file systems' superblocks
    chunks = {o >> 16 for o in reads if o < 32 * MIB}
    assert chunks and max(chunks) < 8 and len(reads) < 40, sorted(reads)
    # a file system there is still found by the same families
    fat = GuestFS("vfat", str(tmp_path / "f.img"), 8 * MIB, {"a.txt": b"found\n"})
    vols = DiskFiles(_DamagedFile(fat.path, 0, 0), "web@day disk vdb").volumes()
    assert list(vols) == [""] and vols[""].type_name.startswith("fat")


def test_a_deleted_partition_takes_its_files_a_damaged_one_is_an_error(tmp_path):
    import subprocess

    from foundation.errors import FilesUnreadable
    from foundation.snapshotfs.changes import Side, compare_disks

    ext = GuestFS("ext4", str(tmp_path / "ext.img"), 8 * MIB, {"keep.txt": b"kept\n"})
    fat = GuestFS("vfat", str(tmp_path / "fat.img"), 8 * MIB, {"A.TXT": b"a\n", "B/C.TXT": b"c\n"})
    disk = GuestDisk(str(tmp_path / "vda.img"), 20 * MIB, [ext, fat], "gpt")
    before = Side(_DamagedFile(disk.path, 0, 0), "web@day1 disk vda")
    deleted = str(tmp_path / "deleted.img")
    subprocess.run(["cp", disk.path, deleted], check=True)
    subprocess.run(["sfdisk", "-q", "--delete", deleted, "2"], check=True, capture_output=True)
    got = [(c.partition, c.path, c.change) for c in compare_disks(before, Side(_DamagedFile(deleted, 0, 0),
                                                                               "web@day2 disk vda"), None, "vda")]
    assert got == [("p2", "/A.TXT", "removed"), ("p2", "/B", "removed"), ("p2", "/B/C.TXT", "removed")]
    fat.damage_superblock()
    disk.sync()
    with pytest.raises(FilesUnreadable) as e:
        list(compare_disks(before, Side(_DamagedFile(disk.path, 0, 0), "web@day2 disk vda"), None, "vda"))
    assert "partition p2 held a file system the day before and none that can be read now" in str(e.value)


def test_two_finds_at_once_index_each_night_once(world, tmp_path):
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "foundation", *world["args"], "find", "big.bin", "--json",
           "--state-dir", str(tmp_path)]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [70, 70], outs
    assert outs[0][0] == outs[1][0] and len(outs[0][0].splitlines()) == 4


def test_a_rewrite_still_in_the_journal_is_a_change(tmp_path):
    """Crash-consistent days: the journal's replayed blocks count, not only the blocks in place."""
    import shutil as sh

    import guest_images as G
    from foundation.snapshotfs.changes import Side, compare_disks

    before = GuestFS("ext4", str(tmp_path / "before.img"), 16 * MIB, {"doc.bin": rnd(40_000, 1), "same.txt": b"x\n"})
    after = str(tmp_path / "after.img")
    sh.copy(before.path, after)
    GuestFS.existing("ext4", after).rewrite_in_place("doc.bin", 8192, b"new bytes")   # same size, mtime, blocks
    crash = str(tmp_path / "crash.img")
    G.unreplayed(before.path, after, crash)                      # in the journal only

    def side(path, day):
        return Side(_DamagedFile(path, 0, 0), f"web@{day} disk vda")

    def changes(x, y):
        with open(x, "rb") as f, open(y, "rb") as g:
            ranges = _differing_blocks(f.read(), g.read())
        return sorted((c.path, c.change, c.content) for c in compare_disks(side(x, 1), side(y, 2), ranges, "vda"))

    assert side(crash, 2).volumes()[""].replayed
    assert changes(before.path, crash) == [("/doc.bin", "modified", True)]
    assert changes(crash, after) == []                           # the same files, checkpointed
    assert changes(crash, crash) == []
