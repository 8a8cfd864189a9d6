#!/usr/bin/env bash
# Issue 60's measurements on one GPU (docs/benchmarks.md, "The RL step at full speed by
# default"), most important first, each piece under `timeout` and the lane's TOTAL_S:
#   engine_decode        engine/throughput.py --configs dense,rkv,dense@fp8_e4m3,rkv@fp8_e4m3 on
#                        the ril_* shape, overlap and sequential on one engine per config (issue
#                        68): step ms, host ms, graph GPU ms and syncs per decode step, graph
#                        captures per engine life, each config's step over dense's (~2-3 min)
#   decode4k             studies/rollout_split.py (issue 68): ONE rollout of 32 x 8 samples, answers
#                        up to 4,096 (long4k's engine, pool, lengths and sampling), dense and R-KV
#                        512, its wall split: prefill, decode steps with host / GPU ms a step,
#                        compression events, assembly of the results, graph captures; kernel
#                        tables (top 25) over 16 decode steps at ~2k context and over one
#                        compression event in OUT/decode4k_profile (~2 min)
#   ril_dense, ril_rkv   training/rollout_in_loop.py: the rollout phase inside the run (0.5B, 32 x 8
#                        samples, ~128-token prompts, 512-token answers) against the same engine
#                        alone on the same requests, broken down; the KV pool and the trainer's
#                        micro-batch as the run scripts leave them (pool from the memory
#                        fraction, micro-batch from free memory: printed)
#   oom_3b               training/rl_step.py at the R-KV run script's settings (pool from
#                        --sglang-mem-fraction-static 0.7, KL reference, sparse_rl correction,
#                        memory-sized micro-batch) on 32 samples of ~2.3k tokens (a step's
#                        peak is one micro-batch's, whatever their number): no OOM?
#   replay               training/sparse_recompute.py: flex (the one replay path kept) against
#                        dense (0.5B, 4k, budget 512), recompute, update and the rollout's
#                        both, min / median / max of 3 repeats
#   engine_dense, engine_rkv  engine/throughput.py on the same shape as ril_* (B 256, P 128, O 512,
#                        T 1 with log-probs): the engine's own figure and its HBM roofline
#   oom_1.5b             as oom_3b on the 1.5B shape
#   long4k, long8k       studies/long_rollout.py at 4,096 / 8,192 (LONG_CONFIGS, LONG8K_CONFIGS):
#                        dense and R-KV on-policy (2 timed steps) and one step off-policy ("+s1":
#                        --max-staleness 1, the engine in its own process; 4 timed steps), the
#                        steady state over the timed steps after the first, trainer at the
#                        memory-sized micro-batch; a piece cut at its limit keeps its rows
#   weights_smollm2, weights_3b  engine/weight_sync.py (issue 68): the trainer's weights to one
#                        sglang-kvc server process at the SmolLM2-135M and Qwen2.5-3B shapes, the
#                        median push split by phase: "auto" first (what --rollout-server-urls
#                        builds: NCCL with the server on a second GPU, CUDA IPC with it on the
#                        trainer's one GPU), then the explicit modes; "weights_servers" names both
# then studies/speed_lane_summary.py writes OUT_DIR/summary.md from the pieces' JSON.
#
#   bash benchmarks/studies/speed_lane.sh OUT_DIR
# All of it is more than one call's TOTAL_S: the defaults run the pieces in the order of PARTS
# and skip what does not fit; a second call with PARTS="the skipped ones" runs the rest. Issue
# 68 on one H200, two calls of <= 600 s (estimates from 2026-11-28's long4k: ~55 s of start-up
# and warm-up per config, then its steps):
#   PARTS="long4k weights_smollm2 replay" TOTAL_S=560 bash benchmarks/studies/speed_lane.sh OUT1
#       long4k ~430 s (dense 2 x ~19 s, rkv:512 2 x ~14 s, dense+s1 and rkv:512+s1 4 steps each),
#       weights_smollm2 ~60 s, replay (~120 s) if the lane has its 90 s left, else in the next
#   PARTS="long8k replay" TOTAL_S=560 bash benchmarks/studies/speed_lane.sh OUT2   (~400 s)
# Where the 4k rollout's step time goes (issue 68, 2026-11-29), one call of <= 300 s (estimate:
# ~60 s of start-up and warm-up per config, the rollout ~11 s, the profiled one ~10 s):
#   PARTS=decode4k TOTAL_S=300 bash benchmarks/studies/speed_lane.sh OUT3
# Environment: PARTS (pieces, in order), TOTAL_S (560, SMOKE 1800: a piece starts only with its
# least useful time left, 30 s to 240 s, and is cut at the lane's end), PYTHON (python3),
# LONG_CONFIGS, LONG8K_CONFIGS (long4k's / long8k's configs), SMOKE=1 (tiny shapes on a CPU: the
# lane end to end, measuring nothing).
set -uo pipefail

