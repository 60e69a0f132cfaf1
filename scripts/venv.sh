# Sourced by the other scripts: the environment scripts/setup.sh installs Foundation into
# (FOUNDATION_VENV, default /opt/foundation), and its interpreter.
VENV=${FOUNDATION_VENV:-/opt/foundation}
VPY=$VENV/bin/python

# The interpreter setup.sh makes the environment from: $PYTHON, else the distribution's
# /usr/bin/python3, not the first python3 on root's PATH (a pyenv or conda shim, if someone
# installed one): the nightly job should not depend on an interpreter kept in a home directory, and
# Debian's has libpython linked into the executable, where a pyenv build loads it as a shared
# library (benchmarks/README.md, wave 20). A system Python older than the package asks (3.11)
# leaves the choice to PATH.
base_python() {
    if [ -n "${PYTHON:-}" ]; then echo "$PYTHON"
    elif [ -x /usr/bin/python3 ] && /usr/bin/python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null
    then echo /usr/bin/python3
    else echo python3
    fi
}
