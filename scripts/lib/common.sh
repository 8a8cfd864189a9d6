# Shared part of scripts/run-*.sh (sourced, not run). The caller sets, before sourcing:
#   MODEL_NAME     default checkpoint folder name (e.g. Qwen2.5-3B)
#   DATA_NAME      training set under $DATA_DIR (simplelr_qwen_level3to5 or simplelr_level3to5)
#   CHAT_TEMPLATE  1 when the data holds chat messages (adds --apply-chat-template)
#   DEFAULT_TP     tensor parallel size when $TP is not set (default 1)
#   COMPRESS       rkv for sparse (R-KV) rollouts, empty for dense
# and then calls `run_trainer "$@"`. The hyper-parameters and where the data and models come from:
# docs/training.md ("The reference recipe") and README.md ("Train on your model and data").
#
# Environment overrides (all optional):
#   NUM_GPUS (the GPUs nvidia-smi lists; 1 CPU rank without GPUs)  MODEL_DIR (models/$MODEL_NAME in the
#   checkout, where scripts/get-smollm2.sh writes too; ../models/$MODEL_NAME if only that exists)  DATA_DIR (../shared/data/train)
#   SAVE_DIR (runs/<script name>)  LOG_DIR ($SAVE_DIR/logs)  TP  PP (1)  REF_LOAD ($MODEL_DIR)
#   EVAL_DIR (../shared/data/eval)  EVAL_SETS ("aime24 amc23 math500"; empty = no eval)
#   NUM_ROLLOUT (100)  SAVE_INTERVAL (20)  EVAL_INTERVAL (20)  EVAL_SAMPLES (1)  SEED (1234)
#   MAX_TOKENS_PER_GPU (unset: the trainer sizes the micro-batch from free memory and prints it)
#   MEM_FRACTION (0.7 R-KV / 0.75 dense)  CUSTOM_RM_PATH
#   KEEP_PROMPT (1: R-KV never evicts the prompt's KV; 0: the paper's setting)
#   USE_WANDB (0)  WANDB_PROJECT (sparse-rl)  TORCHRUN_ARGS (--standalone; e.g. --nnodes/--rdzv-* for
#   several nodes)  TORCHRUN (the launcher; default: python -m trainer.startup.torchrun, torchrun quiet on Ctrl-C)
#   DRY_RUN=1: print the command instead of running it (works on any machine, with nothing on disk:
#     missing inputs are noted; the eval prompts are written when the eval sets are there; where
#     the GPUs present do not fit TP*PP, the command is printed for the recipe's RECIPE_GPUS=8).
#   PREFLIGHT=0: skip the start-up check (the trainer's flags, every prompt against the context).
#   ROLLOUT_GPUS (0) > 0: disaggregated rollouts; under torchrun the trainer's rank 0 starts that many
#     engine processes (one GPU each) on the GPUs after the NUM_GPUS trainer GPUs, weights over NCCL.
#   RAY=1: launch with Ray (python -m trainer.ray_job) instead of torchrun: NUM_GPUS trainer GPUs on
#     each of NUM_NODES (1) nodes; ROLLOUT_GPUS (0) > 0 starts that many disaggregated engines
#     behind sglang-router (0: one engine inside each data-parallel trainer rank, --colocate);
#     RAY_ARGS for the job's other flags (e.g. "--ray-address auto" for a `ray start` cluster).
# The eval sets are converted to prompt/label rows under $SAVE_DIR/eval_data before launching.
# Extra arguments to the script go last to the trainer, so they override the values here.

set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PARENT="$(dirname "$ROOT")"  # holds shared/ (data)
SCRIPT_NAME="$(basename "${BASH_SOURCE[1]:-run}" .sh)"

die() {
    echo "error: $*" >&2
    exit 1
}

gpus_present() {
    # nvidia-smi -L prints one "GPU i: ..." line per GPU; no driver or no GPU: 0
    local n=0
    if command -v nvidia-smi >/dev/null 2>&1; then
        n="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)"
    fi
    echo "${n:-0}"
}

