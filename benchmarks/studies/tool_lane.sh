#!/usr/bin/env bash
# Issue 66's tool lane on one GPU: the lookup-tool task (dataset/lookup_tool.py), dense RL over
# several seeds (each seed's own warm-up, shared by its configs) and R-KV 64 across turns (the
# prompt kept, sparse_rl) side by side on the GPU under MPS, 32 prompts x 8 samples a rollout,
# for as many rollouts as TOTAL_S allows (60 at most), greedy evaluation of 256 held-out prompts
# at rollout 0 and every 10 (benchmarks/studies/tool_lane.py).
#   bash benchmarks/studies/tool_lane.sh OUT_DIR              # in the foreground (~TOTAL_S + 1 min)
#   bash benchmarks/studies/tool_lane.sh start OUT_DIR        # detached (setsid), returns at once
#   bash benchmarks/studies/tool_lane.sh poll SECONDS OUT_DIR # waits up to SECONDS for it, prints progress
# OUT_DIR gets summary.md (each seed's greedy held-out gain and the mean gain with a 95% t-interval
# over the seeds; per run reward first -> last, greedy accuracy by rollout, turns, calls, tool
# errors, KV pool peak and its ratio to dense's, tokens/s), curves.png, metrics.jsonl (every
# run's rows with its config), lane.json, lane.log, logs.txt (each run's log tail), gpu.txt, exit.txt.
# Environment (all optional):
#   TOTAL_S=540     the lane's time from start (model, warm-ups and runs); the runs still going are
#                   stopped at it and reported as far as they got
#   SEEDS="1 2 3"   the seeds of every config that names none
#   CONFIGS="dense rkv:64:sparse_rl@1"   CONFIG or CONFIG@S,S (its own seeds); CONFIG+pinturns
#                   pins every turn's prompt, tool responses included (e.g. rkv:64:sparse_rl+pinturns@1)
#   PROMPTS=32  LR=2e-5  EVAL_INTERVAL=10  EVAL_PROMPTS=256  WARMUP_STEPS (default the task's 12)
#   WORK=runs/tool_lane  run folders, the model (from .gpu/*smollm2*.whl or its .aa/.ab pieces)
#   MODEL_DIR       an HF SmolLM2-135M-Instruct instead of the wheel
#   SMOKE=1         the CPU dry run: the tiny model, dense seeds 1 and 2 and R-KV 96 seed 1,
#                   2 rollouts, 4 eval prompts
#   PYTHON=python3  the interpreter (the repo and sglang-kvc/ are put on PYTHONPATH)
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT" || exit 2
read -ra PY <<<"${PYTHON:-python3}"
export PYTHONPATH="$ROOT:$ROOT/sglang-kvc${PYTHONPATH:+:$PYTHONPATH}" PYTHONWARNINGS=ignore
export CUDA_DEVICE_MAX_CONNECTIONS="${CUDA_DEVICE_MAX_CONNECTIONS:-1}"  # as the run scripts set it
export PYTORCH_CUDA_ALLOC_CONF="${PYTORCH_CUDA_ALLOC_CONF-expandable_segments:True}"  # runs share the GPU
TOTAL_S="${TOTAL_S:-540}"
WORK="${WORK:-runs/tool_lane}"
USAGE="usage: benchmarks/studies/tool_lane.sh OUT_DIR | start OUT_DIR | poll SECONDS OUT_DIR"

source "$ROOT/benchmarks/common/smollm2_wheel.sh"  # wheel_base

