"""The damage matrix: every kind of store file × every way a disk loses it, as docs/damage.md tabulates.

One small store (4 days of a 1 MiB image, 256 KiB arenas, encrypted) is
damaged one way at a time: a flipped bit, a zeroed 4 KiB page, a cut, a
deleted file, an older copy put back. For each, `list`, `verify`,
`restore` of every day and `rebuild` run as a user runs them, and the
matrix asserts: no wrong byte is ever returned; every day that needs none
of the damaged bytes restores byte for byte (before and after rebuild);
every failure is a one-line message with a documented exit code; and
verify exits non-zero exactly when something primary is damaged.
"""

import json
import os
import random
import shutil

import pytest

from foundation.catalog import CATALOG, Catalog
from foundation.cli import main
from foundation.store import Store
from foundation.store import format as F
from foundation.store import layout as L

DAYS = 4
SIZE = 1 << 20
DAMAGES = ("flip", "zero", "truncate", "delete", "older")
ARENA_PARTS = ("arena-header", "record-header", "payload", "trailer", "catalog-record")
HEAD_PARTS = ("head", "head.1", "heads")  # one head copy, the other, both (docs/format.md §6)
FILES = HEAD_PARTS + ARENA_PARTS + ("summary", "index", "bloom", "config", "key")


def day(d):
    return f"2026-01-{d + 1:02d}T00:00:00Z"


