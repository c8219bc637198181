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
