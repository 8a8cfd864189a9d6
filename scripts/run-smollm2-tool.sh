#!/usr/bin/env bash
# arith-tool, multi-turn tool use: SmolLM2-135M-Instruct (its real chat template) calls a calculator
# in Qwen2.5's <tool_call> format, reads the <tool_response>, and boxes a * b + c; the environment
# recipes.tool_use:ArithToolEnv scores the final answer (evaluation.grader). Up to 3 model turns,
# 256 response tokens per sample (model turns and observations together), observations masked
# from the loss. A short supervised warm-up on worked episodes (WARMUP_STEPS, default 12; 0 to
# skip) writes $SAVE_DIR/model-warm first, since the 135M model does not write the call format
# unprompted. The data is written under $DATA_DIR/$TASK when missing.
#   NUM_GPUS=1 ./scripts/run-smollm2-tool.sh                 # dense KV
#   NUM_GPUS=1 COMPRESS=rkv ./scripts/run-smollm2-tool.sh    # R-KV, KV_BUDGET (64) tokens
#   TASK=lookup_tool NUM_GPUS=1 ./scripts/run-smollm2-tool.sh  # the lookup-tool task instead
# TASK=lookup_tool: an order's total from prices that only a lookup tool shows
# (recipes.lookup_tool:LookupToolEnv, up to 5 turns, 320 response tokens), warmed up on one- and two-item
# orders at other prices (dataset.lookup_tool --demos): the calls' format, not the answers.
# Compare the two runs' metrics.jsonl: reward_mean, rollout/turns_per_sample, rollout/tool_*,
# kv_pool_peak_used. TRAIN_ROWS (20000): the training rows written when the data is missing.
# Other variables as in scripts/lib/common.sh.
source "$(dirname "${BASH_SOURCE[0]}")/lib/usage.sh" "$@"  # --help: the header above, nothing else
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODEL_NAME=SmolLM2-135M-Instruct
TASK="${TASK:-arith_tool}"
case "$TASK" in
    arith_tool) ENV_FLAGS=(--env-path recipes.tool_use:ArithToolEnv --max-turns 3 --rollout-max-response-len 256)
                DEMO_FLAGS=() ;;
    lookup_tool) ENV_FLAGS=(--env-path recipes.lookup_tool:LookupToolEnv --max-turns 5 --rollout-max-response-len 320)
                 DEMO_FLAGS=(--demos) ;;
    *) echo "error: TASK=$TASK: choose arith_tool or lookup_tool" >&2; exit 1 ;;
esac
DATA_NAME=$TASK
DATA_DIR="${DATA_DIR:-$HERE/runs/data}"
CHAT_TEMPLATE=0  # the rows are message lists: always rendered with the chat template
DEFAULT_TP=1
COMPRESS="${COMPRESS-}"
EVAL_SETS=""
NUM_ROLLOUT="${NUM_ROLLOUT:-40}"
source "$HERE/scripts/lib/common.sh"
WARMUP_STEPS="${WARMUP_STEPS:-12}"

python_module() {
    (cd "$ROOT" && PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m "$@" >&2)
}

write_data() {
    local out="$DATA_DIR/$DATA_NAME/train.jsonl"
    [[ -f "$out" ]] && return 0
    if [[ "${DRY_RUN:-0}" == 1 ]]; then  # a dry run writes nothing
        echo "note (dry run): $out is missing; a real run writes it first" >&2
        return 0
    fi
    python_module "dataset.$TASK" --n "${TRAIN_ROWS:-20000}" --seed "$SEED" --out "$out" \
        || die "could not write the $TASK data to $out"
}

warm_up() {
    local warm="$SAVE_DIR/model-warm" demos="$DATA_DIR/$DATA_NAME/demos.jsonl"
    (( WARMUP_STEPS > 0 )) || return 0
    if [[ "${DRY_RUN:-0}" == 1 ]]; then
        echo "note (dry run): a real run first warms $MODEL_DIR up for $WARMUP_STEPS steps into $warm" >&2
    elif [[ ! -f "$warm/config.json" ]]; then
        python_module "dataset.$TASK" --n $((4 * WARMUP_STEPS)) --seed $((SEED + 10000)) "${DEMO_FLAGS[@]}" --out "$demos" \
            && python_module trainer.warmup --model-dir "$MODEL_DIR" --data "$demos" --out "$warm" \
                --steps "$WARMUP_STEPS" --lr 5e-5 || die "the warm-up of $MODEL_DIR failed"
    fi
    MODEL_DIR="$warm"
    REF_LOAD="$warm"
}

KV_FLAGS=()
if [[ "${COMPRESS:-}" == rkv ]]; then
    KV_FLAGS=(--sglang-compress-max-prompt "${KV_BUDGET:-64}" --sglang-compress-divide-length 16
              --sglang-compress-max-window 8)
fi
write_data
[[ "${DRY_RUN:-0}" == 1 || -d "$MODEL_DIR" ]] || die "MODEL_DIR=$MODEL_DIR does not exist (scripts/get-smollm2.sh builds it)"
warm_up
run_trainer "${ENV_FLAGS[@]}" --rm-type arithmetic \
    --rollout-batch-size 64 --n-samples-per-prompt 8 --global-batch-size 512 \
    --lr 2e-6 --kl-loss-coef 0 --sglang-dtype bfloat16 \
    "${KV_FLAGS[@]}" "$@"
