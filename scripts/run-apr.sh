#!/usr/bin/env bash
# APR (Adaptive Parallel Reasoning) subcalls on Countdown as a generate plug-in of the trainer:
# parents spawn child threads (<spawn><child>...</child></spawn>), the children decode as
# independent requests batched through the same engines, their <result>s are joined back and the
# parent resumes. Every call of a trace gets the trace's advantage, its loss divided by the calls
# of the trace; the root prompt carries "Sub Call Budget: 10 ". APR's RL settings (tinyrl):
# group size 5, 64 prompts, lr 1e-5, clip 0.2, k3 KL 0.001, grad clip 1.0.
#   MODEL_DIR=/models/my-apr-sft-model NUM_GPUS=8 ./scripts/run-apr.sh [extra trainer flags]
# BUDGET (10) CHILD_TOKENS (512) MAX_SPAWNS (4); COMPRESS=rkv for R-KV rollouts; other variables
# as in scripts/lib/common.sh. A model must have learned the spawn syntax (APR starts from an SFT
# model); a model that never spawns trains as plain Countdown GRPO.
source "$(dirname "${BASH_SOURCE[0]}")/lib/usage.sh" "$@"  # --help: the header above, nothing else
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODEL_NAME=Qwen2.5-3B
DATA_NAME=apr
DATA_DIR="${DATA_DIR:-$HERE/runs/data}"
CHAT_TEMPLATE=0
DEFAULT_TP=1
COMPRESS="${COMPRESS-}"
EVAL_SETS=""  # the countdown test split (APR prompt) is the eval set
CUSTOM_RM_PATH="recipes.countdown:${REWARD:-reward_binary}"  # APR: binary correctness
source "$HERE/scripts/lib/common.sh"
TEST_DATA="$DATA_DIR/$DATA_NAME/test.jsonl"

for split in train test; do
    out="$DATA_DIR/$DATA_NAME/$split.jsonl"
    n=20000
    [[ $split == test ]] && n=512
    [[ -f "$out" ]] && continue
    if [[ "${DRY_RUN:-0}" == 1 ]]; then  # a dry run writes nothing
        echo "note (dry run): $out is missing; a real run writes it first" >&2
        continue
    fi
    (cd "$ROOT" && PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m recipes.apr \
        --split "$split" --n "$n" --seed "$SEED" --out "$out" >&2) || die "could not write $out"
done
run_trainer --custom-generate-function-path recipes.apr:APRSubcalls \
    --custom-generate-args "budget=${BUDGET:-10}" "child_tokens=${CHILD_TOKENS:-512}" \
        "max_spawns=${MAX_SPAWNS:-4}" \
    --rollout-batch-size 64 --n-samples-per-prompt 5 --global-batch-size 160 \
    --rollout-max-response-len 1024 --eval-max-response-len 1024 --lr 1e-5 --eps-clip 0.2 \
    --eps-clip-high 0.2 --kl-loss-coef 0.001 --kl-loss-type low_var_kl --clip-grad 1.0 \
    --eval-prompt-data countdown "$TEST_DATA" --eval-interval "$EVAL_INTERVAL" "$@"
