#!/usr/bin/env bash
# Create .venv and install Spillway with everything its tests and examples use (idempotent).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "creating .venv" >&2
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
echo "installing spillway[dev] into .venv (first run downloads ~400 MB)" >&2
.venv/bin/python -m pip install -q -e '.[dev]'
PYTHON=.venv/bin/python bash scripts/fetch-tools.sh >/dev/null
# Headless Chromium for the demo report's browser test (Debian's package, where apt and root are there).
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  echo "installing chromium (apt) for the demo report's browser test" >&2
  if ! { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null; }; then
    echo "warning: chromium could not be installed; the report's browser test will be skipped" >&2
  fi
fi
# A real redis-server for the shared-state tests (Debian's package, where apt and root are there;
# else those tests skip, saying why). Only the binary is used: the tests start their own servers.
if ! command -v redis-server >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  echo "installing redis-server (apt) for the shared-state tests" >&2
  if ! { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q redis-server >/dev/null; }; then
    echo "warning: redis-server could not be installed; the shared-state tests will be skipped" >&2
  fi
fi
# A real Apache APISIX 3.18 for the gateway tests, the demo and the benchmarks (root and apt; else
# those tests skip, saying why).
bash scripts/install-apisix.sh
