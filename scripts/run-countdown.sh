#!/usr/bin/env bash
# Countdown-3to4 GRPO (TinyZero's R1 prompt with <think>/<answer>) as a plug-in of the trainer:
# the reference recipe's flags, the reward --custom-rm-path recipes.countdown:reward (base 0.0 /
# format 0.1 / correct 1.0; REWARD=reward_binary for 0/1), 1,024 response tokens, and the countdown
# test split as the eval set. The data is written under $DATA_DIR/countdown when missing (train/test
# split by task hash; CHAT_TEMPLATE=1 for chat messages, for instruct models).
#   MODEL_DIR=/models/Qwen2.5-3B NUM_GPUS=8 ./scripts/run-countdown.sh [extra trainer flags]
# COMPRESS=rkv for R-KV rollouts; other variables as in scripts/lib/common.sh.
source "$(dirname "${BASH_SOURCE[0]}")/lib/usage.sh" "$@"  # --help: the header above, nothing else
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODEL_NAME=Qwen2.5-3B
DATA_NAME=countdown
DATA_DIR="${DATA_DIR:-$HERE/runs/data}"
CHAT_TEMPLATE="${CHAT_TEMPLATE:-0}"
DEFAULT_TP=1
COMPRESS="${COMPRESS-}"
EVAL_SETS=""  # the countdown test split is the eval set, not the math benchmarks
CUSTOM_RM_PATH="recipes.countdown:${REWARD:-reward}"
source "$HERE/scripts/lib/common.sh"
TEST_DATA="$DATA_DIR/$DATA_NAME/test.jsonl"

write_countdown_data() {
    local chat=() split n out
    [[ "$CHAT_TEMPLATE" == 1 ]] && chat=(--chat)
    for split in train test; do
        n=20000
        [[ $split == test ]] && n=512
        out="$DATA_DIR/$DATA_NAME/$split.jsonl"
        [[ -f "$out" ]] && continue
        if [[ "${DRY_RUN:-0}" == 1 ]]; then  # a dry run writes nothing
            echo "note (dry run): $out is missing; a real run writes it first" >&2
            continue
        fi
        (cd "$ROOT" && PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m dataset.countdown_r1 \
            --split "$split" --n "$n" --seed "$SEED" --out "$out" "${chat[@]}" >&2) \
            || die "could not write the countdown data to $out"
    done
}

write_countdown_data
run_trainer --rollout-max-response-len 1024 --eval-max-response-len 1024 \
    --eval-prompt-data countdown "$TEST_DATA" --eval-interval "$EVAL_INTERVAL" "$@"