lane_args() {
    LANE=(--out "$1" --work "$WORK" --total-s "$TOTAL_S" --eval-interval "${EVAL_INTERVAL:-10}"
          --eval-prompts "${EVAL_PROMPTS:-256}" --prompts "${PROMPTS:-32}" --lr "${LR:-2e-5}")
    [[ -n "${WARMUP_STEPS:-}" ]] && LANE+=(--warmup-steps "$WARMUP_STEPS")
    if [[ "${SMOKE:-0}" == 1 ]]; then
        LANE+=(--smoke --seeds ${SEEDS:-1 2} --configs ${CONFIGS:-dense rkv:96:sparse_rl@1})
        return 0
    fi
    LANE+=(--seeds ${SEEDS:-1 2 3} --configs ${CONFIGS:-dense rkv:64:sparse_rl@1})
    if [[ -n "${MODEL_DIR:-}" ]]; then
        LANE+=(--model-dir "$MODEL_DIR")
    elif [[ -n "$(wheel_base)" ]]; then
        LANE+=(--smollm2-wheel "$(wheel_base)")
    elif [[ -f "$WORK/setup/SmolLM2-135M-Instruct/model.safetensors" ]]; then
        LANE+=(--model-dir "$WORK/setup/SmolLM2-135M-Instruct")
    else
        echo "tool_lane.sh: error: no .gpu/*smollm2*.whl(.aa/.ab) and no MODEL_DIR to build the model from" >&2
        return 2
    fi
}

run_lane() {
    local out="$1" begin=$SECONDS rc
    mkdir -p "$out" && out="$(cd "$out" && pwd)"
    lane_args "$out" || return 2
    echo "[tool-lane] $(date -u +%Y-%m-%dT%H:%M:%SZ) TOTAL_S=$TOTAL_S ${PY[*]} -m benchmarks.studies.tool_lane ${LANE[*]}"
    nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv 2>/dev/null >"$out/gpu.txt"
    if command -v nvidia-cuda-mps-control >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
        nvidia-cuda-mps-control -d 2>/dev/null && echo "[tool-lane] MPS daemon started"
    fi
    timeout -k 30 $((TOTAL_S + 90)) "${PY[@]}" -m benchmarks.studies.tool_lane "${LANE[@]}"
    rc=$?
    for log in "$WORK"/lookup-tool/*/run.log; do  # each run's last lines (the whole logs stay in WORK)
        [[ -f "$log" ]] && { echo "=== $log"; grep -v -i warn "$log" | cut -c1-300 | tail -n 30; }
    done >"$out/logs.txt"
    nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader 2>/dev/null | sed 's/^/after: /' >>"$out/gpu.txt"
    echo "[tool-lane] exit $rc after $((SECONDS - begin)) s; summary: $out/summary.md"
    [[ -f "$out/summary.md" ]] && cat "$out/summary.md"
    echo "$rc" >"$out/exit.txt"
    return "$rc"
}

start() {
    local out="${1:?$USAGE}"
    mkdir -p "$out" && out="$(cd "$out" && pwd)"
    rm -f "$out/exit.txt" "$out/lane.log"  # the foreground lane writes lane.log itself
    setsid bash "$ROOT/benchmarks/studies/tool_lane.sh" "$out" >/dev/null 2>&1 </dev/null &
    echo "[tool-lane] started (pid $!), log $out/lane.log; poll: bash benchmarks/studies/tool_lane.sh poll SECONDS $out"
}

poll() {
    local seconds="${1:?$USAGE}" out="${2:?$USAGE}" waited=0
    while [[ ! -f "$out/exit.txt" ]] && ((waited < seconds)); do
        sleep 15
        waited=$((waited + 15))
        echo "[tool-lane] ${waited} s: $(grep '^\[tool-lane\]' "$out/lane.log" 2>/dev/null | tail -n 1 | cut -c1-200)"
    done
    if [[ -f "$out/exit.txt" ]]; then
        tail -n 40 "$out/lane.log"
        return "$(cat "$out/exit.txt")"
    fi
    echo "[tool-lane] still running after ${seconds} s"
    return 3
}

case "${1:-}" in
    "") echo "$USAGE" >&2; exit 2 ;;
    start) shift; start "$@" ;;
    poll) shift; poll "$@" ;;
    -h|--help) sed -n '2,25p' "$0" ;;
    *) run_lane "$1" 2>&1 | tee -a "$(mkdir -p "$1" && cd "$1" && pwd)/lane.log"; exit "${PIPESTATUS[0]}" ;;
esac