choose_num_gpus() {
    local present engines=0
    NUM_GPUS_GIVEN="${NUM_GPUS:+1}"
    present="$(gpus_present)"
    # torchrun with ROLLOUT_GPUS: the engines take the last GPUs, the trainer the others
    if [[ "${RAY:-0}" != 1 && "${ROLLOUT_GPUS:-0}" =~ ^[0-9]+$ ]]; then
        engines="${ROLLOUT_GPUS:-0}"
    fi
    if [[ -z "${NUM_GPUS:-}" ]]; then
        NUM_GPUS="$(( present - engines > 0 ? present - engines : 1 ))"
        if (( present > 0 )); then
            echo "NUM_GPUS=$NUM_GPUS: the GPUs nvidia-smi lists, less ROLLOUT_GPUS=$engines (set NUM_GPUS to use fewer)" >&2
        fi
    fi
    if (( present == 0 )); then
        echo "no GPU found (nvidia-smi): starting $NUM_GPUS CPU rank(s), each with a copy of the model" >&2
    fi
}

missing() {
    # a missing input is fatal, except in a dry run (which only prints the command)
    if [[ "${DRY_RUN:-0}" == 1 ]]; then
        echo "note (dry run): $*" >&2
    else
        die "$*"
    fi
}

choose_num_gpus
NUM_NODES="${NUM_NODES:-1}"
ROLLOUT_GPUS="${ROLLOUT_GPUS:-0}"
default_model_dir() {
    # models/ in the checkout; ../models/ beside it (the former default) while only that exists
    if [[ ! -e "$ROOT/models/$MODEL_NAME" && -e "$PARENT/models/$MODEL_NAME" ]]; then
        echo "$PARENT/models/$MODEL_NAME"
    else
        echo "$ROOT/models/$MODEL_NAME"
    fi
}
MODEL_DIR="${MODEL_DIR:-$(default_model_dir)}"
DATA_DIR="${DATA_DIR:-$PARENT/shared/data/train}"
SAVE_DIR="${SAVE_DIR:-$ROOT/runs/$SCRIPT_NAME}"
LOG_DIR="${LOG_DIR:-$SAVE_DIR/logs}"
TP="${TP:-${DEFAULT_TP:-1}}"
PP="${PP:-1}"
REF_LOAD="${REF_LOAD:-$MODEL_DIR}"
EVAL_DIR="${EVAL_DIR:-$PARENT/shared/data/eval}"
EVAL_SETS="${EVAL_SETS-aime24 amc23 math500}"
NUM_ROLLOUT="${NUM_ROLLOUT:-100}"
SAVE_INTERVAL="${SAVE_INTERVAL:-20}"
EVAL_INTERVAL="${EVAL_INTERVAL:-20}"
EVAL_SAMPLES="${EVAL_SAMPLES:-1}"
SEED="${SEED:-1234}"
# reference: 0.7 of GPU memory for SGLang with R-KV, 0.75 dense. Its 8192 / 9216 tokens per GPU
# are not kept: the micro-batch changes speed only (losses are normalised by global counts), and
# 32,768 tokens (where the trainer's size from free memory stops) halved the step on one H200
# (9.1-9.7 s against 17.7-20.7 s at 8192; docs/benchmarks.md, issue 60). MAX_TOKENS_PER_GPU pins one.
MAX_TOKENS_PER_GPU="${MAX_TOKENS_PER_GPU:-}"
if [[ -n "${COMPRESS:-}" ]]; then
    MEM_FRACTION="${MEM_FRACTION:-0.7}"
else
    MEM_FRACTION="${MEM_FRACTION:-0.75}"
fi
PROMPT_DATA="$DATA_DIR/$DATA_NAME/train.jsonl"

