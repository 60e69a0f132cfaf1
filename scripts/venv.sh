# Sourced by the other scripts: the environment scripts/setup.sh installs Foundation into
# (FOUNDATION_VENV, default /opt/foundation), and its interpreter.
VENV=${FOUNDATION_VENV:-/opt/foundation}
VPY=$VENV/bin/python
