#!/usr/bin/env bash
# The trainer's speed at the recipe's shape on one GPU, in one go (about 5 minutes on an H100;
# docs/benchmarks.md, "The trainer's speed inside the run"), most important first:
#   1. training/profile_train_step.py: the run's update path against train_step.py's train step
#      at --max-tokens-per-gpu 8192 and 16384 (0.5B shape, ~1.2k-token samples, 232-token prompt),
#      the run's own perf/ metrics, and where an update's time goes (torch.profiler);
#   2. training/sparse_recompute.py: replay (flex) against dense (0.5B at 4k, budget 512), with
#      the kernel families of each (--profile);
#   3. training/train_step.py at 8192 and 16384, the issue's measurement (profile_train_step's
#      "bench" numbers are the same train step on the same samples: the fallback if time cuts these);
#   4. training/logprob_kernels.py: lm head + log-probs, the trainer's path against
#      cut-cross-entropy and liger-kernel when importable.
# Each step's JSON and log go to OUT_DIR; a step is cut at its limit or at the suite's
# TOTAL_S (300) and the next one still runs when time is left.
#   benchmarks/training/speed_suite.sh OUT_DIR [WHEEL_DIR]
# WHEEL_DIR: wheels installed into OUT_DIR/wheels without the network (--no-deps --no-index),
# e.g. made beforehand with `python -m pip download --no-deps liger-kernel cut-cross-entropy -d DIR`.
set -uo pipefail

OUT="${1:?usage: benchmarks/training/speed_suite.sh OUT_DIR [WHEEL_DIR]}"
WHEELS="${2:-}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY="${PYTHON:-python}"
if [[ -x "$ROOT/.venv/bin/python" && -z "${PYTHON:-}" ]]; then
    PY="$ROOT/.venv/bin/python"
fi
TOTAL_S="${TOTAL_S:-300}"
START=$SECONDS
mkdir -p "$OUT"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONWARNINGS=ignore
if [[ -n "$WHEELS" ]]; then
    "$PY" -m pip install -q --no-deps --no-index --target "$OUT/wheels" "$WHEELS"/*.whl \
        && export PYTHONPATH="$PYTHONPATH:$OUT/wheels"
fi

step() {
    # step NAME LIMIT_S -m MODULE ARGS...: run with the smaller of its limit and the time left
    local name=$1 limit=$2 left=$((TOTAL_S - (SECONDS - START)))
    shift 2
    if ((left < 20)); then
        echo "=== $name: skipped (suite time spent)"
        return
    fi
    ((limit > left)) && limit=$left
    echo "=== $name (limit ${limit} s)"
    (cd "$ROOT" && timeout "$limit" "$PY" "$@" --json "$OUT/$name.json") >"$OUT/$name.log" 2>&1
    echo "exit $? after $((SECONDS - START)) s; last lines of $OUT/$name.log:"
    grep -v -i "warn" "$OUT/$name.log" | tail -n 30
}

step profile_train_step 170 -m benchmarks.training.profile_train_step --seqs-per-step 128 --steps 2 \
    --max-tokens-per-gpu 8192 16384
step bench_sparse_recompute 100 -m benchmarks.training.sparse_recompute --seqs-per-step 8 --steps 2 \
    --profile
for budget in 8192 16384; do
    step "bench_train_$budget" 45 -m benchmarks.training.train_step --seq-len 1200 --prompt-len 232 \
        --vary-lengths --seqs-per-step 128 --max-tokens-per-gpu "$budget" --steps 2 --warmup 1
done
step bench_logprob_kernels 40 -m benchmarks.training.logprob_kernels --tokens 8192 16384
echo "suite done in $((SECONDS - START)) s; JSON in $OUT"
