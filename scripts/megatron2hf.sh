#!/usr/bin/env bash
# Megatron torch_dist -> HF safetensors, with slime's argument names:
#   ./scripts/megatron2hf.sh --load /ckpt/run1 --output-dir /models/run1-hf \
#       --origin-hf-dir /models/Qwen2.5-3B [--vocab-size 151936] [--chunk-size 5]
# --load takes the --save root (latest_checkpointed_iteration.txt) or an iter_XXXXXXX dir.
# Every flag: `.venv/bin/python -m checkpoint_tools.megatron2hf --help`.
source "$(dirname "${BASH_SOURCE[0]}")/lib/usage.sh" "$@"  # --help: the header above, nothing else
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
[[ -x "$ROOT/.venv/bin/python" ]] || "$ROOT/scripts/setup.sh"
# Megatron and torch.distributed warn about missing TE/Apex and deprecated internals: noise here.
export PYTHONWARNINGS="${PYTHONWARNINGS:-ignore::UserWarning,ignore::FutureWarning,ignore::DeprecationWarning}"
exec "$ROOT/.venv/bin/python" -m checkpoint_tools.megatron2hf "$@"