dry_run_gpus() {
    # a dry run shows the recipe's command on any machine: where the GPUs found here (none, or
    # too few for TP*PP) cannot run it, print it for the GPUs the recipe is written for
    if [[ "${DRY_RUN:-0}" == 1 && -z "$NUM_GPUS_GIVEN" ]] && (( NUM_GPUS % (TP * PP) != 0 )); then
        echo "note (dry run): $NUM_GPUS GPU(s) here do not fit TP*PP=$((TP * PP)); printing the command for NUM_GPUS=${RECIPE_GPUS:-8}, the recipe's (set NUM_GPUS to choose)" >&2
        NUM_GPUS="${RECIPE_GPUS:-8}"
    fi
}

check_inputs() {
    [[ "$NUM_GPUS" =~ ^[1-9][0-9]*$ ]] || die "NUM_GPUS=$NUM_GPUS is not a positive integer"
    [[ "$TP" =~ ^[1-9][0-9]*$ && "$PP" =~ ^[1-9][0-9]*$ ]] || die "TP=$TP and PP=$PP must be positive integers"
    dry_run_gpus
    (( NUM_GPUS % (TP * PP) == 0 )) || die "NUM_GPUS=$NUM_GPUS is not divisible by TP*PP=$((TP * PP))"
    [[ "$ROLLOUT_GPUS" =~ ^[0-9]+$ ]] || die "ROLLOUT_GPUS=$ROLLOUT_GPUS is not a non-negative integer"
    if [[ "${RAY:-0}" == 1 ]]; then
        [[ "$NUM_NODES" =~ ^[1-9][0-9]*$ ]] || die "NUM_NODES=$NUM_NODES is not a positive integer"
    fi
    if [[ ! -d "$MODEL_DIR" ]]; then
        missing "MODEL_DIR=$MODEL_DIR does not exist; download $MODEL_NAME (Hugging Face format) and set MODEL_DIR to it"
    elif [[ ! -f "$MODEL_DIR/config.json" ]]; then
        missing "MODEL_DIR=$MODEL_DIR has no config.json; it must be a Hugging Face checkpoint of $MODEL_NAME"
    fi
    [[ -e "$REF_LOAD" ]] || missing "REF_LOAD=$REF_LOAD does not exist (the reference model for the KL loss; default: MODEL_DIR)"
    [[ -f "$PROMPT_DATA" ]] || missing "training data $PROMPT_DATA not found; set DATA_DIR (a folder holding $DATA_NAME/train.jsonl, see dataset/README.md)"
    local name
    for name in $EVAL_SETS; do
        [[ -f "$EVAL_DIR/$name/test.jsonl" ]] || missing "eval data $EVAL_DIR/$name/test.jsonl not found; set EVAL_DIR, or EVAL_SETS= to skip eval"
    done
}

