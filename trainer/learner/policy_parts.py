"""The policy's parts, built in one pass down: what the configs ask is decided first (the
optimizer's and the schedule's settings, whether the optimizer state is sharded), then the model
is built and loaded (``model_provider`` -> ``checkpoint_tools``) and Megatron wraps it (DDP),
optimizes it and schedules its learning rate. Once the model exists nothing calls back into the
learner: ``PolicyTrainer`` receives the finished parts.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from .fusions import wgrad as fusions_wgrad
from .model_provider import build_policy_model
from .settings import ModelConfig, OptimConfig

if TYPE_CHECKING:
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.optimizer import MegatronOptimizer
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
    from megatron.core.transformer import TransformerConfig

    from checkpoint_tools.model_config import ModelArch


@dataclasses.dataclass
class PolicyParts:
    """This rank's policy: the architecture, the model (DDP-wrapped when trained, else frozen),
    Megatron's transformer config, and the optimizer and LR schedule (None when frozen)."""

    arch: ModelArch
    model: torch.nn.Module
    config: TransformerConfig  # the schedule's hooks (no_sync, finalize) are set on it
    optimizer: MegatronOptimizer | None = None
    scheduler: OptimizerParamScheduler | None = None


@dataclasses.dataclass
class OptimizerPlan:
    """Megatron's optimizer, schedule and DDP settings, decided before the model exists (the
    optimizer's dtypes alone are the model config's)."""

    distributed: bool  # optimizer state sharded over the data-parallel ranks
    ddp: DistributedDataParallelConfig
    optimizer: dict  # OptimizerConfig's fields but the dtypes
    schedule: dict  # OptimizerParamScheduler's fields but the optimizer


def optimizer_plan(o: OptimConfig) -> OptimizerPlan:
    from megatron.core.distributed import DistributedDataParallelConfig

    distributed = _shards_optimizer(o)
    decay_iters = o.lr_decay_iters or 10**9
    return OptimizerPlan(
        distributed,
        DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=False,
                                      use_distributed_optimizer=distributed),
        dict(optimizer="adam", lr=o.lr, min_lr=o.min_lr, weight_decay=o.weight_decay,
             adam_beta1=o.adam_beta1, adam_beta2=o.adam_beta2, adam_eps=o.adam_eps,
             clip_grad=o.clip_grad, use_distributed_optimizer=distributed),
        dict(init_lr=0.0 if o.lr_warmup_iters else o.lr, max_lr=o.lr, min_lr=o.min_lr,
             lr_warmup_steps=o.lr_warmup_iters,
             lr_decay_steps=max(decay_iters, o.lr_warmup_iters + 1),
             lr_decay_style=o.lr_decay_style, start_wd=o.weight_decay, end_wd=o.weight_decay,
             wd_incr_steps=decay_iters, wd_incr_style="constant"))


def _shards_optimizer(o: OptimConfig) -> bool:
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    if o.use_distributed_optimizer is not None:
        return o.use_distributed_optimizer
    # Sharding optimizer state only pays off across DP ranks (and gloo lacks the reduce-scatter
    # it needs). Megatron 0.16's dp_reshardable save also trips an assertion on padded
    # single-rank buffers, so DP = 1 keeps the plain optimizer.
    return dist.get_backend() == "nccl" and ps.get_data_parallel_world_size() > 1


def build_policy_parts(model_cfg: ModelConfig, optim_cfg: OptimConfig | None, *,
                       cache_dir: str | Path | None = None,
                       load_weights: bool = True) -> PolicyParts:
    """The model (its weights loaded unless ``load_weights`` is False: a resume brings them)
    and, with ``optim_cfg``, DDP, the optimizer and the schedule; without, frozen (the
    reference). Every call after the model's build goes to Megatron (call after
    ``init_model_parallel``)."""
    from megatron.core.distributed import DistributedDataParallel
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    plan = None if optim_cfg is None else optimizer_plan(optim_cfg)
    if plan is not None:  # fp32 weight gradients accumulate inside the GEMMs (DDP's main_grad)
        fusions_wgrad.install()
    arch, module = build_policy_model(model_cfg, cache_dir=cache_dir, load=load_weights,
                                      calculate_per_token_loss=True,
                                      gradient_accumulation_fusion=plan is not None)
    config = module.config
    if plan is None:  # a frozen reference policy: forward only, no grad buffers
        module.requires_grad_(False)
        return PolicyParts(arch, module, config)
    model = DistributedDataParallel(config=config, ddp_config=plan.ddp, module=module)
    config.no_sync_func = model.no_sync
    config.finalize_model_grads_func = _no_rescale_finalize
    optimizer = get_megatron_optimizer(
        OptimizerConfig(**plan.optimizer, bf16=config.bf16, fp16=config.fp16,
                        params_dtype=config.params_dtype), [model])
    return PolicyParts(arch, model, config, optimizer,
                       OptimizerParamScheduler(optimizer, **plan.schedule))


def _no_rescale_finalize(model, num_tokens=None, pg_collection=None, force_all_reduce=False):
    from megatron.core.distributed import finalize_model_grads

    # Losses are pre-normalised by global counts: reduce grads across DP and pipeline embedding
    # groups, but never divide by a token count.
    return finalize_model_grads(model, None, pg_collection=pg_collection,
                                force_all_reduce=force_all_reduce)
