#!/usr/bin/env bash
# Set up .venv if needed, then run the tiny end-to-end job: a tiny model learns step-by-step
# addition with GRPO on R-KV sparse rollouts (in-process sglang-kvc engine, Megatron trainer,
# sparse-rollout correction). CPU by default; uses the GPU when there is one.
# Extra arguments go to `python -m trainer.quickstart` (e.g. --num-rollout 20, --workdir DIR);
# `.venv/bin/python -m trainer.quickstart --help` lists them (this script's --help prints only this).
source "$(dirname "${BASH_SOURCE[0]}")/lib/usage.sh" "$@"  # --help: the header above, nothing else
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/setup.sh"
cd "$ROOT"
# Megatron and torch.distributed warn about missing TE/Apex and deprecated internals: noise here.
export PYTHONWARNINGS="${PYTHONWARNINGS:-ignore::UserWarning,ignore::FutureWarning,ignore::DeprecationWarning}"
# an interrupt's line and flag errors name this script (the same command resumes)
SPARSE_RL_COMMAND="${SPARSE_RL_COMMAND:-$(printf '%q ' "$0" "$@")}"
export SPARSE_RL_COMMAND="${SPARSE_RL_COMMAND% }"
exec "$ROOT/.venv/bin/python" -m trainer.quickstart "$@"
