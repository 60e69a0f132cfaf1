#!/usr/bin/env bash
# Set up everything (scripts/setup.sh) and run the whole test suite:
# first with the C core, then the store's tests again on the pure-Python
# reference of every native function, so both stay equivalent.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
. scripts/venv.sh
PY=$VPY   # the environment setup.sh installed into
FOUNDATION_NATIVE=0 $PY -m pytest -q -p no:cacheprovider tests/test_native.py tests/test_store.py tests/test_store_crash.py \
    tests/test_damage_matrix.py
exec $PY -m pytest -q -p no:cacheprovider "$@"
