#!/usr/bin/env bash
# Create or refresh .venv for this repository.
#   - no GPU: CPU torch==2.13.0;  GPU with a CUDA torch already installed: reuse that torch
#     (venv over the system site-packages);  GPU without torch: PyPI's CUDA build
#   - megatron-core==0.16.1 and the packages of pyproject.toml + sglang-kvc (editable)
#   - torch is pinned through a constraints file so no dependency can pull another build
#   - SPARSE_RL_TORCH=system: reuse $PYTHON's torch whatever it is, GPU seen or not (a CUDA
#     PyTorch image at `docker build` time, where no GPU is visible; docker/Dockerfile sets it)
# Re-running is cheap: it reinstalls only when a pyproject.toml changed.
source "$(dirname "${BASH_SOURCE[0]}")/lib/usage.sh" "$@"  # --help: the header above, nothing else
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
PYTHON="${PYTHON:-python3}"
CPU_TORCH="torch==2.13.0"

log() { echo "[setup] $*" >&2; }

system_cuda_torch() {
  "$PYTHON" - <<'PY' 2>/dev/null
import torch, sys
sys.exit(0 if torch.cuda.is_available() else 1)
PY
}

use_system_torch() {
  case "${SPARSE_RL_TORCH:-auto}" in
    auto) system_cuda_torch ;;
    system) "$PYTHON" -c "import torch" 2>/dev/null \
              || { log "SPARSE_RL_TORCH=system but $PYTHON has no torch"; exit 1; } ;;
    *) log "SPARSE_RL_TORCH=${SPARSE_RL_TORCH}: expected auto or system"; exit 1 ;;
  esac
}

if [[ ! -x "$VENV/bin/python" ]]; then
  if use_system_torch; then
    log "torch found in $PYTHON: creating $VENV on top of the system site-packages"
    "$PYTHON" -m venv --system-site-packages "$VENV"
  else
    log "creating $VENV"
    "$PYTHON" -m venv "$VENV"
  fi
fi
PY="$VENV/bin/python"

if ! "$PY" -c "import torch" 2>/dev/null; then
  "$PY" -m pip install -q --upgrade pip
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    log "GPU present but no CUDA torch: installing PyPI's default (CUDA) torch build"
    "$PY" -m pip install -q torch numpy
  else
    log "installing $CPU_TORCH (CPU build)"
    "$PY" -m pip install -q "$CPU_TORCH" numpy
  fi
fi
# numpy with torch, before torch is first imported: without it torch warns "Failed to
# initialize NumPy" (the project installs numpy anyway, a step later)
"$PY" -c "import numpy" 2>/dev/null || "$PY" -m pip install -q numpy
TORCH_VERSION="$("$PY" -c 'import torch; print(torch.__version__)')"

STAMP="$VENV/.sparse-rl-setup"
WANT="$(cat "$ROOT/pyproject.toml" "$ROOT/sglang-kvc/pyproject.toml" | sha256sum | cut -c1-16) torch=$TORCH_VERSION"
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
  exit 0
fi

CONSTRAINTS="$VENV/constraints.txt"
echo "torch==$TORCH_VERSION" > "$CONSTRAINTS"
log "installing project packages (torch pinned to $TORCH_VERSION)"
LOG="$VENV/setup.log"
if ! "$PY" -m pip install -q -c "$CONSTRAINTS" -e "$ROOT[test]" -e "$ROOT/sglang-kvc" >"$LOG" 2>&1; then
  tail -n 30 "$LOG" >&2
  log "pip install failed (full log: $LOG)"
  exit 1
fi
"$PY" -W ignore -c "import torch, megatron.core, transformers, sglang_kvc, trainer, checkpoint_tools, evaluation" \
  || { log "import check failed"; exit 1; }
[[ "$("$PY" -c 'import torch; print(torch.__version__)')" == "$TORCH_VERSION" ]] \
  || { log "torch changed during install: refusing"; exit 1; }
echo "$WANT" > "$STAMP"
log "ready: $VENV (torch $TORCH_VERSION)"
