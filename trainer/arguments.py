"""Command-line flags of ``python -m trainer.train``, slime's names where slime has them.

A YAML file (``--config run.yaml``) may hold the same keys (dashes or underscores); flags given
on the command line win. Rollout-server flags take the ``--sglang-`` prefix
(``--sglang-compress-algorithm rkv``) and are validated by the server's own rules. Unknown or
inconsistent flags stop the run at once with a message naming them.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from .algorithms.argparse_flags import add_algorithm_args
from .rollout.config import add_engine_args, server_args_from
from .rollout.weight_sync import MODES as WEIGHT_SYNC_MODES


def build_parser() -> argparse.ArgumentParser:
    from sglang_kvc.server_args import OneLineParser  # one-line errors, no abbreviations

    p = OneLineParser(prog="python -m trainer.train",
                      description="GRPO with sparse (KV-compressed) rollouts.")
    p.add_argument("--config", default=None, help="YAML file with any of these flags as keys")
    for add in (_add_model_args, _add_launch_args, _add_data_args, _add_rollout_args,
                add_engine_args, _add_training_args, add_algorithm_args, _add_eval_args):
        add(p)  # --help shows the groups in this order
    _add_optional(p, "trainer.rollout.rewards", "add_reward_args")
    _add_optional(p, "trainer.tracking", "add_logging_args")
    _add_optional(p, "trainer.learner.config", "add_sparse_replay_args")
    _add_optional(p, "trainer.rollout.fidelity", "add_fidelity_args")
    return p


def _add_model_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model and checkpoints")
    g.add_argument("--hf-checkpoint", required=True,
                   help="HF model dir: architecture, tokenizer, initial weights, rollout engine")
    g.add_argument("--load", default=None,
                   help="torch_dist checkpoint to start from; a trainer checkpoint resumes the "
                        "run (rollout id, data position, optimizer, RNG)")
    g.add_argument("--ref-load", default=None,
                   help="reference model for the KL loss (default: --hf-checkpoint)")
    g.add_argument("--save", default=None, help="where trainer checkpoints are written")
    g.add_argument("--save-interval", type=int, default=None,
                   help="save every N rollouts (and always after the last)")
    g.add_argument("--tensor-model-parallel-size", type=int, default=1)
    g.add_argument("--pipeline-model-parallel-size", type=int, default=1)
    g.add_argument("--attention-backend", default="auto", choices=["auto", "te", "sdpa", "local"])
    g.add_argument("--seed", type=int, default=1234)


def _add_launch_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("launch (process groups come from torchrun / the launcher's env)")
    g.add_argument("--rendezvous-timeout", type=float, default=300.0,
                   help="seconds for all ranks to meet at MASTER_ADDR:MASTER_PORT before failing "
                        "with the missing ranks named")
    g.add_argument("--distributed-timeout-minutes", type=float, default=30.0,
                   help="timeout of each collective once the job runs (Megatron's flag)")


def _add_data_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("data")
    g.add_argument("--prompt-data", required=True,
                   help="JSONL/parquet of prompts; 'file.jsonl@[0:1000]' takes a slice")
    g.add_argument("--input-key", default="prompt")
    g.add_argument("--label-key", default="label")
    g.add_argument("--apply-chat-template", action="store_true",
                   help="wrap string prompts in the tokenizer's chat template (message lists "
                        "always are)")
    g.add_argument("--rollout-shuffle", action=argparse.BooleanOptionalAction, default=True)
    g.add_argument("--max-prompt-len", type=int, default=None,
                   help="keep only the last N prompt tokens")


def _add_rollout_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("rollout")
    _add_sampling_args(g)
    _add_server_args(g)
    _add_rollout_extras(g)


def _add_sampling_args(g) -> None:
    g.add_argument("--rollout-batch-size", type=int, default=32, help="prompts per rollout")
    g.add_argument("--n-samples-per-prompt", type=int, default=8)
    g.add_argument("--rollout-max-response-len", type=int, default=1024)
    g.add_argument("--rollout-temperature", type=float, default=1.0)
    g.add_argument("--rollout-top-p", type=float, default=1.0)
    g.add_argument("--rollout-top-k", type=int, default=-1)
    g.add_argument("--rollout-stop-token-ids", type=int, nargs="*", default=None)
    g.add_argument("--overlong-buffer-len", type=int, default=0,
                   help="DAPO soft over-long penalty (verl's overlong_buffer.len): responses longer "
                        "than --rollout-max-response-len minus this lose up to "
                        "--overlong-penalty-factor of training reward, linearly (default: 0, off)")
    g.add_argument("--overlong-penalty-factor", type=float, default=1.0,
                   help="the over-long penalty at the maximum length (default: 1.0)")
    g.add_argument("--overlong-filtering", action="store_true",
                   help="DAPO over-long filtering: truncated samples are masked from the loss")
    g.add_argument("--dynamic-sampling-filter-path", default=None,
                   help="DAPO dynamic sampling (slime's flag): keep only the prompt groups this "
                        "filter passes, generating rounds until the batch is full; "
                        "'reward_nonzero_std' (built in: rewards not all equal) or "
                        "'pkg.module:fn', fn(group: list[Trace]) -> bool")
    g.add_argument("--over-sampling-batch-size", type=int, default=None,
                   help="prompts per dynamic-sampling round (slime's flag; default: "
                        "--rollout-batch-size)")


def _add_server_args(g) -> None:
    """Where rollouts run and how weights reach them."""
    g.add_argument("--rollout-server-urls", nargs="*", default=None,
                   help="SGLang-API servers (sglang-kvc or stock SGLang); default: an in-process "
                        "engine on every data-parallel rank, colocated with the trainer")
    g.add_argument("--rollout-engine-urls", nargs="*", default=None,
                   help="the engines behind a router given as --rollout-server-urls: weight "
                        "updates go to each of them, since a router forwards only generation "
                        "(default: the --rollout-server-urls themselves). Behind a router the "
                        "trainer cannot fail over between engines; python -m trainer.ray_job "
                        "gives it the engines themselves as --rollout-server-urls")
    g.add_argument("--rollout-engine-process", action="store_true",
                   help="run each rank's colocated engine as a child process (python -m "
                        "sglang_kvc.launch_server with the --sglang-* flags, on the rank's device) "
                        "talked to over HTTP, instead of in the trainer's process: with "
                        "--max-staleness, generation and training then overlap without sharing "
                        "one Python interpreter; weights go by ipc on a GPU, tensor on a CPU")
    g.add_argument("--rollout-engine-placement", default="per-gpu", choices=["per-gpu", "per-replica"],
                   help="colocated engines: one on every GPU (default; at TP > 1 each holds the full "
                        "weights, and every GPU generates), or one per data-parallel replica on its "
                        "first tensor-parallel rank (less engine memory, fewer generating GPUs)")
    g.add_argument("--rollout-num-gpus", type=int, default=0,
                   help="disaggregated rollouts under torchrun (slime's flag): global rank 0 starts "
                        "this many engine processes (python -m sglang_kvc.launch_server, one GPU "
                        "each) on this node's GPUs after the trainer's (local GPU LOCAL_WORLD_SIZE "
                        "onwards); weights go over NCCL (--weight-sync distributed) on a GPU")
    g.add_argument("--rollout-concurrency", type=int, default=64,
                   help="in-flight HTTP requests per server")
    g.add_argument("--rollout-samples-per-request", type=int, default=256,
                   help="samples sent together as one batched HTTP /generate request (SGLang "
                        "takes lists of input_ids); 1 sends one request per sample. A request "
                        "that fails is re-issued whole, to another engine when it is down")
    g.add_argument("--weight-sync", default="auto",
                   choices=["auto", *WEIGHT_SYNC_MODES],
                   help="how weights reach the engine (auto: inprocess, or tensor over HTTP; ipc: "
                        "handles to this host's memory, for servers on the same machine)")
    g.add_argument("--weight-sync-bucket-mb", type=int, default=512)
    g.add_argument("--weight-sync-master-address", default=None,
                   help="--weight-sync distributed: the address servers reach the trainer's rank 0 "
                        "at (default: $MASTER_ADDR, else 127.0.0.1); set it when servers run on "
                        "other nodes")
    g.add_argument("--weight-sync-timeout", type=float, default=120.0,
                   help="--weight-sync distributed: seconds a broadcast of the weight-update "
                        "group may wait for a member. An engine that dies in a push is found at "
                        "once (its request fails) and the push goes on without it; this bounds "
                        "what is left waiting (sglang-kvc servers get a value other than the "
                        "default in the group's request; default: 120)")


def _add_rollout_extras(g) -> None:
    """Debug dumps, generate plug-ins, the colocated engine's memory."""
    g.add_argument("--save-debug-rollout-data", default=None,
                   help="write each rollout's samples (ids, log-probs, reward, engine) as JSONL to "
                        "this path; '{rollout_id}' in it is replaced (slime's flag)")
    g.add_argument("--custom-generate-function-path", default=None,
                   help="generate plug-in 'pkg.module:func_or_class' (slime's flag): decides the "
                        "requests of a rollout and returns traces (trainer/rollout/generate.py; "
                        "recipes: recipes.rc:ReasoningCache, recipes.apr:APRSubcalls)")
    g.add_argument("--custom-generate-args", nargs="*", default=None, metavar="KEY=VALUE",
                   help="options of a plug-in class (values parsed as JSON when they parse)")
    g.add_argument("--max-staleness", type=int, default=None,
                   help="asynchronous rollouts (AReaL's max_head_offpolicyness): the next rollouts "
                        "are generated while the current one trains, each sample at most N weight "
                        "versions behind the weights it trains; 0 equals the synchronous run "
                        "(default: synchronous)")
    g.add_argument("--partial-rollout", action="store_true",
                   help="slime's partial rollouts (with --max-staleness): a weight push interrupts "
                        "the requests in flight, which keep their tokens and continue under the "
                        "new weights (each token keeps its behaviour log-prob and version)")
    g.add_argument("--offload-rollout", action=argparse.BooleanOptionalAction, default=None,
                   help="release the colocated engine's KV memory while training (default: on "
                        "with a GPU)")


