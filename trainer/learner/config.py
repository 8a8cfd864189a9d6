"""The learner's flags, read here and nowhere else: the policy model, its optimizer and schedule,
the micro-batch and log-prob settings, the reference model and the optimizer-step size.

    cfg = learner_config_from_args(args)
    PolicyTrainer(cfg.policy_model(resume=False), cfg.optim, cfg.train)
"""

from __future__ import annotations

import argparse
import dataclasses

from .checkpoint_policy import add_checkpoint_args
from .model_provider import ModelConfig
from .policy_trainer import OptimConfig, PolicyTrainer, TrainConfig
from .sparse_attention import SPARSE_IMPLS


@dataclasses.dataclass
class LearnerConfig:
    model: ModelConfig  # the policy; its ``load`` is --load
    optim: OptimConfig
    train: TrainConfig
    global_batch_size: int  # samples per optimizer step
    ref_load: str | None = None  # the reference's weights; None: --hf-checkpoint

    def policy_model(self, resume: bool) -> ModelConfig:
        # a resumed run's weights come from its trainer checkpoint (load_checkpoint), not --load
        return dataclasses.replace(self.model, load=None if resume else self.model.load)

    def reference_model(self) -> ModelConfig:
        return dataclasses.replace(self.model, load=self.ref_load, role="reference")


def build_models(cfg: LearnerConfig, resume: bool, with_reference: bool, cache_dir):
    """The policy trainer (its weights from ``--load``/``--hf-checkpoint``, or left for a resume
    to load) and, when the loss or a plug-in needs one, the frozen reference (else None)."""
    trainer = PolicyTrainer(cfg.policy_model(resume), cfg.optim, cfg.train, cache_dir=cache_dir,
                            load_weights=not resume)
    if not with_reference:
        return trainer, None
    return trainer, PolicyTrainer(cfg.reference_model(), OptimConfig(), trainer.train_cfg,
                                  cache_dir=cache_dir, trainable=False)


def learner_config_from_args(args: argparse.Namespace) -> LearnerConfig:
    backend = args.attention_backend
    if backend == "auto" and _replays(args):  # the eviction masks live in our SDPA attention
        backend = "sdpa"
    model = ModelConfig(hf_checkpoint=args.hf_checkpoint, load=args.load,
                        attention_backend=backend)
    return LearnerConfig(model, optim_config_from_args(args), train_config_from_args(args),
                         global_batch_size=global_batch_size(args), ref_load=args.ref_load)


def global_batch_size(args: argparse.Namespace) -> int:
    """Samples per optimizer step: ``--global-batch-size``, by default the whole rollout."""
    if args.global_batch_size is None:
        return args.rollout_batch_size * args.n_samples_per_prompt
    return args.global_batch_size


def optim_config_from_args(args: argparse.Namespace) -> OptimConfig:
    return OptimConfig(lr=args.lr, min_lr=args.min_lr, lr_decay_style=args.lr_decay_style,
                       lr_warmup_iters=args.lr_warmup_iters, lr_decay_iters=args.lr_decay_iters,
                       weight_decay=args.weight_decay, adam_beta1=args.adam_beta1,
                       adam_beta2=args.adam_beta2, adam_eps=args.adam_eps,
                       clip_grad=args.clip_grad)


def train_config_from_args(args: argparse.Namespace) -> TrainConfig:
    # the learner divides logits by the rollout temperature, as the sampler did
    train_sparse = getattr(args, "train_sparse_policy", False)
    return TrainConfig(max_tokens_per_gpu=args.max_tokens_per_gpu,
                       log_probs_chunk_size=args.log_probs_chunk_size,
                       temperature=args.rollout_temperature, seed=args.seed,
                       # training the sparse policy needs its π_old: the sparse recompute
                       sparse_recompute=getattr(args, "sparse_recompute", False) or train_sparse,
                       train_sparse_policy=train_sparse,
                       fused_old_logprobs=getattr(args, "fused_old_logprobs", True),
                       sparse_attention=getattr(args, "sparse_attention", "auto"))


def _replays(args: argparse.Namespace) -> bool:
    return getattr(args, "sparse_recompute", False) or getattr(args, "train_sparse_policy", False)


def check_sparse_replay_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if _replays(args) and args.attention_backend not in ("auto", "sdpa"):
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
    g.add_argument("--sparse-attention", default="auto", choices=list(SPARSE_IMPLS),
                   help="how replay attends: flex (FlexAttention over the pack's 128 x 128 "
                        "tiles; auto's choice on a GPU), gather (over the keys each block of 128 "
                        "queries sees: far fewer tiles under small budgets), mask (one SDPA per "
                        "sample with a dense mask; auto's choice on the CPU)")


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
    g.add_argument("--attention-backend", default="auto", choices=["auto", "te", "sdpa", "local"])
    g.add_argument("--seed", type=int, default=1234)


def _add_training_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("learner: training")
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
    g.add_argument("--max-tokens-per-gpu", type=int, default=None,
                   help="token budget of one packed micro-batch; speed only, not the maths "
                        "(default: sized from free memory at the first pass and printed, "
                        "learner/token_budget.py)")
    g.add_argument("--log-probs-chunk-size", type=int, default=1024,
                   help="tokens per fp32 chunk of the log-prob pass off CUDA (on CUDA one Triton "
                        "pass covers the micro-batch)")
    g.add_argument("--fused-old-logprobs", action=argparse.BooleanOptionalAction, default=True,
                   help="on-policy rollouts (one optimizer step, no staleness) take pi_old from the "
                        "update's own forward instead of a recompute pass (default: on; "
                        "trainer/README.md lists where the recompute stays)")
