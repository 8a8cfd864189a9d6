"""The learner's configs, read from its flags (``flags.py``) here and nowhere else: the policy
model, its optimizer and schedule, the micro-batch and log-prob settings, the reference model and
the optimizer-step size.

    cfg = learner_config_from_args(args)
    models = build_models(cfg, resume=False, with_reference=True, cache_dir=work / "hf_import")
"""

from __future__ import annotations

import argparse
import dataclasses

# the flags themselves: flags.py (no torch, so --help and flag errors are fast); re-exported
from .flags import (add_learner_args, add_sparse_replay_args, check_sparse_replay_args,  # noqa: F401
                    global_batch_size, replays)
from .policy_trainer import PolicyTrainer
from .settings import ModelConfig, OptimConfig, TrainConfig


@dataclasses.dataclass
class ModelRole:
    """One model of the learner, as it is built: the policy (trained) or the reference (frozen)."""

    model: ModelConfig
    optim: OptimConfig
    trainable: bool
    load_weights: bool = True  # False: a resume loads them from its trainer checkpoint


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

    def roles(self, resume: bool, with_reference: bool) -> list[ModelRole]:
        """The policy, and the frozen reference when the loss or a plug-in needs one."""
        policy = ModelRole(self.policy_model(resume), self.optim, trainable=True,
                           load_weights=not resume)
        if not with_reference:
            return [policy]
        return [policy, ModelRole(self.reference_model(), OptimConfig(), trainable=False)]


@dataclasses.dataclass
class LearnerModels:
    policy: PolicyTrainer
    reference: PolicyTrainer | None = None  # frozen; sharing the policy's TrainConfig


def build_models(cfg: LearnerConfig, resume: bool, with_reference: bool,
                 cache_dir) -> LearnerModels:
    """The policy trainer (its weights from ``--load``/``--hf-checkpoint``, or left for a resume
    to load) and the reference when asked for: the roles are decided from the configs first,
    then each is built in one pass down (model, DDP, optimizer, schedule: policy_parts.py)."""
    trainers = []
    for role in cfg.roles(resume, with_reference):  # the policy, then the reference
        trainers.append(PolicyTrainer(role.model, role.optim, cfg.train, cache_dir=cache_dir,
                                      load_weights=role.load_weights, trainable=role.trainable))
    return LearnerModels(*trainers)


def learner_config_from_args(args: argparse.Namespace) -> LearnerConfig:
    backend = args.attention_backend
    if backend == "auto" and replays(args):  # the eviction masks live in our SDPA attention
        backend = "sdpa"
    model = ModelConfig(hf_checkpoint=args.hf_checkpoint, load=args.load,
                        attention_backend=backend)
    return LearnerConfig(model, optim_config_from_args(args), train_config_from_args(args),
                         global_batch_size=global_batch_size(args), ref_load=args.ref_load)


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
                       temperature=args.rollout_temperature,
                       # training the sparse policy needs its π_old: the sparse recompute
                       sparse_recompute=getattr(args, "sparse_recompute", False) or train_sparse,
                       train_sparse_policy=train_sparse,
                       fused_old_logprobs=getattr(args, "fused_old_logprobs",
                                                  TrainConfig.fused_old_logprobs),
                       sparse_attention=getattr(args, "sparse_attention",
                                                TrainConfig.sparse_attention))
