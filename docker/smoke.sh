#!/usr/bin/env bash
# Build docker/Dockerfile and use the image as a user would, on a machine without a GPU:
#   bash docker/smoke.sh            (from anywhere; docker/README.md has a run's output and times)
#   bash docker/smoke.sh --check    (only say which engine would build, or why none can; exit 1)
# Steps, each timed: the base (BASE_IMAGE when it can be pulled, else a Debian bookworm root
# filesystem with python3 made by mmdebstrap or debootstrap, imported once, then cached), the
# build, then inside the image: the 3B R-KV script's dry run, a 2-rollout CPU run of the 1.5B
# R-KV script on a tiny model, the rollout server answering /generate, and `scripts/test.sh` on a
# few tests. The data is mounted where the image expects it (/workspace/shared/data), from
# ../shared/data beside the checkout (a few synthetic rows when that is absent); the tiny model
# goes to /workspace/models.
# The last line sums it up: the image, its size and each step's wall time.
#
# Environment (all optional):
#   ENGINE (docker if its daemon answers, else podman)  IMAGE (sparse-rl:smoke)
#   BASE_IMAGE (the Dockerfile's)  LOCAL_BASE (sparse-rl-base:bookworm, the made base's name)
#   DEBIAN_MIRROR (http://deb.debian.org/debian)  DATA (../shared/data beside the checkout)
#   SMOKE_TESTS, SMOKE_K (the last step's test paths and -k selection)  SMOKE_DIR (a new
#   temporary folder: the models, runs and logs; removed after a run that passes)  SMOKE_KEEP=1
#   keeps it
# With podman the build's pip gets the host pip's indexes, wheel folders and CA bundle (local
# folders mounted read-only under /run/host-pip), so a machine with its own package mirror (or a
# proxy with its own CA) builds from it.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DOCKERFILE="$ROOT/docker/Dockerfile"
IMAGE="${IMAGE:-sparse-rl:smoke}"
LOCAL_BASE="${LOCAL_BASE:-localhost/sparse-rl-base:bookworm}"
DEBIAN_MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
DATA="${DATA:-$(dirname "$ROOT")/shared/data}"
SMOKE_TESTS="${SMOKE_TESTS:-tests/docker tests/checkpoint_tools}"
SMOKE_K="${SMOKE_K:-dockerfile or setup or roundtrip}"
SUMMARY=()

log() { echo "[smoke] $*" >&2; }
die() { echo "smoke: error: $*" >&2; exit 1; }

# --- the engine ---------------------------------------------------------------------------

docker_answers() { command -v docker >/dev/null 2>&1 && timeout 20 docker info >/dev/null 2>&1; }

podman_conf() {
    # crun fails on hosts with hybrid cgroups and tight rlimits: runc, and no default ulimits
    local conf="$SMOKE_DIR/containers.conf"
    printf '[containers]\ndefault_ulimits = []\n' >"$conf"
    if command -v runc >/dev/null 2>&1; then
        printf '\n[engine]\nruntime = "runc"\n' >>"$conf"
    fi
    export CONTAINERS_CONF="${CONTAINERS_CONF:-$conf}"
}

podman_answers() { command -v podman >/dev/null 2>&1 && podman_conf && timeout 60 podman info >/dev/null 2>&1; }

choose_engine() {
    case "${ENGINE:-}" in
        docker) docker_answers || die "ENGINE=docker: the docker daemon does not answer (docker info)" ;;
        podman) podman_answers || die "ENGINE=podman: podman info fails (apt-get install -y podman runc)" ;;
        "") if docker_answers; then ENGINE=docker
            elif podman_answers; then ENGINE=podman
            else die "no container engine: docker's daemon does not answer (docker info) and podman is missing or fails; start dockerd, or install podman (Debian/Ubuntu: apt-get install -y podman runc)"
            fi ;;
        *) die "ENGINE=$ENGINE: expected docker or podman" ;;
    esac
}

# --- the base -------------------------------------------------------------------------------

