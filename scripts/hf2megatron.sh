#!/usr/bin/env bash
# HF safetensors -> Megatron torch_dist, with slime's argument names:
#   ./scripts/hf2megatron.sh --hf-checkpoint /models/Qwen2.5-3B --save /models/Qwen2.5-3B_torch_dist \
#       [--tensor-model-parallel-size 2] [--pipeline-model-parallel-size 1] [--padded-vocab-size N]
# Loads at any TP/PP afterwards. Every flag: `.venv/bin/python -m checkpoint_tools.hf2megatron --help`.
source "$(dirname "${BASH_SOURCE[0]}")/lib/usage.sh" "$@"  # --help: the header above, nothing else
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
[[ -x "$ROOT/.venv/bin/python" ]] || "$ROOT/scripts/setup.sh"
# Megatron and torch.distributed warn about missing TE/Apex and deprecated internals: noise here.
export PYTHONWARNINGS="${PYTHONWARNINGS:-ignore::UserWarning,ignore::FutureWarning,ignore::DeprecationWarning}"
exec "$ROOT/.venv/bin/python" -m checkpoint_tools.hf2megatron "$@"