def _add_training_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("training")
    g.add_argument("--num-rollout", type=int, default=100)
    g.add_argument("--global-batch-size", type=int, default=None,
                   help="samples per optimizer step (default: the whole rollout)")
    g.add_argument("--lr", type=float, default=1e-6)
    g.add_argument("--min-lr", type=float, default=0.0)
    g.add_argument("--lr-decay-style", default="constant", choices=["constant", "linear", "cosine"])
    g.add_argument("--lr-warmup-iters", type=int, default=0)
    g.add_argument("--lr-decay-iters", type=int, default=None)
    g.add_argument("--weight-decay", type=float, default=0.1)
    g.add_argument("--adam-beta1", type=float, default=0.9)
    g.add_argument("--adam-beta2", type=float, default=0.98)
    g.add_argument("--adam-eps", type=float, default=1e-8)
    g.add_argument("--clip-grad", type=float, default=1.0)
    g.add_argument("--max-tokens-per-gpu", type=int, default=8192,
                   help="token budget of one packed micro-batch")
    g.add_argument("--log-probs-chunk-size", type=int, default=1024,
                   help="tokens per fp32 chunk of the log-prob pass off CUDA (on CUDA one Triton "
                        "pass covers the micro-batch)")
    g.add_argument("--fused-old-logprobs", action=argparse.BooleanOptionalAction, default=True,
                   help="on-policy rollouts (one optimizer step, no staleness) take pi_old from the "
                        "update's own forward instead of a recompute pass (default: on; "
                        "trainer/README.md lists where the recompute stays)")


