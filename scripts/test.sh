#!/usr/bin/env bash
# Set up .venv if needed, then run the test suite. Extra arguments go to pytest
# (e.g. ./scripts/test.sh -m slow, ./scripts/test.sh tests/checkpoint_tools -k roundtrip).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/setup.sh"
cd "$ROOT"
exec "$ROOT/.venv/bin/python" -m pytest "$@"
