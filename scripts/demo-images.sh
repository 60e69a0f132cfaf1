#!/usr/bin/env bash
# Archive a small disk image over several "days", list them, restore an old
# day and check it byte for byte; replicate the store, recover it from the
# replica alone, forget two days and gc. Exits non-zero on any mismatch.
#
#   scripts/demo-images.sh [--keep]      (after scripts/setup.sh: its environment's Python, qemu-img)
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"
. "$here/scripts/venv.sh"   # where scripts/setup.sh installed the dependencies
PY=$VPY
[ -x "$PY" ] || PY=python3
work=$(mktemp -d /tmp/foundation-demo.XXXXXX)
keep=${1:-}
cleanup() { if [ "$keep" != "--keep" ]; then rm -rf "$work"; else echo "kept $work"; fi; }
trap cleanup EXIT

f() { "$PY" -m foundation --store "$work/store" --key-file "$work/store.key" "$@"; }
say() { printf '\n== %s\n' "$*"; }

say "a store (encrypted, by hash) and a 16 MiB disk image"
mkdir "$work/store"
f init "$work/store" --mode hash --arena-size 1M --max-log-size 1G
"$PY" - "$work/disk.raw" <<'EOF'
import random, sys
rng = random.Random(2024)
img = bytearray(16 << 20)
for i in range(0, len(img), 1 << 20):          # half random, a quarter text, a quarter zero
    kind = (i >> 20) % 4
    if kind < 2:
        img[i:i + (1 << 20)] = rng.randbytes(1 << 20)
    elif kind == 2:
        img[i:i + (1 << 20)] = (b"the quick brown fox %d\n" % i * 50000)[:1 << 20]
open(sys.argv[1], "wb").write(img)
EOF

# day N: change some ranges in place, remember them for --changed
change() {  # change DAY -> writes $work/changed-DAY.json and keeps a copy of the day's image
    "$PY" - "$work/disk.raw" "$work/changed-$1.json" "$1" <<'EOF'
import json, os, random, sys
path, out, day = sys.argv[1], sys.argv[2], int(sys.argv[3])
rng = random.Random(day)
size = os.path.getsize(path)
changed = []
with open(path, "r+b") as f:
    for _ in range(6):
        n = rng.randint(1, 200000)
        off = rng.randrange(0, size - n)
        f.seek(off)
        f.write(rng.randbytes(n) if rng.random() < 0.7 else bytes(n))
        changed.append([off, n])
    if day == 3:                                # the disk grows by 1 MiB
        f.seek(size)
        f.write(rng.randbytes(1 << 20))
        changed.append([size, 1 << 20])
json.dump(changed, open(out, "w"))
EOF
}

say "day 1: the whole image"
f import-image demo "$work/disk.raw" --at 2024-05-01T02:00:00Z
cp --sparse=always "$work/disk.raw" "$work/day1.raw"
for day in 2 3 4 5; do
    change "$day"
    if [ $((day % 2)) -eq 0 ]; then
        say "day $day: only the changed ranges (--changed)"
        f import-image demo "$work/disk.raw" --at "2024-05-0${day}T02:00:00Z" --changed "$work/changed-$day.json"
    else
        say "day $day: the whole image again (unchanged blocks dedup away)"
        f import-image demo "$work/disk.raw" --at "2024-05-0${day}T02:00:00Z"
    fi
    cp --sparse=always "$work/disk.raw" "$work/day$day.raw"
done

say "the catalog"
f list

say "restore day 2 by date, day 3 by a time between days, the newest as qcow2"
f restore demo@2024-05-02 "$work/restored-2.raw"
f restore demo@2024-05-03T23:59:00Z "$work/restored-3.raw"
f restore demo "$work/restored-5.qcow2"
qemu-img convert -f qcow2 -O raw "$work/restored-5.qcow2" "$work/restored-5.raw"

status=0
for d in 2 3 5; do
    if cmp "$work/day$d.raw" "$work/restored-$d.raw"; then
        echo "day $d: identical"
    else
        echo "day $d: MISMATCH" >&2
        status=1
    fi
done
say "sparse output: $(du -k "$work/restored-2.raw" | cut -f1) KiB on disk for a $(($(stat -c %s "$work/restored-2.raw") / 1024)) KiB image"
if f restore demo@2024-04-30 "$work/too-early.raw" 2>"$work/err"; then
    echo "restoring before the first day should fail" >&2
    status=1
else
    echo "as expected: $(cat "$work/err")"
fi

say "an off-site replica: here a directory; ftp://, ftps:// and s3:// work the same (docs/operation.md)"
mkdir "$work/offsite"
f replicate --to "file://$work/offsite"
f audit --replica "file://$work/offsite"
echo "the replica holds: $(cd "$work/offsite" && find . -type f | sort | head -4 | tr '\n' ' ')..."

say "the backup disk is lost: the replica and the key file bring back every day"
"$PY" -m foundation --key-file "$work/store.key" recover --from "file://$work/offsite" --store "$work/recovered"
"$PY" -m foundation --store "$work/recovered" --key-file "$work/store.key" \
    restore demo@2024-05-02 "$work/recovered-2.raw"
if cmp "$work/day2.raw" "$work/recovered-2.raw"; then
    echo "day 2 from the recovered store: identical"
else
    echo "day 2 from the recovered store: MISMATCH" >&2
    status=1
fi

say "forget days 1 and 3 and give their space back (gc; the replica follows)"
f forget demo@2024-05-01T02:00:00Z demo@2024-05-03T02:00:00Z
f gc --min-garbage 0 --no-replicate
f replicate --to "file://$work/offsite"
f list
for d in 2 5; do
    f restore "demo@2024-05-0${d}T02:00:00Z" "$work/after-gc-$d.raw" --force
    if cmp "$work/day$d.raw" "$work/after-gc-$d.raw"; then
        echo "day $d after gc: identical"
    else
        echo "day $d after gc: MISMATCH" >&2
        status=1
    fi
done
exit $status