OUT="${1:?usage: benchmarks/studies/speed_lane.sh OUT_DIR}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY="${PYTHON:-python3}"
SMOKE="${SMOKE:-0}"
TOTAL_S="${TOTAL_S:-$([[ "$SMOKE" == 1 ]] && echo 1800 || echo 560)}"  # a shared CPU is slow
PARTS="${PARTS:-decode4k long4k weights_smollm2 replay long8k engine_decode weights_3b ril_dense ril_rkv oom_3b engine_dense engine_rkv oom_1.5b}"
PARTS="${PARTS//weights_servers/weights_smollm2 weights_3b}"
START=$SECONDS
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$ROOT:$ROOT/sglang-kvc" PYTHONWARNINGS=ignore
export CUDA_DEVICE_MAX_CONNECTIONS="${CUDA_DEVICE_MAX_CONNECTIONS:-1}"  # as the run scripts set it
: >"$OUT/pieces.jsonl"

step() {
    # step NAME LIMIT_S NEED_S -m MODULE ARGS...: python -m MODULE ARGS --json OUT/NAME.json, cut at the
    # smaller of its limit and the time left, started only with NEED_S left (less would give
    # nothing: a long piece's first config); one line per piece in pieces.jsonl (exit, seconds, command)
    local name=$1 limit=$2 need=$3 left=$((TOTAL_S - (SECONDS - START))) begin=$SECONDS rc
    shift 3
    [[ "$SMOKE" == 1 ]] && limit=$((limit * 3)) need=30  # tiny shapes, but a shared CPU's start-ups are slow
    if ((left < need)); then
        echo "=== $name: skipped (lane time spent)"
        printf '{"piece": "%s", "skipped": true}\n' "$name" >>"$OUT/pieces.jsonl"
        return
    fi
    ((limit > left)) && limit=$left
    echo "=== $name (limit ${limit} s) at $(date +%H:%M:%S)"
    (cd "$ROOT" && timeout -k 15 "$limit" "$PY" "$@" --json "$OUT/$name.json") >"$OUT/$name.log" 2>&1
    rc=$?
    "$PY" -c 'import json, sys; print(json.dumps({"piece": sys.argv[1], "exit": int(sys.argv[2]),
        "seconds": int(sys.argv[3]), "limit_s": int(sys.argv[4]), "command": sys.argv[5:]}))' \
        "$name" "$rc" "$((SECONDS - begin))" "$limit" "$@" >>"$OUT/pieces.jsonl"
    [[ "$name" == oom* ]] && rm -rf "${OUT:?}/work/$name"  # its checkpoints: GBs, not results
    echo "exit $rc after $((SECONDS - begin)) s (lane $((SECONDS - START)) s); last lines:"
    grep -v -i "warn" "$OUT/$name.log" | cut -c1-240 | tail -n 25  # (the JSON lines are long)
}

