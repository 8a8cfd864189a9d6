"""The policy's parts (learner/policy_parts.py): Megatron's optimizer, schedule and DDP
settings, decided from ``OptimConfig`` before the model exists, written out by hand here.
The parts themselves train in ``test_policy_model.py`` (a cosine schedule with warm-up)."""

from __future__ import annotations

from trainer.learner.policy_parts import optimizer_plan
from trainer.learner.settings import OptimConfig


def test_warm_up_starts_from_zero_and_no_decay_length_means_none():
    plan = optimizer_plan(OptimConfig(lr=3e-4, min_lr=1e-5, lr_warmup_iters=5,
                                      lr_decay_style="cosine", weight_decay=0.01,
                                      use_distributed_optimizer=False))
    assert plan.schedule == dict(init_lr=0.0, max_lr=3e-4, min_lr=1e-5, lr_warmup_steps=5,
                                 lr_decay_steps=10**9, lr_decay_style="cosine", start_wd=0.01,
                                 end_wd=0.01, wd_incr_steps=10**9, wd_incr_style="constant")
    assert plan.optimizer == dict(optimizer="adam", lr=3e-4, min_lr=1e-5, weight_decay=0.01,
                                  adam_beta1=0.9, adam_beta2=0.98, adam_eps=1e-8, clip_grad=1.0,
                                  use_distributed_optimizer=False)
    assert not plan.distributed and not plan.ddp.use_distributed_optimizer
    assert plan.ddp.grad_reduce_in_fp32 and not plan.ddp.overlap_grad_reduce


def test_decay_outlasts_the_warm_up_and_no_warm_up_starts_at_the_peak():
    plan = optimizer_plan(OptimConfig(lr=1e-3, lr_warmup_iters=5, lr_decay_iters=3,
                                      use_distributed_optimizer=True))
    assert plan.schedule["lr_decay_steps"] == 6 and plan.schedule["wd_incr_steps"] == 3
    assert plan.distributed and plan.ddp.use_distributed_optimizer
    assert optimizer_plan(OptimConfig(lr=1e-3, use_distributed_optimizer=False)
                          ).schedule["init_lr"] == 1e-3
