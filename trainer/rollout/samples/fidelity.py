"""Keeping the sparse sampler close to the dense policy: the flags of the adaptive budget
(``trainer/algorithms/adaptive_budget.py``) and of the dense share
(``trainer/algorithms/dense_share.py``), and the per-rollout glue the training loop calls.

    controller = BudgetController(plan.adaptive)
    sampling = apply_budget(controller, sampling)         # before generating a rollout
    metrics = fidelity_step(controller, batch.dense, mismatch_inputs(batch, prep), gens)
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import TYPE_CHECKING

from ...algorithms.adaptive_budget import AdaptiveBudgetConfig, BudgetController, low_tail_fraction
from ..engines.interface import Generation, RolloutConfig

if TYPE_CHECKING:  # the flags and their checks live here too: no torch at import
    import torch


def add_fidelity_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("rollout: sampler fidelity (adaptive budget, dense share)")
    g.add_argument("--adaptive-budget-max", type=int, default=None,
                   help="adapt the compression budget B per rollout between "
                        "--sglang-compress-max-prompt (the start) and this: after each dense "
                        "recompute, with f the fraction of sparse response tokens whose "
                        "pi_sampler/pi_dense < --adaptive-budget-ratio-bound, B x= factor when "
                        "f > target, B /= factor when f < target x --adaptive-budget-lower-below; "
                        "the next rollout's requests carry B (sglang-kvc's compress_budget). "
                        "Logged as rollout/compress_budget (default: off)")
    g.add_argument("--adaptive-budget-ratio-bound", type=float, default=0.5,
                   help="low tail: tokens with pi_sampler/pi_dense below this (default: 0.5)")
    g.add_argument("--adaptive-budget-target", type=float, default=0.01,
                   help="most low-tail token fraction tolerated before B rises (default: 0.01)")
    g.add_argument("--adaptive-budget-factor", type=float, default=1.25,
                   help="multiplicative step of B (default: 1.25)")
    g.add_argument("--adaptive-budget-lower-below", type=float, default=0.5,
                   help="B falls when the fraction is under target x this (default: 0.5)")
    g.add_argument("--n-dense-samples-per-prompt", type=int, default=0,
                   help="dense share: the first m of each prompt's --n-samples-per-prompt samples "
                        "are generated with the whole KV (sglang-kvc's compress: false). The "
                        "group's baseline uses all n samples; the correction (IS weights, "
                        "rejection, veto, batch normalisation, its metrics) covers the sparse "
                        "samples only; dense samples weigh 1 and are never rejected; every "
                        "sample counts as one in the loss (default: 0)")


def adaptive_config_from_args(args: argparse.Namespace) -> AdaptiveBudgetConfig | None:
    if getattr(args, "adaptive_budget_max", None) is None:
        return None
    return AdaptiveBudgetConfig(args.sglang_compress_max_prompt, args.adaptive_budget_max,
                                args.adaptive_budget_ratio_bound, args.adaptive_budget_target,
                                args.adaptive_budget_factor, args.adaptive_budget_lower_below)


def check_fidelity_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    m = args.n_dense_samples_per_prompt
    if not 0 <= m <= args.n_samples_per_prompt:
        parser.error(f"--n-dense-samples-per-prompt {m} must be in [0, --n-samples-per-prompt]")
    if m and args.custom_generate_function_path:
        parser.error("--n-dense-samples-per-prompt needs plain samples: a generate plug-in "
                     "builds its own requests")
    if args.adaptive_budget_max is None:
        return
    _check_adaptive(parser, args)


def _check_adaptive(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    algo = str(args.sglang_compress_algorithm or "none").lower()
    if algo == "none" and not args.rollout_server_urls:
        parser.error("--adaptive-budget-max needs compressed rollouts "
                     "(--sglang-compress-algorithm)")
    replays = getattr(args, "sparse_recompute", False) or getattr(args, "train_sparse_policy",
                                                                  False)
    if getattr(args, "mis_bypass", False) or replays:
        parser.error("--adaptive-budget-max measures pi_sampler against the dense recompute: "
                     "not with --mis-bypass, --sparse-recompute or --train-sparse-policy")
    try:
        adaptive_config_from_args(args)
    except ValueError as e:
        parser.error(f"--adaptive-budget-*: {e}")


def apply_budget(controller: BudgetController, sampling: RolloutConfig) -> RolloutConfig:
    """The rollout's sampling with the controller's budget (unchanged when it is off)."""
    if not controller.enabled:
        return sampling
    return dataclasses.replace(sampling, compress_budget=controller.budget)


def dense_rows(gens: list[Generation]) -> torch.Tensor | None:
    """[B] bool: the samples the engine generated dense on request; None when there are none."""
    import torch

    flags = [bool(g.meta.get("compression", {}).get("dense")) for g in gens]
    return torch.tensor(flags) if any(flags) else None


def budget_used(gens: list[Generation]) -> dict:
    """The budget the engines report for the rollout's compressed samples (mean)."""
    budgets = [c["budget"] for c in (g.meta.get("compression") or {} for g in gens)
               if c.get("budget") is not None]
    return {"rollout/compress_budget": sum(budgets) / len(budgets)} if budgets else {}


def fidelity_step(controller: BudgetController, dense: torch.Tensor | None, mismatch: tuple,
                  gens: list[Generation]) -> dict:
    """After a rollout's recompute: its budget and dense share (``dense`` [B] rows), and the
    budget's update from ``mismatch`` = (π_dense, π_sampler, sparse response mask) [B, T]
    (``learner.grpo_update.mismatch_inputs``)."""
    out = budget_used(gens)
    if dense is not None:
        out["rollout/dense_sample_fraction"] = float(dense.float().mean())
    if controller.enabled:
        fraction = low_tail_fraction(*mismatch, controller.cfg.ratio_bound)
        out.update(controller.observe(fraction))
    return out