trainer_args() {
    # resume from our own checkpoint when there is one, else start from the HF model
    local load="$MODEL_DIR"
    if [[ -f "$SAVE_DIR/latest_checkpointed_iteration.txt" ]]; then
        load="$SAVE_DIR"
    fi
    ARGS=(
        # checkpoints
        --hf-checkpoint "$MODEL_DIR" --load "$load" --ref-load "$REF_LOAD"
        --save "$SAVE_DIR" --save-interval "$SAVE_INTERVAL"
        # data
        --prompt-data "$PROMPT_DATA" --input-key prompt --label-key label
    )
    if [[ "${CHAT_TEMPLATE:-0}" == 1 ]]; then
        ARGS+=(--apply-chat-template)
    fi
    ARGS+=(
        # rollout: 128 prompts x 8 samples, up to 4096 response tokens, plain sampling
        --rollout-batch-size 128 --n-samples-per-prompt 8 --rollout-max-response-len 4096
        --rollout-temperature 1.0 --rollout-top-p 1.0 --num-rollout "$NUM_ROLLOUT"
        # optimisation: 1024 samples per rollout in global batches of 256 = 4 steps per rollout
        --global-batch-size 256 --lr 1e-6
        # GRPO loss: clip 0.2 both sides, low_var_kl to the reference at 1e-4, no entropy bonus
        --advantage-estimator grpo --eps-clip 0.2 --eps-clip-high 0.2
        --kl-loss-coef 1e-4 --kl-loss-type low_var_kl --entropy-coef 0 --loss-agg-mode seq_mean_token_mean
        # sparse-rollout correction (the reference mis.yaml), on in the dense baseline too
        --use-mis --mis-preset sparse_rl
        # parallelism
        --tensor-model-parallel-size "$TP" --pipeline-model-parallel-size "$PP"
        --sglang-mem-fraction-static "$MEM_FRACTION"
        --seed "$SEED" --log-dir "$LOG_DIR"
    )
    if [[ -n "$MAX_TOKENS_PER_GPU" ]]; then
        ARGS+=(--max-tokens-per-gpu "$MAX_TOKENS_PER_GPU")
    fi
    if [[ -n "${CUSTOM_RM_PATH:-}" ]]; then
        ARGS+=(--custom-rm-path "$CUSTOM_RM_PATH")
    else
        ARGS+=(--rm-type math)
    fi
    if [[ -n "$EVAL_SETS" ]]; then
        local eval_data=() name
        for name in $EVAL_SETS; do
            eval_data+=("$name" "$EVAL_DATA_OUT/$name.jsonl")
        done
        # a progress signal (the trainer's eval sampling, greedy unless told otherwise); final
        # numbers come from evaluation/eval.sh with the reference harness settings
        ARGS+=(--eval-prompt-data "${eval_data[@]}" --eval-interval "$EVAL_INTERVAL"
               --n-samples-per-eval-prompt "$EVAL_SAMPLES" --eval-max-response-len 4096)
    fi
    if [[ "${USE_WANDB:-0}" == 1 ]]; then
        ARGS+=(--use-wandb --wandb-project "${WANDB_PROJECT:-sparse-rl}")
    fi
    case "${COMPRESS:-}" in
        "") ;;
        rkv)
            # R-KV: keep 512 KV tokens, re-compress every 128 decode steps, 8-query observation window
            ARGS+=(--sglang-compress-algorithm rkv --sglang-compress-max-prompt 512
                   --sglang-compress-max-window 8 --sglang-compress-divide-length 128
                   --sglang-compress-divide-method step_length)
            # the prompt's KV is never evicted (README's recommendation: evicting it costs accuracy
            # at every budget measured); KEEP_PROMPT=0 for the paper's setting, which may evict it
            if [[ "${KEEP_PROMPT:-1}" == 1 ]]; then
                ARGS+=(--sglang-compress-keep-prompt)
            fi ;;
        *) die "COMPRESS=$COMPRESS is not supported by this script (rkv or empty)" ;;
    esac
}

PYTHON="${PYTHON:-python3}"
if [[ -x "$ROOT/.venv/bin/python" ]]; then
    PYTHON="$ROOT/.venv/bin/python"
fi
EVAL_DATA_OUT="$SAVE_DIR/eval_data"

prepare_eval_data() {
    # The benchmark files hold raw questions (problem/question + answer); the trainer reads
    # prompt/label rows. Render each question with the training prompt (qwen-boxed: the
    # SimpleRL system + user turn with the \boxed{} instruction), as ChatML text for the Qwen
    # scripts or as messages for the chat-template (Llama) scripts, gold answers as labels.
    [[ -n "$EVAL_SETS" ]] || return 0
    local name
    for name in $EVAL_SETS; do  # a dry run without the eval sets prints the command only
        [[ -f "$EVAL_DIR/$name/test.jsonl" ]] || return 0
    done
    # shellcheck disable=SC2086  # EVAL_SETS is a list of words on purpose
    (cd "$ROOT" && PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" - "$EVAL_DIR" "$EVAL_DATA_OUT" \
        "${CHAT_TEMPLATE:-0}" $EVAL_SETS <<'PY'
import json
import sys
from pathlib import Path

from evaluation.benchmarks import load_benchmark
from evaluation.prompts import get_template

data_dir, out_dir, chat, names = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3] == "1", sys.argv[4:]
template = get_template("qwen-boxed")
out_dir.mkdir(parents=True, exist_ok=True)
for name in names:
    rows = [{"prompt": template.messages(p.question) if chat else template.render(p.question), "label": p.gold}
            for p in load_benchmark(name, data_dir)]
    (out_dir / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
PY
    ) || die "could not prepare the eval data from EVAL_DIR=$EVAL_DIR (EVAL_SETS=$EVAL_SETS)"
}

