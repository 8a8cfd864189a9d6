#!/usr/bin/env bash
# Issue 68's decode mystery, one GPU call: the speed lane's engine_decode piece read a 6.5 ms
# GPU step for every config (dense, R-KV, FP8) where issue 60 read ~0.8 ms on the same shape.
# This runs the same decode benchmark (0.5B shape, batch 256, 128-token prompts, 512 tokens,
# T 1 with log-probs, overlap, 2 repeats) five ways and prints one table side by side:
#   before_own_*   BEFORE_DIR's own engine/throughput.py and engine (issue 60's path; one
#                  process per config: its driver has no --configs)
#   before_driver  this tree's driver (--configs dense,rkv, the graph timer) on BEFORE_DIR's engine
#   after          this tree's driver and engine
#   after_syncs    the same with --count-syncs (its counted run comes after each config's timed
#                  runs: a sync-debug mode left on would slow the next config's)
#   after_notimer  dense alone, without the CUDA events around each replay (step_probes.GraphTimer)
# before_own vs before_driver isolates the benchmark path, before_driver vs after the engine's
# changes, after vs after_syncs --count-syncs, after vs after_notimer the graph timer. The two
# driver runs also profile 16 decode steps (--profile): kernels per step and their GPU time
# (OUT/*_profile/engine_kernels.txt, the last config's; both in the run's log). Package versions,
# the GPU's clocks, power, throttle reasons and other processes before and after: OUT/environment_*.txt.
#
#   bash benchmarks/studies/decode_ab.sh BEFORE_DIR OUT_DIR
# What the CPU found first (tiny shape, e96a021's engine against this one, same driver): the same
# torch ops per decode step (eager 247 dense / 279 R-KV; with graphs emulated, 266 / 272 inside
# the replayed body and 9 / 35 outside, every decode step replayed, none eager, no capture in a
# warm run) and the same tokens. The GPU runs did not agree on tokens: issue 60's H200 run and
# the H100 run began [0, 61141, ...] (first ids), issue 68's slow one [36354, 7962, ...]. The
# first ids column says whether this call's runs compute the same thing.
#
# BEFORE_DIR: an extracted `git archive e96a021` tree. Environment: PYTHON (python3), SMOKE=1
# (tiny shape on a CPU: the plumbing, measuring nothing; before_own_* is skipped there, its
# driver needs a GPU), RUN_S (each process's limit, 150). ~5-6 minutes on an H200 (six processes,
# each building the random 0.5B checkpoint and compiling its kernels); OUT/summary.md is
# rewritten after every run.
set -uo pipefail

BEFORE="${1:?usage: benchmarks/studies/decode_ab.sh BEFORE_DIR OUT_DIR}"
OUT="${2:?usage: benchmarks/studies/decode_ab.sh BEFORE_DIR OUT_DIR}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BEFORE="$(cd "$BEFORE" && pwd)" || exit 2
[[ -d "$BEFORE/sglang-kvc/sglang_kvc" ]] || { echo "decode_ab.sh: $BEFORE holds no sglang-kvc/sglang_kvc" >&2; exit 2; }
PY="${PYTHON:-python3}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
export PYTHONWARNINGS=ignore
export CUDA_DEVICE_MAX_CONNECTIONS="${CUDA_DEVICE_MAX_CONNECTIONS:-1}"  # as the speed lane sets it

if [[ "${SMOKE:-0}" == 1 ]]; then
    SHAPE=(--shape tiny --batch 8 --prompt-len 16 --output-len 24 --device cpu)
    RKV=(--kv-budget 12 --compress-divide-length 4)
else
    SHAPE=(--shape qwen2.5-0.5b --batch 256 --prompt-len 128 --output-len 512)
    RKV=(--kv-budget 128 --compress-divide-length 64)
fi
RUN_S="${RUN_S:-150}"  # each process's limit (SMOKE: a shared CPU is slow)
[[ "${SMOKE:-0}" == 1 ]] && RUN_S=600
COMMON=("${SHAPE[@]}" --repeats 2 --temperature 1 --logprobs --skip-hf --modes overlap "${RKV[@]}")