if [[ "$SMOKE" == 1 ]]; then  # tiny shapes and lengths: the lane's plumbing on a CPU
    SHAPE=tiny BIG15=tiny BIG3=tiny ENGINE_SHAPE=tiny
    RIL=(--prompts 2 --samples 2 --prompt-len 24 --response-len 16 --steps 2 --repeats 1)
    OOM=(--prompts 2 --samples 2 --response-len 32 --steps 1)
    ENG=(--batch 4 --prompt-len 16 --output-len 16 --repeats 2)
    REPLAY=(--shape tiny --response-len 300 --budget 64 --divide-length 16 --seqs-per-step 4
            --max-tokens-per-gpu 1024 --steps 1 --repeats 2)
    LONG=(--shape tiny --prompts 2 --samples 2 --steps 2 --stale-steps 3 --max-tokens-per-gpu 0)
    CAPS=(64 128)
    D4K=(--shape tiny --prompts 2 --samples 2 --prompt-len 16 --response-len 96 --profile-context 64
         --configs dense rkv:16)
    POOL=()  # a CPU's pool is --sglang-max-total-tokens or 16k slots
    W_SMALL=(--shape tiny --pushes 1) W_BIG=(--shape tiny --pushes 1)
else
    SHAPE=qwen2.5-0.5b BIG15=qwen2.5-1.5b BIG3=qwen2.5-3b ENGINE_SHAPE=qwen2.5-0.5b
    RIL=(--prompts 32 --samples 8 --prompt-len 128 --response-len 512 --steps 2 --repeats 2)
    OOM=(--prompts 4 --samples 8 --response-len 2048 --steps 1)
    ENG=(--batch 256 --prompt-len 128 --output-len 512 --repeats 3)
    REPLAY=(--seqs-per-step 8 --steps 2 --repeats 3 --max-tokens-per-gpu 32768)
    LONG=(--shape qwen2.5-0.5b --steps 2 --stale-steps 4 --max-tokens-per-gpu 0)
    CAPS=(4096 8192)
    D4K=(--shape qwen2.5-0.5b --response-len 4096 --profile-context 2048 --configs dense rkv:512)
    POOL=(--sglang-mem-fraction-static 0.7 --sglang-max-total-tokens 1000000000)
    W_SMALL=(--shape smollm2-135m --pushes 3) W_BIG=(--shape qwen2.5-3b --pushes 2)
