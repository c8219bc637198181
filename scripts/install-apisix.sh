#!/usr/bin/env bash
# Install a real Apache APISIX 3.18 for the tests, the demo and the benchmarks (idempotent).
# Needs root and apt (Debian 12's nginx and lua packages); elsewhere it says so and exits 0, and the
# tests that need APISIX skip with that reason, except in CI (CI=true), where it exits 1: the
# tests must run there. PREFIX: $SPILLWAY_APISIX_PREFIX, default
# /opt/spillway-apisix (at most 70 characters: APISIX puts Unix sockets under it; APISIX refuses to
# run under /root).
set -euo pipefail
cd "$(dirname "$0")/.."
PREFIX=${SPILLWAY_APISIX_PREFIX:-/opt/spillway-apisix}
TESTBED=third_party/apisix-testbed
STAMP="$PREFIX/.spillway-installed-$(sha256sum "$TESTBED/vendor/SHA256SUMS" "$TESTBED/install.sh" "$TESTBED"/vendor/patches/*.patch | sha256sum | cut -c1-16)"

if [ -e "$STAMP" ] && [ -x "$PREFIX/bin/apisix" ]; then
    echo "APISIX already installed in $PREFIX" >&2
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1 || [ ! -f /etc/debian_version ]; then
    case "${CI:-}" in
    [Tt][Rr][Uu][Ee] | 1)
        echo "error: cannot install APISIX: it needs root and apt on Debian 12, and CI must run the real-APISIX tests" >&2
        exit 1
        ;;
    esac
    echo "not installing APISIX: it needs root and apt on Debian 12 (the real-APISIX tests will skip)" >&2
    exit 0
fi
echo "installing APISIX 3.18 into $PREFIX (about 30 s)" >&2
mkdir -p "$PREFIX"
bash "$TESTBED/install.sh" "$PREFIX" >"$PREFIX/install.log" 2>&1 || {
    tail -30 "$PREFIX/install.log" >&2
    echo "APISIX install failed; the log is $PREFIX/install.log" >&2
    exit 1
}
touch "$STAMP"