def _add_eval_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("evaluation")
    g.add_argument("--eval-prompt-data", nargs="*", default=None,
                   help="name path pairs: 'aime24 data/aime24.jsonl math500 data/math500.jsonl'")
    g.add_argument("--eval-interval", type=int, default=None, help="evaluate every N rollouts")
    g.add_argument("--eval-before-train", action="store_true",
                   help="also evaluate the starting policy (logged as step 0), as verl's val_before_train")
    g.add_argument("--n-samples-per-eval-prompt", type=int, default=1)
    g.add_argument("--eval-max-response-len", type=int, default=None)
    g.add_argument("--eval-temperature", type=float, nargs="+", default=[0.0],
                   help="one evaluation pass per value, e.g. '0 1': greedy (one sample per prompt) "
                        "and T = 1 with --n-samples-per-eval-prompt samples (pass@n); passes after "
                        "the first are logged as eval/<name>_t<T>/*")
    g.add_argument("--eval-top-p", type=float, default=1.0)
    g.add_argument("--eval-compression", choices=["train", "dense", "both"], default="train",
                   help="KV of the evaluation samples: as the rollouts (the engines' --sglang-compress-*), "
                        "dense (sglang-kvc's per-request compress: false on the same engines), or both "
                        "(dense scores logged as eval/<name>_dense/*)")
    g.add_argument("--eval-input-key", default=None)
    g.add_argument("--eval-label-key", default=None)


def _add_optional(parser, module: str, fn: str) -> None:
    import importlib

    getattr(importlib.import_module(module), fn)(parser)


