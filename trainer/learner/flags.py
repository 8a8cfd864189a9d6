"""The learner's command-line flags and their checks: the model and its checkpoints, training,
eviction replay. No torch here (``--help`` and flag errors come before it loads); each default
is the field's of the config it fills (``settings.py``), and ``config.py`` reads the flags into
those configs.
"""

from __future__ import annotations

import argparse

from ..launch import ParallelConfig
from .checkpoint_policy import add_checkpoint_args
from .settings import ModelConfig, OptimConfig, TrainConfig

# --sparse-attention: how eviction replay attends (sparse_attention.py implements each)
SPARSE_IMPLS = ("auto", "mask", "flex")
# deleted choices, with the reason a command line that still names one is told
REMOVED_SPARSE_IMPLS = {"gather": "deleted on 2026-11-29 (flex was faster on an H200); use flex"}


def sparse_impl(value: str) -> str:
    """``--sparse-attention``'s value; a deleted choice gets its own message, not just the list."""
    if value in REMOVED_SPARSE_IMPLS:
        raise argparse.ArgumentTypeError(
            f"{value!r} is no longer a choice: {REMOVED_SPARSE_IMPLS[value]} "
            f"(choose from {', '.join(SPARSE_IMPLS)})")
    return value


def global_batch_size(args: argparse.Namespace) -> int:
    """Samples per optimizer step: ``--global-batch-size``, by default the whole rollout."""
    if args.global_batch_size is None:
        return args.rollout_batch_size * args.n_samples_per_prompt
    return args.global_batch_size


def replays(args: argparse.Namespace) -> bool:
    return getattr(args, "sparse_recompute", False) or getattr(args, "train_sparse_policy", False)


def check_sparse_replay_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if replays(args) and args.attention_backend not in ("auto", "sdpa"):
        parser.error(f"--sparse-recompute / --train-sparse-policy need --attention-backend sdpa "
                     f"(or auto): the eviction masks are applied there, not by "
                     f"{args.attention_backend!r}")


def add_sparse_replay_args(parser: argparse.ArgumentParser) -> None:
    """Eviction replay (learner/sparse_attention.py): the rollouts return their eviction records
    and the learner's forward attends under them."""
    g = parser.add_argument_group("learner: eviction replay")
    g.add_argument("--sparse-recompute", action="store_true",
                   help="recompute π_old with the sampler's own KV evictions: "
                        "the behaviour ratio and the mismatch metrics then measure numerics only")
    g.add_argument("--train-sparse-policy", action="store_true",
                   help="the update's forward uses the same eviction masks: GRPO optimises the "
                        "compressed policy itself, on-policy (implies --sparse-recompute; the "
                        "reference's log-probs are replayed too)")
    g.add_argument("--sparse-attention", default=TrainConfig.sparse_attention,
                   type=sparse_impl, choices=list(SPARSE_IMPLS),
                   help="how replay attends: flex (FlexAttention over the pack's 128 x 128 "
                        "tiles; auto's choice on a GPU), mask (one SDPA per sample with a dense "
                        "mask; auto's choice on the CPU)")


def add_learner_args(parser: argparse.ArgumentParser) -> None:
    """The learner's flags: the model and its checkpoints, training, eviction replay."""
    _add_model_args(parser)
    _add_training_args(parser)
    add_sparse_replay_args(parser)


def _add_model_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("learner: model and checkpoints")
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
    add_checkpoint_args(g)
    g.add_argument("--tensor-model-parallel-size", type=int, default=1)
    g.add_argument("--pipeline-model-parallel-size", type=int, default=1)
    g.add_argument("--attention-backend", default=ModelConfig.attention_backend,
                   choices=["auto", "te", "sdpa", "local"])
    # one seed for the run: Megatron's RNG, the data order, the sampling seeds
    g.add_argument("--seed", type=int, default=ParallelConfig.seed)


def _add_training_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("learner: training")
    g.add_argument("--num-rollout", type=int, default=100)
    g.add_argument("--global-batch-size", type=int, default=None,
                   help="samples per optimizer step (default: the whole rollout)")
    g.add_argument("--lr", type=float, default=OptimConfig.lr)
    g.add_argument("--min-lr", type=float, default=OptimConfig.min_lr)
    g.add_argument("--lr-decay-style", default=OptimConfig.lr_decay_style,
                   choices=["constant", "linear", "cosine"])
    g.add_argument("--lr-warmup-iters", type=int, default=OptimConfig.lr_warmup_iters)
    g.add_argument("--lr-decay-iters", type=int, default=OptimConfig.lr_decay_iters)
    g.add_argument("--weight-decay", type=float, default=OptimConfig.weight_decay)
    g.add_argument("--adam-beta1", type=float, default=OptimConfig.adam_beta1)
    g.add_argument("--adam-beta2", type=float, default=OptimConfig.adam_beta2)
    g.add_argument("--adam-eps", type=float, default=OptimConfig.adam_eps)
    g.add_argument("--clip-grad", type=float, default=OptimConfig.clip_grad)
    g.add_argument("--max-tokens-per-gpu", type=int,
                   default=TrainConfig.max_tokens_per_gpu,
                   help="token budget of one packed micro-batch; speed only, not the maths "
                        "(default: sized from free memory at the first pass and printed, "
                        "learner/token_budget.py)")
    g.add_argument("--log-probs-chunk-size", type=int,
                   default=TrainConfig.log_probs_chunk_size,
                   help="tokens per fp32 chunk of the log-prob pass off CUDA (on CUDA one Triton "
                        "pass covers the micro-batch)")
    g.add_argument("--fused-old-logprobs", action=argparse.BooleanOptionalAction,
                   default=TrainConfig.fused_old_logprobs,
                   help="on-policy rollouts (one optimizer step, no staleness) take pi_old from the "
                        "update's own forward instead of a recompute pass (default: on; "
                        "trainer/README.md lists where the recompute stays)")
