#!/usr/bin/env bash
# Set up, lint, type-check and run the whole test suite (unit, property and integration tests
# against a real tritonserver and the official Lambda runtime emulator).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
echo "== ruff" >&2
ruff check .
ruff format --check .
echo "== mypy" >&2
mypy
echo "== pytest" >&2
pytest "$@"
