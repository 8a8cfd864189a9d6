"""The learner side of a run, one object: the loop hands it a rollout's batch and gets metrics.

    learner = Learner(cfg.learner, cfg.algo, LearnerPaths(save_dir, work_dir), with_reference)
    state = learner.resume()            # a trainer checkpoint at --load: the rollout side's part
    step = learner.step(batch)          # π_old plan, reference, prepare, optimizer steps, speed
    learner.save(rollout_id, state, flags)

Behind it: the policy trainer and the frozen reference (``config.build_models``), the fused or
separate π_old (``fused_old_logp.py``), the update (``grpo_update.py``), the speed accounting
(``speed.py``) and the checkpoints (``checkpoint.py``). The rollout side reads the weights from
``learner.policy`` when it pushes them.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

import torch

from ..algorithms.argparse_flags import AlgorithmConfig
from ..launch import phase
from .checkpoint import is_trainer_checkpoint, load_checkpoint, remove_partial, save_checkpoint
from .checkpoint_policy import CheckpointPolicy
from .checkpoint_space import report_space
from .config import LearnerConfig, build_models
from .fused_old_logp import plan_old_logp
from .grpo_update import (PreparedUpdate, RolloutBatch, gather_dp, mismatch_inputs,
                          prepare_update, run_updates)
from .model_provider import rounds_checkpoint
from .replay_cache import shared_replay_masks
from .speed import generation_timing, rollout_speed
from .token_budget import print_startup_line


@dataclasses.dataclass
class LearnerPaths:
    """Where the learner writes: its checkpoints (None: never saved) and its converted weights."""

    save_dir: Path | None
    work_dir: Path  # hf_import/ goes under it
    checkpoint: CheckpointPolicy = CheckpointPolicy()


@dataclasses.dataclass
class LearnerStep:
    """One rollout's update as the loop logs it, and what the sampler's budget measures."""

    times: dict[str, float]  # time_recompute, time_update
    prepare: dict[str, float]  # advantages, π_old, correction
    train: list[dict[str, float]]  # one per optimizer step
    speed: dict[str, float]  # perf/: generation's and each learner phase's
    # (π_dense, π_sampler, sparse response mask) [B, T]: the adaptive budget's input
    mismatch: tuple[torch.Tensor, torch.Tensor, torch.Tensor]


class Learner:
    """The policy (and reference) and everything that updates, times or saves them."""

    def __init__(self, cfg: LearnerConfig, algo: AlgorithmConfig, paths: LearnerPaths,
                 with_reference: bool):
        self.cfg, self.algo, self.paths = cfg, algo, paths
        if paths.save_dir is not None:  # saves an interrupt cut short: never resumed, in the way
            remove_partial(paths.save_dir)
        self.resuming = is_trainer_checkpoint(cfg.model.load)  # reads common.pt: once
        models = build_models(cfg, self.resuming, algo.loss.needs_ref_logp or with_reference,
                              cache_dir=paths.work_dir / "hf_import")
        self.policy, self.reference = models.policy, models.reference
        print_startup_line(cfg.train.max_tokens_per_gpu)  # the micro-batch: given, or sized later
        if paths.save_dir is not None:  # hours before the first save, while space can be freed
            report_space(paths.save_dir, self.policy, paths.checkpoint)

    # --- startup ---------------------------------------------------------------------------
    def resume(self) -> dict | None:
        """The extra state (rollout id, data, budget) of the trainer checkpoint at ``--load``,
        its weights and optimizer loaded; None when the run starts fresh."""
        if not self.resuming:
            return None
        path = self.cfg.model.load
        with phase(f"resume from {path}"):
            return load_checkpoint(self.policy, path, policy=self.paths.checkpoint)

    def first_push_reason(self, start_rollout: int) -> str | None:
        """Whether the engines, which loaded --hf-checkpoint, must be sent the policy's weights
        before the first rollout: why in words ("" when it goes without saying), else None."""
        rounded = rounds_checkpoint(self.cfg.model)
        if start_rollout > 0 or self.cfg.model.load or rounded:
            return rounded or ""
        return None

    # --- one rollout -----------------------------------------------------------------------
    def step(self, batch: RolloutBatch) -> LearnerStep:
        """Advantages, π_old (fused into the update when on-policy), the optimizer steps."""
        times = {}
        # one rollout's eviction masks: the reference, π_old and the update pack the same
        # micro-batches (one optimizer step) and build them once; dropped at the scope's end
        with shared_replay_masks():
            start = time.perf_counter()
            prep = self._prepare(batch)
            times["time_recompute"] = time.perf_counter() - start
            start = time.perf_counter()
            steps = run_updates(self.policy, batch, prep, self.algo.loss,
                                self.cfg.global_batch_size)
            times["time_update"] = time.perf_counter() - start
        return LearnerStep(times, prep.metrics, steps, self._speed(batch),
                           mismatch_inputs(batch, prep))

    def _prepare(self, batch: RolloutBatch) -> PreparedUpdate:
        """Advantages, the dense π_old (and reference) recompute, the sparse correction."""
        ref = None
        if self.reference is not None:
            sparse = self.policy.train_cfg.train_sparse_policy  # KL between like policies
            ref = gather_dp(self.reference.compute_logprobs(batch.samples, sparse=sparse),
                            self.policy)
        plan = plan_old_logp(self.policy.train_cfg, batch, self.algo,  # fused when on-policy
                             self.cfg.global_batch_size, batch.max_staleness)
        return prepare_update(self.policy, batch, self.algo.advantage, self.algo.correction, ref,
                              plan)

    def _speed(self, batch: RolloutBatch) -> dict:
        """``perf/``: tokens/s and MFU per GPU of generation and each learner phase."""
        gpus = batch.generation_gpus
        gen = gpus and generation_timing(self.policy.arch, batch.samples,
                                         batch.generation_seconds, gpus)
        return rollout_speed((self.policy, self.reference), gen or None)

    # --- checkpoints -----------------------------------------------------------------------
    def save(self, rollout_id: int, extra: dict, flags: dict) -> None:
        """A trainer checkpoint after ``rollout_id`` rollouts, ``extra`` beside the weights (the
        rollout side's state), the run's plain flags as its args; nothing without --save."""
        if self.paths.save_dir is None:
            return
        plain = {k: v for k, v in flags.items()
                 if isinstance(v, (int, float, str, bool, list, type(None)))}
        save_checkpoint(self.policy, self.paths.save_dir, rollout_id,
                        args=argparse.Namespace(**plain), policy=self.paths.checkpoint,
                        extra={"rollout_id": rollout_id, **extra})