def images():
    rnd = random.Random(17)
    img = bytearray(rnd.randbytes(SIZE))
    out = []
    for _ in range(DAYS):
        for _ in range(20):
            o = rnd.randrange(0, SIZE // 4096) * 4096
            img[o:o + 4096] = rnd.randbytes(4096)
        out.append(bytes(img))
    return out


def cli(capsys, base, *args):
    capsys.readouterr()
    rc = main(["--store", str(base / "store"), "--key-file", str(base / "key"), *map(str, args)])
    out, err = capsys.readouterr()
    return rc, out, err


def spans(s, root):
    """Arena byte spans [(arena, start, end)] of every record the image under root needs."""
    from foundation.image.shape import Shape, split_refs
    sh = Shape(s, root.size)
    out = []

    def span(ref):
        a = s.address(ref)
        n, off = F.split(a)
        hdr = s.log.record_header(n, off)
        out.append((n, off, off + L.HEADER_SIZE + L.stored(hdr, 0)))

    def walk(k, ref):
        if ref == s.null_ref:
            return
        span(ref)
        if k:
            for r in split_refs(s.read(ref), sh.rs):
                walk(k - 1, r)

    walk(sh.depth, root.ref)
    return out


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """(directory with store/, key, older/ (the store after DAYS-1 days)), images, spans per day, targets."""
    base = tmp_path_factory.mktemp("matrix")
    (base / "store").mkdir()
    os.environ["FOUNDATION_STATE_DIR"] = str(base / "state")
    imgs = images()
    assert main(["--key-file", str(base / "key"), "init", str(base / "store"), "--arena-size", "256K",
                 "--max-log-size", "64M"]) == 0
    for d, img in enumerate(imgs):
        (base / f"img{d}").write_bytes(img)
        if d == DAYS - 1:
            shutil.copytree(base / "store", base / "older")
        assert main(["--store", str(base / "store"), "--key-file", str(base / "key"), "import-image", "vm",
                     str(base / f"img{d}"), "--at", day(d)]) == 0
    with Store.open(str(base / "store"), key_file=str(base / "key")) as s:
        snaps = Catalog.load(s).snapshots("vm")
        need = [spans(s, sn.disks["vda"].root) for sn in snaps]
        last = s.log.open.n
        target = last - 1  # a sealed arena in the middle of the log, holding the newer days' blocks
        _, addrs, _ = s.summary_records(target)
        mid = F.split(addrs[len(addrs) // 2])[1]
        cat = F.split(s.address(s.latest(CATALOG)))
    return base, imgs, need, {"target": target, "record": mid, "catalog": cat, "open": last}


def place(made, part):
    """(file, offset of the damage, arena or None) for a kind of file."""
    base, _, _, t = made
    st = base / "store"
    arena = lambda n: st / "arenas" / F.arena_name(n)  # noqa: E731
    if part == "arena-header":
        return arena(t["target"]), L.A_IV + 3, t["target"]
    if part == "record-header":
        return arena(t["target"]), t["record"] + L.H_SLEN, t["target"]
    if part == "payload":
        return arena(t["target"]), t["record"] + L.HEADER_SIZE + 100, t["target"]
    if part == "trailer":
        p = arena(t["target"])
        return p, os.path.getsize(p) - 10, t["target"]
    if part == "catalog-record":
        n, off = t["catalog"]
        return arena(n), off + L.HEADER_SIZE + 20, n
    if part in HEAD_PARTS:
        return st / (F.HEADS[0] if part == "heads" else part), 37, None   # 37: in the chain MAC
    names = {"summary": st / F.SUMMARIES / F.summary_name(t["target"]), "index": st / F.INDEX,
             "bloom": st / F.BLOOM, "config": st / F.CONFIG, "key": base / "key"}
    return names[part], 100, None


def apply(path, off, how, older):
    """Damage the file; -> the [start, end) byte range of it that is no longer what was written."""
    size = os.path.getsize(path)
    off = min(off, size - 1)
    with open(path, "r+b") as f:
        if how == "flip":
            f.seek(off)
            b = f.read(1)[0]
            f.seek(off)
            f.write(bytes([b ^ 0x10]))
            return off, off + 1
        if how == "zero":
            page = off // 4096 * 4096
            f.seek(page)
            f.write(bytes(min(4096, size - page)))
            return page, page + 4096
        if how == "truncate":
            f.truncate(off)
            return off, 1 << 40
    if how == "delete":
        os.unlink(path)
        return 0, 1 << 40
    if not os.path.exists(older):
        os.unlink(path)  # the older store had no such file: putting the old state back removes it
        return 0, 1 << 40
    old, new = open(older, "rb").read(), open(path, "rb").read()
    shutil.copyfile(older, path)
    first = next((i for i, (a, b) in enumerate(zip(old, new)) if a != b), min(len(old), len(new)))
    return (first, 1 << 40) if old != new else (0, 0)


def cell_dir(made, tmp_path):
    base = made[0]
    d = tmp_path / "cell"
    shutil.copytree(base / "store", d / "store")
    shutil.copyfile(base / "key", d / "key")
    return d


def restores(capsys, d, imgs):
    """{day: True (byte for byte) | False (refused)}; a wrong byte fails the test."""
    got = {}
    for i, img in enumerate(imgs):
        out = d / f"out{i}"
        rc, _, err = cli(capsys, d, "restore", f"vm@{day(i)}", out, "--force")
        if rc == 0:
            assert out.read_bytes() == img, f"day {i}: restore returned wrong bytes"
        else:
            assert err.startswith("foundation: ") and "Traceback" not in err and rc in (2, 10, 13, 14, 20, 21, 25, 30), err
            assert not out.exists()
        got[i] = rc == 0
    return got


@pytest.mark.parametrize("how", DAMAGES)
@pytest.mark.parametrize("part", FILES)
def test_damage(made, part, how, tmp_path, capsys):
    base, imgs, need, t = made
    d = cell_dir(made, tmp_path)
    path, off, arena = place(made, part)
    path = d / os.path.relpath(path, base)
    older = base / "older" / os.path.relpath(path, d / "store") if part != "key" else base / "key"
    lo, hi = apply(path, off, how, older)
    if part == "heads":   # both copies, the same way
        apply(path.with_name(F.HEADS[1]), off, how, older.with_name(F.HEADS[1]))
    # The days that need none of the damaged bytes (an arena header holds the arena's IV: all of it).
    if arena is not None and part == "arena-header":
        lo, hi = 0, 1 << 40
    hit = {i for i, sp in enumerate(need) if arena is not None and any(n == arena and a < hi and lo < b
                                                                        for n, a, b in sp)}
    primary = arena is not None or part in ("config", "key")
    intact = set(range(DAYS)) - hit if arena is not None else (set() if primary else set(range(DAYS)))
    if part == "catalog-record" and hi > lo:
        intact -= {DAYS - 1}  # the newest catalog names the newest day: it cannot be found without it

    rc, out, err = cli(capsys, d, "list")
    assert "Traceback" not in err
    if intact:
        assert rc == 0 and all(day(i)[:10] in out for i in intact), (rc, out, err)
    seen = [rc]
    rc, out, err = cli(capsys, d, "verify")
    assert "Traceback" not in err
    if part in ("summary", "index", "bloom") or (hi <= lo):
        assert rc == 0, (out, err)
    elif part in HEAD_PARTS and how != "older":   # a lost copy costs nothing, but is reported until rewritten
        assert rc == 1 and "DAMAGED head copy" in out and "only a head copy is damaged" in out, (rc, out, err)
    elif part == "heads":   # both copies older: the log carries the commit on, which verify notes
        assert rc == 0 and "note: the head copies name commit" in out and "nothing is lost" in out, (out, err)
    elif part in ("config", "key") and rc:
        assert err.startswith("foundation: ") and rc in (10, 13, 14, 20, 25), err
    elif arena is not None and not (part == "trailer" and how == "flip") and not how == "older":
        assert rc == 1 and "DAMAGED" in out, (rc, out, err)
    seen.append(rc)
    got = restores(capsys, d, imgs)
    assert {i for i in intact if not got[i]} == set(), ("days that need no damaged byte failed", got)
    seen.append(days(got))

    rc, out, err = cli(capsys, d, "rebuild", "--salvage")
    assert "Traceback" not in err and rc in (0, 1, 10, 13, 14, 20, 25), (rc, out, err)
    if rc == 1:
        assert "LOST" in out
    seen.append(rc)
    got = restores(capsys, d, imgs)
    if part == "catalog-record" and hi > lo:
        # The lost record's list is committed again from its blob when that is intact; otherwise
        # rebuild says which snapshots cannot be named.
        if got[DAYS - 1]:
            assert f"catalog: listed again: vm@{day(DAYS - 1)[:19]}" in out, out
        else:
            assert "the list it named is not intact in the log" in out and day(DAYS - 2)[:10] in out, out
    assert {i for i in intact if not got[i]} == set(), ("after rebuild, days that need no damaged byte failed", got)
    seen.append(days(got))
    if part in HEAD_PARTS:   # rebuilt from the newest commit: nothing left to report
        rc, out, err = cli(capsys, d, "verify")
        assert rc == 0, (out, err)
    # The row docs/damage.md shows for this cell: what a user sees, exactly.
    assert TABLE[(part, how)] == [str(x) for x in seen], (part, how, seen)


def days(got):
    """'12-4': the days that restore byte for byte, '-' for a day refused with a message."""
    return "".join(str(i + 1) if ok else "-" for i, ok in sorted(got.items()))


def table():
    """{(file, damage): [list, verify, days before, rebuild, days after]} from docs/damage.md."""
    doc = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "damage.md")
    out = {}
    for line in open(doc):
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if len(cells) >= 7 and cells[0] in FILES and cells[1] in DAMAGES:
            out[(cells[0], cells[1])] = cells[2:7]
    return out


TABLE = table()


def test_uncommitted_tail_is_a_note(made, tmp_path, capsys):
    """A kill -9 or a full disk leaves bytes past the head's end: verify says so and exits 0."""
    d = cell_dir(made, tmp_path)
    n = made[3]["open"]
    with open(d / "store" / "arenas" / F.arena_name(n), "ab") as f:
        f.write(os.urandom(5000))
    rc, out, _ = cli(capsys, d, "verify")
    assert rc == 0 and "note: arena" in out and "5000 bytes past the head's end" in out


def test_edited_block_size_is_damage(made, tmp_path, capsys):
    d = cell_dir(made, tmp_path)
    p = d / "store" / F.CONFIG
    text = p.read_text()
    p.write_text(text.replace('"block_size": 4096', '"block_size": 2048'))
    # The config's check (a MAC of its parameters, written by init) refuses it at open.
    rc, out, err = cli(capsys, d, "verify")
    assert rc == 25 and "was edited after the store was made" in err and "block_size" in err, (rc, out, err)
    # A store from before the check: verify finds records no store of that block size writes.
    conf = json.loads(text)
    del conf["check"]
    p.write_text(json.dumps(conf).replace('"block_size": 4096', '"block_size": 2048'))
    rc, out, _ = cli(capsys, d, "verify")
    assert rc == 1 and "block_size" in out and "foundation.json was edited" in out


@pytest.mark.parametrize("how", ["is missing", "has a damaged header"])
def test_lost_newest_arena_is_never_made_worse(made, how, tmp_path, capsys):
    """Readers serve the older days; rebuild refuses, rebuild --salvage goes on in the next arena; days
    that need none of the lost blocks restore byte for byte, and a new day archives and restores."""
    base, imgs, need, t = made
    d = cell_dir(made, tmp_path)
    n = t["open"]
    path = d / "store" / "arenas" / F.arena_name(n)
    if how == "is missing":
        os.unlink(path)
    else:
        apply(path, L.A_IV, "flip", None)
    rc, out, err = cli(capsys, d, "rebuild")
    assert rc == 20 and f"the newest arena {n} {how}" in err and "rebuild --salvage" in err
    rc, out, err = cli(capsys, d, "list")
    assert rc == 0 and "snapshots taken after the newest one listed may be lost" in err
    rc, out, err = cli(capsys, d, "rebuild", "--salvage")
    assert rc == 1 and f"lost: arena {n}" in out and "LOST" in out
    intact = {i for i, sp in enumerate(need) if all(m != n for m, _, _ in sp)}
    assert intact
    for i in intact:
        rc, _, err = cli(capsys, d, "restore", f"vm@{day(i)}", d / f"o{i}")
        assert rc == 0, err
        assert (d / f"o{i}").read_bytes() == imgs[i]
    rc, _, err = cli(capsys, d, "import-image", "vm", base / f"img{DAYS - 1}", "--at", "2026-02-01T00:00:00Z")
    assert rc == 0, err
    rc, _, err = cli(capsys, d, "restore", "vm@2026-02-01T00:00:00Z", d / "new")
    assert rc == 0 and (d / "new").read_bytes() == imgs[-1]
