#!/usr/bin/env bash
# GGUF -> Hugging Face checkpoint (bf16 safetensors, tokenizer + chat template):
#   ./scripts/gguf2hf.sh --gguf model.Q4_1.gguf --output-dir models/MyModel [--dtype bfloat16]
# Llama / Qwen2 / Qwen3 GGUFs, F32/F16/BF16 and Q4_0..Q8_0 / K-quant tensors (dequantized).
# Every flag: `.venv/bin/python -m checkpoint_tools.gguf2hf --help`.
source "$(dirname "${BASH_SOURCE[0]}")/lib/usage.sh" "$@"  # --help: the header above, nothing else
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
[[ -x "$ROOT/.venv/bin/python" ]] || "$ROOT/scripts/setup.sh"
export PYTHONWARNINGS="${PYTHONWARNINGS:-ignore}"
exec "$ROOT/.venv/bin/python" -m checkpoint_tools.gguf2hf "$@"