environment() {
    # what could differ between two GPU calls with the same code: packages (the random weights
    # come from transformers' init), the GPU's clocks, power and throttling, other processes
    "$PY" -c 'import torch, transformers
try:
    import triton; tv = triton.__version__
except ImportError:
    tv = None
print("torch", torch.__version__, "cuda", torch.version.cuda, "triton", tv, "transformers", transformers.__version__)'
    env | grep -E '^(CUDA|TORCH|TRITON|PYTORCH|SGLANG|NCCL)' | sort
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,pstate,clocks.sm,clocks.max.sm,clocks.mem,power.draw,power.limit,temperature.gpu,utilization.gpu,memory.used,clocks_throttle_reasons.active --format=csv
    command -v nvidia-smi >/dev/null && nvidia-smi --query-compute-apps=pid,name,used_memory --format=csv
}

weights() {
    # the random checkpoint's scale as this environment builds it (issue 60's tokens fit a nearly
    # flat distribution, as small weights give; this environment's weights have std 0.1 on a CPU)
    (cd "$ROOT" && PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PY" -c 'import sys, tempfile, torch
from pathlib import Path
from safetensors import safe_open
from benchmarks.common.checkpoint import build_checkpoint
with tempfile.TemporaryDirectory() as d:
    build_checkpoint(sys.argv[1], Path(d), 0, torch.bfloat16)
    with safe_open(next(str(f) for f in Path(d).glob("*.safetensors")), "pt") as f:
        for name in sorted(f.keys())[:4]:
            t = f.get_tensor(name).float()
            print(f"{name}: std {t.std().item():.4f}, max |x| {t.abs().max().item():.3f}")' "$1")
}

run() {
    # run NAME TREE_OF_DRIVER TREE_OF_ENGINE ARGS...: one benchmark process, its JSON as OUT/NAME.json
    local name=$1 driver=$2 engine=$3 begin=$SECONDS rc
    shift 3
    echo "=== $name at $(date +%H:%M:%S): engine $(cd "$driver" && PYTHONPATH="$driver:$engine/sglang-kvc${PYTHONPATH:+:$PYTHONPATH}" "$PY" \
        -c 'import sglang_kvc; print(sglang_kvc.__file__)')"  # (an editable install must not win)
    (cd "$driver" && PYTHONPATH="$driver:$engine/sglang-kvc${PYTHONPATH:+:$PYTHONPATH}" timeout -k 15 "$RUN_S" "$PY" \
        -m benchmarks.engine.throughput "${COMMON[@]}" "$@" --json "$OUT/$name.json") >"$OUT/$name.log" 2>&1
    rc=$?
    echo "exit $rc after $((SECONDS - begin)) s"
    ((rc == 0)) || grep -v -i warn "$OUT/$name.log" | cut -c1-240 | tail -n 15
    summary >/dev/null  # after every run: a call cut short keeps the table of those done
}

summary() {
    (cd "$ROOT" && PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m benchmarks.studies.decode_ab_summary "$OUT") >"$OUT/summary.md"
    cat "$OUT/summary.md"
}

{ environment; weights "${SHAPE[1]}"; } 2>&1 | grep -v -i "writing model shards" | tee "$OUT/environment_before.txt"
if [[ "${SMOKE:-0}" == 1 ]]; then
    echo "=== before_own_*: skipped (SMOKE: BEFORE_DIR's driver needs a GPU)"
else
    run before_own_dense "$BEFORE" "$BEFORE" --compress none
    run before_own_rkv "$BEFORE" "$BEFORE" --compress rkv
fi
run before_driver "$ROOT" "$BEFORE" --configs dense,rkv --profile "$OUT/before_driver_profile"
run after "$ROOT" "$ROOT" --configs dense,rkv --profile "$OUT/after_profile"
run after_syncs "$ROOT" "$ROOT" --configs dense,rkv --count-syncs
run after_notimer "$ROOT" "$ROOT" --configs dense --no-graph-timer
environment >"$OUT/environment_after.txt" 2>&1

summary
