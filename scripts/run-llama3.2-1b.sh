#!/usr/bin/env bash
# GRPO on Llama-3.2-1B-Instruct with dense rollouts (chat-message data), with the Sparse-RL reference hyper-parameters
# (docs/training.md, "The reference recipe"; shared settings in scripts/lib/common.sh).
#   MODEL_DIR=/models/Llama-3.2-1B-Instruct NUM_GPUS=8 ./scripts/run-llama3.2-1b.sh [extra trainer flags]
# DRY_RUN=1 prints the command; see scripts/lib/common.sh for every variable.
source "$(dirname "${BASH_SOURCE[0]}")/lib/usage.sh" "$@"  # --help: the header above, nothing else
MODEL_NAME=Llama-3.2-1B-Instruct
DATA_NAME=simplelr_level3to5
CHAT_TEMPLATE=1
DEFAULT_TP=1
COMPRESS=
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
run_trainer "$@"
