#!/usr/bin/env bash
# Reasoning Cache (RC) on the math training set as a generate plug-in of the trainer: rounds of
# reasoning (up to H_R tokens) and summarising (up to H_S tokens), each round conditioned on the
# problem + the latest summary only; every reasoning sample trained with its own round's reward
# (myopic), summaries with their branch's mean reward; separate KL coefficients for thinking and
# summary tokens; a per-problem summary replay buffer. RC's example recipe (Qwen3-4B-Instruct, H_R
# 16384, H_S 2048, T_train 3, N_summ 2, K 8, clip 0.2/0.28, token-mean, k3 KL 0.001) scaled to the
# reference's 4k-token budget: H_R 2048, H_S 512.
#   MODEL_DIR=/models/Qwen2.5-3B-Instruct NUM_GPUS=8 ./scripts/run-rc.sh [extra trainer flags]
# RC_ROUNDS (3) RC_SUMMARIES (2) H_R (2048) H_S (512) RC_REPLAY (true); COMPRESS=rkv puts R-KV
# compression on the rounds too (the two bound context differently and work together); other
# variables as in scripts/lib/common.sh.
source "$(dirname "${BASH_SOURCE[0]}")/lib/usage.sh" "$@"  # --help: the header above, nothing else
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODEL_NAME=Qwen2.5-3B-Instruct
DATA_NAME=simplelr_qwen_level3to5
CHAT_TEMPLATE=0
DEFAULT_TP=1
COMPRESS="${COMPRESS-}"
source "$HERE/scripts/lib/common.sh"

EVAL_FLAGS=()
[[ -n "$EVAL_SETS" ]] && EVAL_FLAGS=(--eval-max-response-len "${H_R:-2048}")
run_trainer --custom-generate-function-path recipes.rc:ReasoningCache \
    --custom-generate-args "rounds=${RC_ROUNDS:-3}" "summaries_per_round=${RC_SUMMARIES:-2}" \
        "thinking_tokens=${H_R:-2048}" "summary_tokens=${H_S:-512}" \
        thinking_kl_coef=0.001 summary_kl_coef=0.001 "replay_buffer=${RC_REPLAY:-true}" \
    --rollout-batch-size 32 --n-samples-per-prompt 8 --global-batch-size 256 \
    --rollout-max-response-len "${H_R:-2048}" --eps-clip 0.2 --eps-clip-high 0.28 \
    --loss-agg-mode token_mean --kl-loss-coef 0.001 --kl-loss-type low_var_kl \
    "${EVAL_FLAGS[@]}" "$@"
