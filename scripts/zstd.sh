#!/usr/bin/env bash
# A static zstd 1.5.7 for the C core: `FOUNDATION_ZSTD=DIR python3 foundation/native/build.py`
# (or pip install) links it instead of the system's shared libzstd. zstd 1.5.7 writes the
# same records as Debian 12's 1.5.4 (byte for byte on the day-0 workload) with ~15 % less
# CPU per 4 KiB block (benchmarks/README.md, branch d0d).
#
#   scripts/zstd.sh [DIR]      build DIR/libzstd.a, zstd.h, zstd_errors.h; print DIR
#
# The source is zstd's lib/ as the PyPI sdist of python-zstd carries it (pip download,
# checked by SHA-256). Default DIR: ${FOUNDATION_CACHE:-/var/cache/foundation}/zstd-1.5.7.
set -euo pipefail
SDIST=zstd==1.5.7.2
SHA256=6d8684c69009be49e1b18ec251a5eb0d7e24f93624990a8a124a1da66a92fc8a
DIR=${1:-${FOUNDATION_CACHE:-/var/cache/foundation}/zstd-1.5.7}
CC=${CC:-cc}

if [ -f "$DIR/libzstd.a" ] && [ -f "$DIR/zstd.h" ]; then
    echo "$DIR"
    exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"${PYTHON:-python3}" -m pip download -q --no-deps --no-binary :all: "$SDIST" -d "$tmp" >&2
echo "$SHA256  $(ls "$tmp"/zstd-*.tar.gz)" | sha256sum -c --quiet -
tar -xzf "$tmp"/zstd-*.tar.gz -C "$tmp"
lib=$(echo "$tmp"/zstd-*/zstd/lib)
mkdir -p "$tmp/o" "$DIR"
# what the C core calls: compression and decompression, one thread each, no legacy formats,
# no trace hooks; -fPIC: it goes into a shared module
for f in "$lib"/common/*.c "$lib"/compress/*.c "$lib"/decompress/*.c "$lib"/decompress/*.S; do
    "$CC" -O3 -fPIC -DZSTD_LEGACY_SUPPORT=0 -DZSTD_TRACE=0 -I"$lib" -I"$lib/common" \
        -c "$f" -o "$tmp/o/$(basename "${f%.*}").o" &
    while [ "$(jobs -rp | wc -l)" -ge "$(nproc)" ]; do wait -n; done
done
wait
n=$(ls "$lib"/common/*.c "$lib"/compress/*.c "$lib"/decompress/*.c "$lib"/decompress/*.S | wc -l)
[ "$(ls "$tmp"/o/*.o | wc -l)" -eq "$n" ] || { echo "zstd.sh: a zstd source did not compile" >&2; exit 1; }
ar rcs "$DIR/libzstd.a" "$tmp"/o/*.o
cp "$lib/zstd.h" "$lib/zstd_errors.h" "$DIR/"
echo "$DIR"