qualified() {
    # podman asks which registry a short name means; docker's is Docker Hub
    local first="${1%%/*}"
    if [[ "$1" == */* && ( "$first" == *.* || "$first" == *:* || "$first" == localhost ) ]]; then
        echo "$1"
    else
        echo "docker.io/$1"
    fi
}

have_image() { "$ENGINE" image inspect "$1" >/dev/null 2>&1; }

debian_tar() {
    # a Debian bookworm root filesystem (minbase, python3 with venv) as a tar on stdout:
    # mmdebstrap (about twice as quick, writes the tar itself) or debootstrap (root)
    local packages=python3,python3-venv,ca-certificates rootfs="$SMOKE_DIR/rootfs"
    if command -v mmdebstrap >/dev/null 2>&1; then
        mmdebstrap --variant=minbase --include="$packages" bookworm - "$DEBIAN_MIRROR"
    else
        debootstrap --variant=minbase --include="$packages" bookworm "$rootfs" "$DEBIAN_MIRROR" >&2 || return 1
        rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
        tar -C "$rootfs" -c .
        rm -rf "$rootfs"
    fi
}

make_local_base() {
    have_image "$LOCAL_BASE" && { log "base: $LOCAL_BASE (cached)"; return 0; }
    command -v mmdebstrap >/dev/null 2>&1 || command -v debootstrap >/dev/null 2>&1 \
        || die "BASE_IMAGE=$BASE_IMAGE cannot be pulled and neither mmdebstrap nor debootstrap is there to make a base (apt-get install -y mmdebstrap)"
    command -v mmdebstrap >/dev/null 2>&1 || [[ "$(id -u)" == 0 ]] \
        || die "BASE_IMAGE=$BASE_IMAGE cannot be pulled; making $LOCAL_BASE with debootstrap needs root (once: it is cached), mmdebstrap does not"
    log "base: Debian bookworm (minbase, python3) from $DEBIAN_MIRROR, imported as $LOCAL_BASE"
    local logfile="$SMOKE_DIR/logs/base.log"
    debian_tar 2>"$logfile" | "$ENGINE" import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'CMD ["bash"]' - "$LOCAL_BASE" >>"$logfile" 2>&1 \
        || { tail -n 20 "$logfile" >&2; die "could not make $LOCAL_BASE (log: $logfile)"; }
}

choose_base() {
    BASE_IMAGE="${BASE_IMAGE:-$(sed -n 's/^ARG BASE_IMAGE=//p' "$DOCKERFILE")}"
    TORCH_MODE=system  # an official PyTorch image: keep its torch
    local ref
    ref="$(qualified "$BASE_IMAGE")"
    if have_image "$ref" || timeout 900 "$ENGINE" pull "$ref" >"$SMOKE_DIR/logs/pull.log" 2>&1; then
        BASE_IMAGE="$ref"
        return 0
    fi
    log "base: $BASE_IMAGE cannot be pulled ($(tail -n 1 "$SMOKE_DIR/logs/pull.log" | cut -c1-120))"
    make_local_base
    BASE_IMAGE="$LOCAL_BASE"
    TORCH_MODE=auto  # no torch in the base: setup.sh's choice (CPU torch, no GPU while building)
}

# --- pip's settings ------------------------------------------------------------------------

pip_settings() { python3 -m pip config list 2>/dev/null || true; }

host_pip_conf() {
    # where the host's pip looks (indexes, wheel folders, its CA bundle), the first value of each
    # key (pip config list puts the environment's first, and it wins in pip too)
    echo "[global]"
    { pip_settings || true; } \
        | sed -n -E "s/^[^.]*\.(index-url|extra-index-url|find-links|cert|trusted-host)='(.*)'\$/\1 = \2/p" \
        | awk '!seen[$1]++'
}

local_paths() {
    # the files and folders a pip config names (file:// URLs and plain paths); an index's folder
    # with its parent, where its pages link to (../../files/...)
    local key _ value
    while read -r key _ value; do
        for value in $value; do
            value="${value#file://}"
            [[ "$value" == /* ]] || continue
            if [[ "$key" == *index-url ]]; then dirname "$value"; else echo "$value"; fi
        done
    done < <(tail -n +2 "$1") | awk '!seen[$0]++'
}

pip_build_args() {
    # podman: the build's pip sees what the host's pip sees, each local folder mounted read-only
    # under /run/host-pip (nothing copied into the context, nothing but that folder's name left in
    # the image); docker (no mounts while building): pip's defaults, PyPI
    PIP_ARGS=()
    [[ "$ENGINE" == podman ]] || return 0
    local conf="$SMOKE_DIR/pip.conf" path
    host_pip_conf >"$conf"
    (( $(wc -l <"$conf") > 1 )) || return 0
    PIP_ARGS=(--build-arg PIP_CONFIG_FILE=/run/host-pip/pip.conf)
    while read -r path; do
        [[ -e "$path" ]] && PIP_ARGS+=(-v "$path:/run/host-pip$path:ro")
    done < <(local_paths "$conf")
    log "pip: the host's settings, $(tail -n +2 "$conf" | tr '\n' ' ')"
    sed -i -E '2,$ s#(^| )(file://)?/#\1\2/run/host-pip/#g' "$conf"
    PIP_ARGS+=(-v "$conf:/run/host-pip/pip.conf:ro")
}

# --- steps ----------------------------------------------------------------------------------

timed() {
    # timed NAME COMMAND...: run it, add its wall time to the summary
    local name="$1" start=$SECONDS
    shift
    "$@"
    SUMMARY+=("$name $((SECONDS - start))s")
    log "$name: ok in $((SECONDS - start)) s"
}

logged() {
    # logged NAME COMMAND...: its output in logs/NAME.log, the log's end shown if it fails. In a
    # background subshell: `set -e` holds inside it (a `||` would switch it off)
    local name="$1" rc=0
    shift
    log "$name ..."
    ( "$@" ) >"$SMOKE_DIR/logs/$name.log" 2>&1 &
    wait $! || rc=$?
    if (( rc != 0 )); then
        tail -n 40 "$SMOKE_DIR/logs/$name.log" >&2
        die "step $name failed (exit $rc; log: $SMOKE_DIR/logs/$name.log)"
    fi
}

step() { timed "$1" logged "$@"; }

build() {
    local ignore=()
    [[ "$ENGINE" == podman ]] && ignore=(--ignorefile "$ROOT/docker/Dockerfile.dockerignore")
    "$ENGINE" build -f "$DOCKERFILE" -t "$IMAGE" "${ignore[@]}" "${PIP_ARGS[@]}" \
        --build-arg "BASE_IMAGE=$BASE_IMAGE" --build-arg "SPARSE_RL_TORCH=$TORCH_MODE" "$ROOT"
    "$ENGINE" image inspect "$IMAGE" >/dev/null  # a build stopped by a signal may still exit 0
}

in_image() {
    # the way docker/README.md runs it: data and models mounted beside the code, runs/ outside
    "$ENGINE" run --rm --shm-size 2g \
        -v "$DATA:/workspace/shared/data:ro" -v "$SMOKE_DIR/models:/workspace/models" \
        -v "$SMOKE_DIR/runs:/workspace/sparse-rl/runs" "$@"
}

dry_run() {
    in_image -e DRY_RUN=1 "$IMAGE" bash scripts/run-qwen2.5-3b-rkv.sh | tee "$SMOKE_DIR/dry-run.txt"
    grep -q -- "-m trainer.train .*--prompt-data /workspace/shared/data/train/" "$SMOKE_DIR/dry-run.txt" \
        || { echo "the dry run printed no trainer command reading the mounted data"; return 1; }
}

# the 1.5B R-KV recipe cut down to 2 rollouts of 1 prompt x 2 samples, 10 tokens each
TINY_FLAGS=(--max-prompt-len 1000 --rollout-batch-size 1 --n-samples-per-prompt 2 --global-batch-size 2
            --rollout-max-response-len 10 --eval-max-response-len 8 --max-tokens-per-gpu 1024
            --sglang-max-total-tokens 4096 --reward-workers 1 --sglang-compress-max-prompt 4
            --sglang-compress-divide-length 2 --sglang-compress-max-window 2)

train_tiny() {
    in_image "$IMAGE" python -m checkpoint_tools.tiny_models --out /workspace/models/Qwen2.5-1.5B
    in_image -e NUM_ROLLOUT=2 -e EVAL_SETS=amc23 -e EVAL_INTERVAL=2 "$IMAGE" \
        bash scripts/run-qwen2.5-1.5b-rkv.sh "${TINY_FLAGS[@]}"
    local out="$SMOKE_DIR/runs/run-qwen2.5-1.5b-rkv"
    [[ "$(cat "$out/latest_checkpointed_iteration.txt")" == 2 ]] || { echo "no checkpoint of step 2"; return 1; }
    grep -q '"kv_compressions_per_sample": [1-9]' "$out/logs/metrics.jsonl" \
        || { echo "metrics.jsonl shows no R-KV compression"; return 1; }
}

serve() {
    # the server in the image, /generate from inside it: 8 greedy tokens past EOS, each of them
    # Hugging Face's argmax on the same prefix (a prompt this short stays under the R-KV budget)
    in_image "$IMAGE" bash -c '
python -m sglang_kvc.launch_server --model-path /workspace/models/Qwen2.5-1.5B --port 30000 \
    --compress-algorithm rkv --compress-max-prompt 16 --compress-max-window 4 \
    --compress-divide-length 4 >/tmp/server.log 2>&1 &
python - $! <<"PY" || { tail -n 30 /tmp/server.log; exit 1; }
import json, os, sys, urllib.request
import torch
from transformers import AutoModelForCausalLM
from trainer.rollout.engines.lifecycle import wait_healthy  # the one health wait
url, server = "http://127.0.0.1:30000", int(sys.argv[1])
def running():
    assert os.path.exists(f"/proc/{server}"), "the server exited"
assert not wait_healthy([url], 600, poll=0.5, check=running), "no answer on /health in 600 s"
body = {"input_ids": [5, 17, 9, 40], "sampling_params": {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}}
req = urllib.request.Request(url + "/generate", json.dumps(body).encode(), {"Content-Type": "application/json"})
out = json.load(urllib.request.urlopen(req, timeout=300))
print(json.dumps(out)[:400])
assert out["meta_info"]["completion_tokens"] == len(out["output_ids"]) == 8, out
model = AutoModelForCausalLM.from_pretrained("/workspace/models/Qwen2.5-1.5B", dtype=torch.float32)
logits = model(torch.tensor([body["input_ids"] + out["output_ids"]])).logits[0, 3:-1]
chosen = logits.gather(1, torch.tensor(out["output_ids"])[:, None])[:, 0]
assert (chosen >= logits.max(1).values - 1e-3).all(), (chosen, logits.max(1))
print("/generate: 8 tokens, each the HF argmax")
PY'
}

tests_inside() {
    # shellcheck disable=SC2086  # SMOKE_TESTS is a list of paths
    in_image "$IMAGE" bash scripts/test.sh $SMOKE_TESTS -k "$SMOKE_K" -q -p no:cacheprovider
}

# --- data -----------------------------------------------------------------------------------

synthetic_data() {
    # without ../shared/data: a few rows in the same layout (train prompts, one eval set)
    DATA="$SMOKE_DIR/data"
    local train="$DATA/train/simplelr_qwen_level3to5" eval="$DATA/eval/amc23" i
    mkdir -p "$train" "$eval"
    for i in $(seq 1 20); do
        printf '{"prompt": "<|im_start|>user\\nWhat is %d + %d?<|im_end|>\\n<|im_start|>assistant\\n", "label": "%d"}\n' \
            "$i" "$i" $((2 * i)) >>"$train/train.jsonl"
        printf '{"problem": "What is %d + %d?", "answer": %d}\n' "$i" 3 $((i + 3)) >>"$eval/test.jsonl"
    done
    # the 3B script's default eval sets, for its dry run
    cp -r "$eval" "$DATA/eval/aime24" && cp -r "$eval" "$DATA/eval/math500"
    log "data: $DATA (synthetic: no ../shared/data beside the checkout)"
}

cleanup() {
    # a passing run (or a check) leaves nothing behind; a failing one its logs
    if [[ -n "${OWN_DIR:-}" && -n "${REMOVE_DIR:-}" && -z "${SMOKE_KEEP:-}" ]]; then
        rm -rf "$SMOKE_DIR"
    fi
}

main() {
    if [[ -z "${SMOKE_DIR:-}" ]]; then
        SMOKE_DIR="$(mktemp -d -t sparse-rl-smoke.XXXXXX)"
        OWN_DIR=1
    fi
    mkdir -p "$SMOKE_DIR/logs" "$SMOKE_DIR/models" "$SMOKE_DIR/runs"
    trap cleanup EXIT
    REMOVE_DIR=1  # nothing worth keeping until the build starts
    choose_engine
    log "engine: $ENGINE ($("$ENGINE" --version))"
    [[ "${1:-}" != --check ]] || { echo "$ENGINE"; return 0; }
    REMOVE_DIR=
    [[ -d "$DATA/train" ]] || synthetic_data
    local start=$SECONDS size
    timed base choose_base
    pip_build_args
    step build build
    step dry-run dry_run
    step train train_tiny
    step serve serve
    step tests tests_inside
    size="$("$ENGINE" image inspect --format '{{.Size}}' "$IMAGE")"
    echo "smoke: ok | $ENGINE, image $IMAGE $(awk "BEGIN {printf \"%.2f GB\", $size / 1e9}") from $BASE_IMAGE | $(IFS=,; echo "${SUMMARY[*]}" | sed 's/,/, /g') | total $((SECONDS - start))s"
    REMOVE_DIR=1
}

main "$@"; exit  # one line: an edit to this file while it runs cannot run more of it
