#!/usr/bin/env bash
# The servers the replica tests and benchmarks run against, on loopback:
# FTP and FTPS (pyftpdlib, tests/ftpd.py), FTPS as most Linux hosts serve it
# (vsftpd, the Debian package, with its defaults: it demands TLS session reuse
# on data connections) and S3 (MinIO, built from source with `go install`:
# there is no Debian package, and CI reaches only the package registries,
# the Go module proxy among them).
#
#   scripts/servers.sh install      pyftpdlib + pyopenssl + boto3, vsftpd (not started: the tests
#                                   start their own on loopback), and MinIO (about 6 min and 1.2 GB
#                                   of Go modules the first time; the binary is cached)
#   scripts/servers.sh start DIR    start all four in DIR and print a config file using them
#   scripts/servers.sh stop DIR     stop what `start DIR` started
#
# MinIO goes to ${FOUNDATION_CACHE:-/var/cache/foundation}/bin/minio; MINIO_BIN names an
# existing binary instead. The tests (tests/servers.py) start their own servers; the FTPS
# certificate is made there with `cryptography`.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "servers.sh: $*" >&2; }

# The version `go install github.com/minio/minio@latest` resolved to on 2026-11-22; builds with go 1.26.
MINIO_VERSION=v0.0.0-20260212201848-7aac2a2c5b7c
CACHE=${FOUNDATION_CACHE:-/var/cache/foundation}
. scripts/venv.sh   # scripts/setup.sh's environment, where it exists
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON; elif [ -x "$VPY" ]; then PY=$VPY; else PY=python3; fi

minio_bin() {
    if [ -n "${MINIO_BIN:-}" ]; then echo "$MINIO_BIN"; else echo "$CACHE/bin/minio"; fi
}

install_minio() {
    local bin go work
    bin=$(minio_bin)
    if [ -x "$bin" ]; then
        say "MinIO: $bin"
        return
    fi
    if [ -n "${MINIO_BIN:-}" ]; then
        say "MINIO_BIN=$MINIO_BIN is not an executable file"; exit 1
    fi
    go=$(command -v go || echo /usr/local/go/bin/go)
    if [ ! -x "$go" ]; then
        say "Go is needed to build MinIO: install it to /usr/local/go (https://go.dev/dl/, go 1.24 or later)"
        exit 1
    fi
    work="$CACHE/go-build.$$"
    mkdir -p "$CACHE/bin" "$work"
    say "building MinIO $MINIO_VERSION with $($go version | cut -d' ' -f3) (about 6 minutes, 1.2 GB in $work)"
    if ! GOBIN="$work/bin" GOPATH="$work/gopath" GOCACHE="$work/cache" GOFLAGS=-modcacherw CGO_ENABLED=0 \
            "$go" install "github.com/minio/minio@$MINIO_VERSION" >"$work/build.log" 2>&1; then
        tail -20 "$work/build.log" >&2
        say "the MinIO build failed; its log is $work/build.log"
        exit 1
    fi
    mv "$work/bin/minio" "$CACHE/bin/minio"
    rm -rf "$work"
    say "MinIO: $CACHE/bin/minio"
}

install_vsftpd() {
    if [ ! -x /usr/sbin/vsftpd ]; then
        say "installing vsftpd (Debian package; its own service is left stopped)"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends vsftpd >/dev/null
    fi
    # Debian starts the package's own vsftpd on port 21 where it can: the tests need none of it.
    if command -v systemctl >/dev/null && systemctl is-active --quiet vsftpd 2>/dev/null; then
        systemctl disable --now vsftpd >/dev/null 2>&1 || true
    fi
    say "vsftpd: /usr/sbin/vsftpd"
}

case "${1:-}" in
install)
    if ! $PY -c "import pyftpdlib, OpenSSL, boto3" 2>/dev/null; then
        say "installing pyftpdlib, pyopenssl and boto3"
        PIP_ROOT_USER_ACTION=ignore $PY -m pip install -q --disable-pip-version-check \
            "pyftpdlib>=1.5" "pyopenssl>=23" "boto3>=1.36"
    fi
    install_vsftpd
    install_minio
    ;;
start)
    [ -n "${2:-}" ] || { say "usage: $0 start DIR"; exit 2; }
    MINIO_BIN=$(minio_bin) exec $PY tests/servers.py start "$2"
    ;;
stop)
    [ -n "${2:-}" ] || { say "usage: $0 stop DIR"; exit 2; }
    exec $PY tests/servers.py stop "$2"
    ;;
*)
    say "usage: $0 install | start DIR | stop DIR"; exit 2
    ;;
esac
