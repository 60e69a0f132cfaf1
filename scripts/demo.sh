#!/usr/bin/env bash
# Set up everything (scripts/setup.sh) and run Foundation's main job on a demo.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
for demo in scripts/demo-images.sh scripts/demo-vm.sh; do
    if [ -x "$demo" ]; then
        echo "== $demo"
        "$demo"
    fi
done
