#!/usr/bin/env bash
# GSM8K GRPO with AReaL's settings (examples/math/gsm8k_grpo.yaml): Qwen2.5-1.5B-Instruct, 256
# prompts x group size 4, 1,024 response tokens, rewards (r - 0.5) x 10, eps_clip 0.4, no KL,
# lr 1.7e-5, one optimizer step per rollout, the decoupled loss with the behaviour importance
# weight capped at 5 (tokens above it masked). AReaL's 10,240-token micro-batches are left to the
# trainer's size from free memory (speed only, not the maths). Trains on a held-apart slice of the
# GSM8K test file and evaluates only on the rest (recipes/gsm8k.py says why).
#   MODEL_DIR=/models/Qwen2.5-1.5B-Instruct NUM_GPUS=8 ./scripts/run-gsm8k.sh [extra trainer flags]
# GSM8K_FILE (default ../shared/data/eval/gsm8k/test.jsonl); COMPRESS=rkv for R-KV rollouts;
# DECOUPLED=0 for the reference's sparse_rl correction instead; other variables as in scripts/lib/common.sh.
source "$(dirname "${BASH_SOURCE[0]}")/lib/usage.sh" "$@"  # --help: the header above, nothing else
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODEL_NAME=Qwen2.5-1.5B-Instruct
DATA_NAME=gsm8k
DATA_DIR="${DATA_DIR:-$HERE/runs/data}"
CHAT_TEMPLATE=1
DEFAULT_TP=1
COMPRESS="${COMPRESS-}"
EVAL_SETS=""  # the held-out GSM8K slice is the eval set
source "$HERE/scripts/lib/common.sh"
GSM8K_FILE="${GSM8K_FILE:-$PARENT/shared/data/eval/gsm8k/test.jsonl}"
HELDOUT_DATA="$DATA_DIR/$DATA_NAME/heldout.jsonl"

if [[ ! -f "$PROMPT_DATA" ]]; then
    [[ -f "$GSM8K_FILE" ]] || missing "GSM8K_FILE=$GSM8K_FILE not found (the GSM8K test.jsonl: question, answer)"
fi
if [[ ! -f "$PROMPT_DATA" && "${DRY_RUN:-0}" == 1 ]]; then  # a dry run writes nothing
    echo "note (dry run): $PROMPT_DATA is missing; a real run writes it from GSM8K_FILE first" >&2
elif [[ ! -f "$PROMPT_DATA" ]]; then
    (cd "$ROOT" && PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m recipes.gsm8k \
        --gsm8k-file "$GSM8K_FILE" --out-dir "$DATA_DIR/$DATA_NAME" >&2) || die "could not prepare GSM8K"
fi
GSM8K_ARGS=(--rollout-batch-size 256 --n-samples-per-prompt 4 --global-batch-size 1024
            --rollout-max-response-len 1024 --lr 1.7e-5 --eps-clip 0.4 --eps-clip-high 0.4
            --kl-loss-coef 0 --rm-type gsm8k --reward-scaling 10 --reward-bias -0.5
            --eval-prompt-data gsm8k "$HELDOUT_DATA" --eval-interval "$EVAL_INTERVAL"
            --eval-max-response-len 1024)
if [[ "${DECOUPLED:-1}" == 1 ]]; then
    # AReaL's decoupled PPO: ratio against the recomputed proximal policy, behaviour weight
    # pi_prox / pi_behav per token, tokens whose weight exceeds 5 masked out
    GSM8K_ARGS+=(--mis-preset decoupled_token_is --mis-level token --mis-mode mask --mis-upper-bound 5.0)
fi
run_trainer "${GSM8K_ARGS[@]}" "$@"
