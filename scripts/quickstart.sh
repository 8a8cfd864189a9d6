#!/usr/bin/env bash
# Set up .venv if needed, then run the tiny end-to-end job.
# Today: the checkpoint conversion demo (HF -> torch_dist -> Megatron TP=1/TP=2 -> HF).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/setup.sh"
cd "$ROOT"
# Megatron and torch.distributed warn about missing TE/Apex and deprecated internals: noise here.
export PYTHONWARNINGS="${PYTHONWARNINGS:-ignore::UserWarning,ignore::FutureWarning,ignore::DeprecationWarning}"
exec "$ROOT/.venv/bin/python" -m checkpoint_tools.demo "$@"
