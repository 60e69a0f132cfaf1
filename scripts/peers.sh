#!/usr/bin/env bash
# The backup tools benchmarks/compare_tools.py measures Foundation against:
# restic and borg (Debian packages), virtnbdbackup (Debian package: libvirt's
# incremental-backup API, the peer built for exactly this job) and kopia
# (no Debian package: `go install` from the Go module proxy, as servers.sh
# builds MinIO). Only the benchmark needs them; neither the tests nor CI do.
#
#   scripts/peers.sh install    install what is missing; a tool that cannot be had is named, not fatal
#   scripts/peers.sh check      print each tool's path and version, or "missing"
#
# kopia goes to ${FOUNDATION_CACHE:-/var/cache/foundation}/bin/kopia; KOPIA_BIN names an
# existing binary instead. compare_tools.py looks there as well as on PATH.
set -uo pipefail
cd "$(dirname "$0")/.."

say() { echo "peers.sh: $*" >&2; }

# The newest kopia release when this was written (2026-11). The Go module proxy reachable
# here serves this version but refuses the module's version list, which `go install
# MODULE@VERSION` reads to look for a deprecation notice; so kopia is built inside a
# throwaway module that requires it (`go mod tidy`, then `go build`): about 4 minutes.
KOPIA_VERSION=${KOPIA_VERSION:-v0.21.1}
CACHE=${FOUNDATION_CACHE:-/var/cache/foundation}

kopia_bin() { echo "${KOPIA_BIN:-$CACHE/bin/kopia}"; }

apt_install() {
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null || true
    apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

install_debian() {
    local need=()
    command -v restic >/dev/null || need+=(restic)
    command -v borg >/dev/null || need+=(borgbackup)
    command -v virtnbdbackup >/dev/null || need+=(virtnbdbackup)
    command -v /usr/bin/time >/dev/null || need+=(time)
    if [ ${#need[@]} -gt 0 ]; then
        say "installing ${need[*]} (Debian packages)"
        apt_install "${need[@]}" || { say "apt-get install ${need[*]} failed"; return 1; }
    fi
}

install_kopia() {
    local bin go work
    bin=$(kopia_bin)
    if [ -x "$bin" ] || command -v kopia >/dev/null; then
        return 0
    fi
    go=$(command -v go || echo /usr/local/go/bin/go)
    if [ ! -x "$go" ]; then
        say "kopia: not built (Go is not installed; kopia has no Debian package)"
        return 1
    fi
    work="$CACHE/kopia-build.$$"
    mkdir -p "$CACHE/bin" "$work/mod"
    printf 'module kopiabuild\n\ngo 1.24\n\nrequire github.com/kopia/kopia %s\n' "$KOPIA_VERSION" >"$work/mod/go.mod"
    printf '//go:build tools\n\npackage kopiabuild\n\nimport _ "github.com/kopia/kopia"\n' >"$work/mod/tools.go"
    say "kopia: building $KOPIA_VERSION with $($go version | cut -d' ' -f3) (about 4 minutes)"
    if ! (cd "$work/mod" && export GOPATH="$work/gopath" GOCACHE="$work/cache" GOFLAGS=-modcacherw CGO_ENABLED=0 &&
            "$go" mod tidy && "$go" build -o "$work/kopia" github.com/kopia/kopia) >"$work/build.log" 2>&1; then
        say "kopia: not built: $(grep -m1 -E '^go: .*(rror|refused|Forbidden|not available)|error' "$work/build.log" ||
            tail -1 "$work/build.log")"
        rm -rf "$work"
        return 1
    fi
    mv "$work/kopia" "$CACHE/bin/kopia"
    rm -rf "$work"
}

check() {
    local t p
    for t in restic borg virtnbdbackup kopia; do
        p=$(command -v "$t" || true)
        if [ -z "$p" ] && [ "$t" = kopia ] && [ -x "$(kopia_bin)" ]; then p=$(kopia_bin); fi
        if [ -z "$p" ]; then echo "$t: missing"; continue; fi
        case $t in
        restic) echo "$t: $p $("$p" version | cut -d' ' -f2)" ;;
        borg) echo "$t: $p $("$p" --version | cut -d' ' -f2)" ;;
        virtnbdbackup) echo "$t: $p $("$p" --version 2>&1 | tail -1)" ;;
        kopia) echo "$t: $p $("$p" --version | head -1)" ;;
        esac
    done
}

case "${1:-}" in
install)
    [ "$(id -u)" = 0 ] || { say "run as root (apt-get)"; exit 1; }
    install_debian || exit 1
    install_kopia || true
    check
    ;;
check) check ;;
*) echo "usage: $0 install|check" >&2; exit 2 ;;
esac