fi
# "auto": what --rollout-server-urls builds; NCCL needs the server on a second GPU, and with one
# GPU auto is CUDA IPC, the same-host path (the benchmark's "distributed" would be gloo through
# host copies: last at SmolLM2, left out at 3B)
GPUS=$("$PY" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
if ((GPUS >= 2)) || [[ "$SMOKE" == 1 ]]; then
    W_MODES_SMALL=auto,distributed,ipc,disk,tensor W_MODES_BIG=auto,distributed,ipc,disk
else
    W_MODES_SMALL=auto,ipc,disk,tensor,distributed W_MODES_BIG=auto,disk
fi
# the R-KV run script's trainer and engine settings (scripts/lib/common.sh); the pool from the
# fraction alone (rl_step's own --sglang-max-total-tokens lifted)
SCRIPT_RKV=(--compress rkv --kv-budget 512 --compress-divide-length 128 --max-tokens-per-gpu 0
            --kl-loss-coef 1e-4 --kl-loss-type low_var_kl --use-mis --mis-preset sparse_rl
            --sglang-compress-keep-prompt "${POOL[@]}")
# on-policy and off-policy each like for like: dense+s1 before rkv:512+s1 (its ratio's reference)
read -ra LONG_CONFIGS <<<"${LONG_CONFIGS:-dense rkv:512 dense+s1 rkv:512+s1}"  # e.g. "dense rkv:512" for a shorter lane
read -ra LONG8K_CONFIGS <<<"${LONG8K_CONFIGS:-dense rkv:1024}"
[[ "$SMOKE" == 1 ]] && LONG_CONFIGS=(dense dense+s1 rkv:512+s1) LONG8K_CONFIGS=(dense)  # each kind's plumbing, on a CPU

piece() {
    case "$1" in
        ril_dense) step ril_dense 150 60 -m benchmarks.training.rollout_in_loop --shape "$SHAPE" "${RIL[@]}" \
            --compress none --max-tokens-per-gpu 0 "${POOL[@]}" --workdir "$OUT/work/ril" ;;
        ril_rkv) step ril_rkv 150 60 -m benchmarks.training.rollout_in_loop --shape "$SHAPE" "${RIL[@]}" \
            --compress rkv --kv-budget 128 --compress-divide-length 64 --max-tokens-per-gpu 0 \
            "${POOL[@]}" --workdir "$OUT/work/ril" ;;
        oom_1.5b) step oom_1.5b 120 60 -m benchmarks.training.rl_step --shape "$BIG15" "${OOM[@]}" \
            "${SCRIPT_RKV[@]}" --workdir "$OUT/work/oom_1.5b" ;;
        oom_3b) step oom_3b 200 90 -m benchmarks.training.rl_step --shape "$BIG3" "${OOM[@]}" \
            "${SCRIPT_RKV[@]}" --workdir "$OUT/work/oom_3b" ;;
        engine_decode) step engine_decode 240 90 -m benchmarks.engine.throughput --shape "$ENGINE_SHAPE" \
            "${ENG[@]}" --temperature 1 --logprobs --skip-hf --modes overlap,sequential --count-syncs \
            --configs dense,rkv,dense@fp8_e4m3,rkv@fp8_e4m3 --kv-budget 128 --compress-divide-length 64 ;;
        engine_dense) step engine_dense 75 45 -m benchmarks.engine.throughput --shape "$ENGINE_SHAPE" \
            "${ENG[@]}" --temperature 1 --logprobs --skip-hf --modes overlap ;;
        engine_rkv) step engine_rkv 75 45 -m benchmarks.engine.throughput --shape "$ENGINE_SHAPE" \
            "${ENG[@]}" --temperature 1 --logprobs --skip-hf --modes overlap \
            --compress rkv --kv-budget 128 --compress-divide-length 64 ;;
        replay) step replay 150 90 -m benchmarks.training.sparse_recompute "${REPLAY[@]}" ;;
        decode4k) step decode4k 240 150 -m benchmarks.studies.rollout_split "${D4K[@]}" \
            --profile "$OUT/decode4k_profile" --workdir "$OUT/work/decode4k" ;;
        long4k) step long4k 480 240 -m benchmarks.studies.long_rollout "${LONG[@]}" \
            --response-len "${CAPS[0]}" --configs "${LONG_CONFIGS[@]}" --workdir "$OUT/work/long" ;;
        long8k) step long8k 540 240 -m benchmarks.studies.long_rollout "${LONG[@]}" \
            --response-len "${CAPS[1]}" --configs "${LONG8K_CONFIGS[@]}" --workdir "$OUT/work/long" ;;
        weights_smollm2) step weights_smollm2 120 45 -m benchmarks.engine.weight_sync "${W_SMALL[@]}" \
            --modes "$W_MODES_SMALL" --workdir "$OUT/work/weights" ;;
        weights_3b) step weights_3b 300 120 -m benchmarks.engine.weight_sync "${W_BIG[@]}" \
            --modes "$W_MODES_BIG" --workdir "$OUT/work/weights" ;;
        *) echo "=== $1: no such piece (PARTS: decode4k engine_decode replay weights_smollm2 weights_3b long4k long8k" \
                "ril_dense ril_rkv oom_3b engine_dense engine_rkv oom_1.5b)" ;;
    esac
}

if [[ "$SMOKE" == 1 ]] && ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    PARTS="${PARTS//engine_decode/}"  # engine/throughput.py needs a GPU
    PARTS="${PARTS//engine_dense/}"
    PARTS="${PARTS//engine_rkv/}"
fi
echo "speed lane: $(date -u +%Y-%m-%dT%H:%M:%SZ), parts: $PARTS, TOTAL_S=$TOTAL_S, OUT=$OUT"
nvidia-smi --query-gpu=name,memory.total,memory.used,utilization.gpu --format=csv 2>/dev/null \
    | tee "$OUT/gpu.txt"
for part in $PARTS; do
    piece "$part"
done
# each long-rollout config's own JSON (a piece cut at its limit leaves those that finished)
mkdir -p "$OUT/long_runs" && cp "$OUT"/work/long/*.json "$OUT/long_runs/" 2>/dev/null
rm -rf "$OUT/work"  # checkpoints and run dirs: GBs, not results
"$PY" -m benchmarks.studies.speed_lane_summary "$OUT" --parts $PARTS --lane-seconds $((SECONDS - START))
echo "speed lane done in $((SECONDS - START)) s; summary: $OUT/summary.md"