def _yaml_defaults(parser: argparse.ArgumentParser, path: str) -> None:
    import yaml

    file = Path(path)
    if not file.is_file():
        parser.error(f"--config {path}: file not found")
    try:
        data = yaml.safe_load(file.read_text()) or {}
    except yaml.YAMLError as e:
        parser.error(f"--config {path}: not valid YAML ({e})")
    if not isinstance(data, dict):
        parser.error(f"--config {path}: expected a mapping of flag names to values")
    known = {a.dest for a in parser._actions}
    values = {}
    for key, value in data.items():
        dest = str(key).lstrip("-").replace("-", "_")
        if dest not in known:
            parser.error(f"--config {path}: unknown key {key!r}")
        values[dest] = value
    parser.set_defaults(**values)
    for action in parser._actions:  # a key in the file satisfies a required flag
        if action.dest in values:
            action.required = False


def _check_data_paths(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """A missing data file fails now, not after the model and the engine are up."""
    from .rollout.data import parse_data_spec

    specs = [("--prompt-data", args.prompt_data)]
    specs += [("--eval-prompt-data", s) for s in (args.eval_prompt_data or [])[1::2]]
    for flag, spec in specs:
        path, _ = parse_data_spec(spec)
        if not path.is_file():
            parser.error(f"{flag} {path}: file not found")


def _warn_replay_without_compression(args: argparse.Namespace) -> None:
    """Eviction replay with a dense engine replays nothing: it is the dense recompute."""
    if not (args.sparse_recompute or args.train_sparse_policy) or args.rollout_server_urls:
        return
    algo = (getattr(args, "sglang_compress_algorithm", None) or "none").strip().lower()
    if algo == "none":
        flag = "--train-sparse-policy" if args.train_sparse_policy else "--sparse-recompute"
        _warn(f"{flag} without --sglang-compress-algorithm: the engine evicts nothing, so the "
              f"replay is the dense recompute")


def _warn(message: str) -> None:
    """A flag that has no effect in its combination: one line at start-up, the run goes on."""
    print(f"python -m trainer.train: warning: {message}", file=sys.stderr)


def _check_dynamic_sampling(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    from .rollout.dynamic_sampling import DynamicSamplingConfig

    if args.over_sampling_batch_size is not None and args.over_sampling_batch_size < 1:
        parser.error("--over-sampling-batch-size must be >= 1")
    if args.over_sampling_batch_size and not args.dynamic_sampling_filter_path:
        parser.error("--over-sampling-batch-size needs --dynamic-sampling-filter-path")
    if args.dynamic_sampling_filter_path:
        try:  # a bad path fails now, naming the flag
            DynamicSamplingConfig(args.dynamic_sampling_filter_path).load_filter()
        except ValueError as e:
            parser.error(str(e))


def parse_args(argv=None) -> argparse.Namespace:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--config" in argv:
        i = argv.index("--config")
        if i + 1 >= len(argv):
            parser.error("--config needs a path")
        _yaml_defaults(parser, argv[i + 1])
    args = parser.parse_args(argv)
    check_args(parser, args)
    return args


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Inconsistent combinations fail now, not after the first rollout."""
    from .learner.config import check_sparse_replay_args
    from .rollout.fidelity import check_fidelity_args

    check_sparse_replay_args(parser, args)
    check_fidelity_args(parser, args)
    if args.save_debug_rollout_data:
        try:
            args.save_debug_rollout_data.format(rollout_id=0)
        except (KeyError, IndexError, ValueError) as e:
            parser.error(f"--save-debug-rollout-data {args.save_debug_rollout_data!r}: only "
                         f"'{{rollout_id}}' may be substituted ({type(e).__name__}: {e})")
    if args.rendezvous_timeout <= 0 or args.distributed_timeout_minutes <= 0:
        parser.error("--rendezvous-timeout and --distributed-timeout-minutes must be > 0")
    for flag in ("rollout_batch_size", "n_samples_per_prompt", "rollout_max_response_len",
                 "num_rollout", "max_tokens_per_gpu", "tensor_model_parallel_size",
                 "pipeline_model_parallel_size", "rollout_concurrency",
                 "rollout_samples_per_request"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be >= 1")
    samples = args.rollout_batch_size * args.n_samples_per_prompt
    if args.global_batch_size is None:
        args.global_batch_size = samples
    if args.global_batch_size < 1 or samples % args.global_batch_size:
        parser.error(f"--global-batch-size {args.global_batch_size} must divide "
                     f"--rollout-batch-size x --n-samples-per-prompt = {samples}")
    if not Path(args.hf_checkpoint, "config.json").is_file():
        parser.error(f"--hf-checkpoint {args.hf_checkpoint}: no config.json there")
    _check_data_paths(parser, args)
    # The engine reports log_softmax(logits / T) over the whole vocabulary, before truncation,
    # and the trainer replays only T: truncated sampling would make every importance ratio wrong.
    if args.rollout_top_p < 1.0 or args.rollout_top_k > 0:
        parser.error(f"--rollout-top-p {args.rollout_top_p} / --rollout-top-k {args.rollout_top_k}: "
                     "truncated sampling is not supported for training rollouts (the behaviour "
                     "log-probs and the trainer's recompute are over the full vocabulary); use "
                     "--rollout-top-p 1.0 --rollout-top-k -1 (eval may truncate: --eval-top-p)")
    if not 0 <= args.overlong_buffer_len < args.rollout_max_response_len:
        parser.error(f"--overlong-buffer-len {args.overlong_buffer_len} must be in "
                     f"[0, --rollout-max-response-len {args.rollout_max_response_len})")
    _check_dynamic_sampling(parser, args)
    if args.max_staleness is not None and args.max_staleness < 0:
        parser.error("--max-staleness must be >= 0")
    if args.partial_rollout and args.max_staleness is None:
        parser.error("--partial-rollout needs --max-staleness (asynchronous rollouts)")
    if args.partial_rollout and args.max_staleness == 0:
        _warn("--partial-rollout with --max-staleness 0 interrupts nothing: no rollout is in "
              "flight at a weight push (use --max-staleness >= 1 for partial rollouts)")
    _warn_replay_without_compression(args)
    if args.partial_rollout and (args.sparse_recompute or args.train_sparse_policy):
        parser.error("--partial-rollout with --sparse-recompute / --train-sparse-policy is not "
                     "supported: a resumed request starts a new eviction record, so no record "
                     "describes the whole sample")
    if args.overlong_penalty_factor < 0:
        parser.error("--overlong-penalty-factor must be >= 0")
    if args.rollout_temperature <= 0:
        parser.error("--rollout-temperature must be > 0 (the trainer divides logits by it)")
    if args.custom_generate_args and not args.custom_generate_function_path:
        parser.error("--custom-generate-args needs --custom-generate-function-path")
    if args.eval_prompt_data and len(args.eval_prompt_data) % 2:
        parser.error("--eval-prompt-data takes name path pairs")
    if args.rollout_num_gpus:
        _check_rollout_gpus(parser, args)
    elif args.rollout_engine_process:
        _check_engine_process(parser, args)
    elif args.weight_sync == "auto":
        args.weight_sync = "tensor" if args.rollout_server_urls else "inprocess"
    if args.weight_sync == "inprocess" and args.rollout_server_urls:
        parser.error("--weight-sync inprocess needs the in-process engine; drop "
                     "--rollout-server-urls or pick tensor/disk/distributed")
    if args.rollout_engine_urls and not args.rollout_server_urls:
        parser.error("--rollout-engine-urls names the engines behind --rollout-server-urls; "
                     "give --rollout-server-urls too")
    if args.weight_sync != "inprocess" and not (args.rollout_server_urls or args.rollout_num_gpus
                                                or args.rollout_engine_process):
        parser.error(f"--weight-sync {args.weight_sync} needs --rollout-server-urls")
    if not args.rollout_server_urls:
        try:
            server_args_from(args)
        except ValueError as e:  # the server's own validation names its flag without the prefix
            parser.error(re.sub(r"--(?!sglang-)", "--sglang-", str(e)))


def _check_rollout_gpus(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """--rollout-num-gpus starts its own servers on GPUs of their own: no other engines."""
    if args.rollout_num_gpus < 0:
        parser.error("--rollout-num-gpus must be >= 0")
    if args.rollout_server_urls or args.rollout_engine_urls or args.rollout_engine_process:
        parser.error("--rollout-num-gpus starts the engines itself; drop --rollout-server-urls / "
                     "--rollout-engine-urls / --rollout-engine-process")
    if args.weight_sync == "inprocess":
        parser.error("--weight-sync inprocess needs the in-process engine; with "
                     "--rollout-num-gpus use distributed (GPU), tensor or disk")
    if args.weight_sync == "auto":
        import torch

        args.weight_sync = "distributed" if torch.cuda.is_available() else "tensor"


def _check_engine_process(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """--rollout-engine-process starts its own servers: no others, no in-process weight path."""
    from .rollout.engine_process import weight_transport

    if args.rollout_server_urls or args.rollout_engine_urls:
        parser.error("--rollout-engine-process starts the engines itself; drop "
                     "--rollout-server-urls / --rollout-engine-urls")
    if args.weight_sync == "inprocess":
        parser.error("--weight-sync inprocess needs the in-process engine; with "
                     "--rollout-engine-process use ipc (GPU), tensor or disk")
    if args.weight_sync == "auto":
        args.weight_sync = weight_transport()
