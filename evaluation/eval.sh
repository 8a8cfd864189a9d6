#!/usr/bin/env bash
# Score a served model on math benchmarks. All arguments go to `python -m evaluation.run_eval`
# (run with --help for the list). Example:
#   bash evaluation/eval.sh --url http://127.0.0.1:30000 --benchmarks math500,aime24,amc23 \
#       --prompt-template qwen-boxed --output-dir runs/eval/qwen2.5-3b-step100
# Uses the repository's .venv when present, else `python` from PATH (override with $PYTHON).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x "$ROOT/.venv/bin/python" ]]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python; fi
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
exec "$PYTHON" -m evaluation.run_eval "$@"