torchrun_command() {
    local launcher=(torchrun)
    if [[ -n "${TORCHRUN:-}" ]]; then
        # shellcheck disable=SC2206  # a command with its arguments
        launcher=($TORCHRUN)
    else
        # torchrun, quiet on Ctrl-C: the trainer's one line says what to rerun (trainer/startup/torchrun.py)
        launcher=("$PYTHON" -m trainer.startup.torchrun)
    fi
    # shellcheck disable=SC2206  # TORCHRUN_ARGS is a list of words on purpose
    local torchrun_args=(${TORCHRUN_ARGS:---standalone})
    LAUNCH=("${launcher[@]}" "${torchrun_args[@]}" --nproc-per-node "$NUM_GPUS" -m trainer.train)
    if (( ROLLOUT_GPUS > 0 )); then
        # disaggregated: rank 0 starts the engines on the node's GPUs after the trainer's
        LAUNCH+=(--rollout-num-gpus "$ROLLOUT_GPUS")
    fi
}

ray_command() {
    # slime's flags: trainer GPUs per node and nodes; engines colocated or on GPUs of their own
    LAUNCH=("$PYTHON" -m trainer.ray_job --actor-num-nodes "$NUM_NODES" --actor-num-gpus-per-node "$NUM_GPUS")
    if (( ROLLOUT_GPUS > 0 )); then
        LAUNCH+=(--rollout-num-gpus "$ROLLOUT_GPUS" --rollout-num-gpus-per-engine 1)
    else
        LAUNCH+=(--colocate)
    fi
    # shellcheck disable=SC2206  # RAY_ARGS is a list of words on purpose
    LAUNCH+=(${RAY_ARGS:-})
}

run_trainer() {
    check_inputs
    trainer_args
    # written in dry runs too: the printed command refers to these files
    prepare_eval_data
    if [[ "${RAY:-0}" == 1 ]]; then
        ray_command
    else
        torchrun_command
    fi
    local cmd=("${LAUNCH[@]}" "${ARGS[@]}" "$@")
    if [[ "${DRY_RUN:-0}" == 1 ]]; then
        printf '%q ' "${cmd[@]}"
        echo
        return 0
    fi
    # stay in the caller's directory (relative paths and --custom-rm-path modules resolve there)
    export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
    # the command an interrupt says to rerun, and the one flag errors name: this script's
    SPARSE_RL_COMMAND="${SPARSE_RL_COMMAND:-$(printf '%q ' "$0" "$@")}"
    export SPARSE_RL_COMMAND="${SPARSE_RL_COMMAND% }"
    if [[ "${PREFLIGHT:-1}" == 1 ]]; then
        # the trainer's flags and every prompt against the context, before any rank starts
        "$PYTHON" -m trainer.startup.preflight "${ARGS[@]}" "$@" || exit 1
    fi
    mkdir -p "$SAVE_DIR" "$LOG_DIR"
    export CUDA_DEVICE_MAX_CONNECTIONS="${CUDA_DEVICE_MAX_CONNECTIONS:-1}"
    # Megatron and torch.distributed warn about missing TE/Apex and deprecated internals: noise here.
    export PYTHONWARNINGS="${PYTHONWARNINGS:-ignore::UserWarning,ignore::FutureWarning,ignore::DeprecationWarning}"
    exec "${cmd[@]}"
}
