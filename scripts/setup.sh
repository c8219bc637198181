#!/usr/bin/env bash
# Create .venv and install Spillway with everything its tests and examples use (idempotent).
# Outside CI a component that cannot be installed (no root or apt) is a warning, and its tests skip
# saying why; in CI (CI=true) it is an error, since those tests must run there.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

in_ci() { case "${CI:-}" in [Tt][Rr][Uu][Ee] | 1) return 0 ;; *) return 1 ;; esac; }

# apt_component COMMAND PACKAGE WHAT-NEEDS-IT: Debian's package, where apt and root are there.
apt_component() {
  command -v "$1" >/dev/null 2>&1 && return 0
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "installing $2 (apt) for $3" >&2
    { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$2" >/dev/null; } || true
  fi
  command -v "$1" >/dev/null 2>&1 && return 0
  if in_ci; then
    echo "error: $2 could not be installed (it needs root and apt on Debian 12); CI must run $3" >&2
    exit 1
  fi
  echo "warning: $2 could not be installed (it needs root and apt); $3 will be skipped" >&2
}

if [ ! -x .venv/bin/python ]; then
  echo "creating .venv" >&2
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
echo "installing spillway[dev] into .venv (first run downloads ~400 MB)" >&2
.venv/bin/python -m pip install -q -e '.[dev]'
PYTHON=.venv/bin/python bash scripts/fetch-tools.sh >/dev/null
# Headless Chromium for the demo report's browser test.
apt_component chromium chromium "the report's browser tests"
# A real redis-server for the shared-state tests. Only the binary is used: the tests start their
# own servers.
apt_component redis-server redis-server "the shared-state tests"
# redis-cli makes the Redis Cluster of the failover tests (redis-cli --cluster create); Debian's
# redis-server depends on it, but another source of redis-server may come without it.
apt_component redis-cli redis-tools "the Redis Cluster tests"
# Sentinel for the shared-state failover tests (Redis Cluster needs only redis-server and redis-cli),
# and etcd for APISIX's traditional deployment (several nodes, routes from the Admin API): the
# tests start their own on loopback.
apt_component redis-sentinel redis-sentinel "the Sentinel failover tests"
apt_component etcd etcd-server "the multi-node APISIX tests (tests/integration/test_apisix_nodes.py)"
# A real DNS server for the on-prem discovery tests (dnsmasq answers a headless Service's records on
# loopback; only the binary is used).
apt_component dnsmasq dnsmasq-base "the on-prem discovery tests (tests/integration/test_local_discovery.py)"
# A real Prometheus and promtool for the monitoring tests (rules, dashboards' queries, the bill) and
# the demo. Only the binaries are used: the tests and the demo start their own on loopback.
apt_component prometheus prometheus "the monitoring tests"
# A C compiler for the Lambda image's /dev/shm shim (images/aws-lambda/shm_redirect.c).
apt_component cc gcc "the Lambda image's shim tests"
# buildah (builds the function images without a daemon or a registry), mmdebstrap (their stand-in
# bases from Debian's packages), podman with runc and slirp4netns (runs them as Lambda and FC would).
for tool in buildah mmdebstrap podman runc slirp4netns; do
  apt_component "$tool" "$tool" "the image tests (tests/integration/test_images_*.py)"
done
# kubectl renders the Kubernetes manifests (its built-in kustomize) for their offline validation:
# Debian 12 packages it as kubernetes-client (1.20), whose kustomize renders them as 1.32's does.
apt_component kubectl kubernetes-client "the Kubernetes manifests' tests (tests/unit/test_kubernetes_manifests.py)"
# A real Apache APISIX 3.18 for the gateway tests, the demo and the benchmarks (root and apt).
bash scripts/install-apisix.sh
