#!/usr/bin/env bash
# Set up .venv if needed, then run the test suite. Extra arguments go to pytest
# (e.g. ./scripts/test.sh -m slow, ./scripts/test.sh tests/checkpoint_tools -k roundtrip).
# With no arguments (the default suite) the files are shared among TEST_WORKERS processes
# (pytest-xdist; default: the cores, at most 4), each file whole on one worker and each worker's
# torch on cores / workers threads. TEST_WORKERS=1 runs everything in this one process.
# pytest's own flags: `.venv/bin/python -m pytest --help`.
source "$(dirname "${BASH_SOURCE[0]}")/lib/usage.sh" "$@"  # --help: the header above, nothing else
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/setup.sh"
cd "$ROOT"
ARGS=("$@")
CORES="$(nproc 2>/dev/null || echo 1)"
WORKERS="${TEST_WORKERS:-$(( CORES < 4 ? CORES : 4 ))}"
if [[ $# -eq 0 && "$WORKERS" -gt 1 ]]; then
  THREADS=$(( CORES / WORKERS > 0 ? CORES / WORKERS : 1 ))
  export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$THREADS}"
  ARGS=(-n "$WORKERS" --dist loadfile)
fi
exec "$ROOT/.venv/bin/python" -m pytest ${ARGS[@]+"${ARGS[@]}"}
