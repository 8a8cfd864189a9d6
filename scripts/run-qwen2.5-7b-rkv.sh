#!/usr/bin/env bash
# GRPO on Qwen2.5-7B with R-KV sparse rollouts (budget 512), with the Sparse-RL reference hyper-parameters
# (docs/training.md, "The reference recipe"; shared settings in scripts/lib/common.sh).
#   MODEL_DIR=/models/Qwen2.5-7B NUM_GPUS=8 ./scripts/run-qwen2.5-7b-rkv.sh [extra trainer flags]
# DRY_RUN=1 prints the command; see scripts/lib/common.sh for every variable.
source "$(dirname "${BASH_SOURCE[0]}")/lib/usage.sh" "$@"  # --help: the header above, nothing else
MODEL_NAME=Qwen2.5-7B
DATA_NAME=simplelr_qwen_level3to5
CHAT_TEMPLATE=0
DEFAULT_TP=2
COMPRESS=rkv
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
run_trainer "$@"
