"""The rollout side of a run, one object: the loop asks it for a rollout ready to train, hands it
the learner's weights and what the learner measured, and never looks behind it.

    rollouts = RolloutSide(cfg.rollout, kl_loss_coef, device)  # engine processes, data, plug-in
    start = rollouts.resume(learner.resume())                  # after the learner is built
    rollouts.open(RolloutSpan(start, num_rollout, log_dir, work_dir), restart_hook)
    rollout = rollouts.next(rollout_id)     # a Rollout: the learner's RolloutBatch and metrics
    rollouts.observe(rollout, step.mismatch)              # the adaptive budget's measurement
    rollouts.push(learner.policy, rollout_id + 1)         # the new weights to every engine
    rollouts.evaluate(rollout_id + 1); rollouts.state(rollout_id + 1); rollouts.close()

Behind it: the engines and their processes, the weight sync (``engines/weight_sync.py``), the
synchronous or asynchronous source (``source.py``), reward shaping (``samples/shaping.py``), the
conversion to the learner's batch (``learner_batch.py``), the rollout stats and the sampler's
budget (``samples/fidelity.py``), the evaluation; ``assembly.py`` builds its parts. A source
may generate ahead (``--max-staleness``): ``next`` then hands over what was made while the
learner updated, its staleness bound carried on the batch.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import ContextManager

import torch

from ..algorithms.adaptive_budget import BudgetController
from ..learner.grpo_update import RolloutBatch
from .assembly import (ROLLOUT_ERRORS, RestartHookFactory, RolloutInputs, RolloutParts,
                       assemble_rollout, launch_rollout)
from .config import RolloutSetup
from .engines.interface import Generation
from .evaluation import evaluate, write_rows
from .learner_batch import learner_batch
from .samples.fidelity import fidelity_step
from .samples.generate import needs_reference
from .samples.shaping import training_rewards
from .source import tokens_per_s

__all__ = ["ROLLOUT_ERRORS", "RestartHookFactory", "Rollout", "RolloutSide", "RolloutSpan"]


@dataclasses.dataclass
class Rollout:
    """One rollout, ready for the learner: its batch, and what the loop logs of it."""

    rollout_id: int
    batch: RolloutBatch  # rewards shaped, loss masks, staleness bound, generation time
    gens: list[Generation]  # every call's generation: the budget reads what they used
    wait_seconds: float  # the loop's wait for it (``time_rollout``)
    metrics: dict[str, float]  # samples, engines, staleness, generation speed
    rewards: dict[str, float]  # the shaped rewards' metrics


@dataclasses.dataclass
class RolloutSpan:
    """The rollouts this run makes and where it writes."""

    start_rollout: int  # the engines serve this version when the run starts
    num_rollout: int
    log_dir: Path  # eval_samples/ goes under it
    work_dir: Path  # weight_sync/ goes under it


class RolloutSide:
    """This rank's rollouts: built before the learner (engine processes, data, plug-in, budget),
    opened after it (this rank's engines and weight sync), then asked once a rollout."""

    def __init__(self, setup: RolloutSetup, kl_loss_coef: float, device: str):
        self.device, self.kl_loss_coef = device, kl_loss_coef
        self.plan = setup.plan
        # before the models: the engine processes, and the setup pointed at their URLs
        self.launched, self.setup = launch_rollout(setup, device)
        try:
            self.tokenizer, self.prompts, self.eval_sets = setup.data.load()
            self.plugin = self.plan.load_plugin()
        except BaseException:  # bad data or plug-in: the processes started above stop
            self.launched.stop()
            raise
        self.budget = BudgetController(self.plan.adaptive)  # the sampler's budget (adaptive)
        self.parts: RolloutParts | None = None

    @property
    def needs_reference(self) -> bool:
        """Whether the plug-in's calls carry KL coefficients (the learner needs a reference)."""
        return needs_reference(self.plugin)

    @property
    def server_urls(self) -> list[str] | None:
        """Every engine's URL once launched (recorded with the run's flags)."""
        return self.setup.engines.server_urls

    # --- startup ---------------------------------------------------------------------------
    def resume(self, state: dict | None) -> int:
        """The data position and budget of a checkpoint's ``state`` (None: a fresh run); the
        rollout the run starts at."""
        if state is None:
            return 0
        self.prompts.load_state(state.get("data", {"epoch": 0, "offset": 0}))
        self.budget.load(state.get("compress_budget"))
        return int(state.get("rollout_id", 0))

    def open(self, span: RolloutSpan, restart_hook: RestartHookFactory | None) -> None:
        """This rank's engines, weight sync, source and evaluation (``assembly.py``)."""
        inputs = RolloutInputs(self.tokenizer, self.plugin, self.prompts, self.eval_sets,
                               self.budget, span.log_dir, span.work_dir, _rank() == 0,
                               span.start_rollout, span.num_rollout)
        self.parts = assemble_rollout(self.setup, inputs,
                                      self.launched.restart_hook(restart_hook), self.device)

    # --- one rollout -----------------------------------------------------------------------
    def next(self, rollout_id: int) -> Rollout:
        """Rollout ``rollout_id``'s samples as the learner's batch, rewards shaped."""
        start, source = time.perf_counter(), self.parts.source
        prompts, result, sampled = source.get(rollout_id)
        if self.plan.debug_path and _rank() == 0:  # --save-debug-rollout-data
            write_rows(self.plan.debug_path.format(rollout_id=rollout_id), result.rows(prompts))
        stats = {**result.stats(), **sampled, **source.staleness(result, rollout_id)}
        # async: generation overlapped training; what is left is the wait for it
        waited = max(1e-6, time.perf_counter() - start - stats["time_reward"])
        gen_seconds = source.generation_seconds(result, waited)
        stats["rollout_tokens_per_s"] = tokens_per_s(result, gen_seconds)
        shaped = training_rewards(result.traces, self.plan)
        batch = dataclasses.replace(
            learner_batch(result, shaped, self.tokenizer.pad_token_id or 0, self.kl_loss_coef),
            max_staleness=source.max_staleness, generation_seconds=gen_seconds,
            generation_gpus=self.parts.generation_gpus)
        return Rollout(rollout_id, batch, result.gens, waited, stats, shaped.metrics)

    def device_work(self) -> ContextManager:
        """Around the learner's GPU work: the engines' own waits for it (``source.py``)."""
        return self.parts.source.device_work()

    def observe(self, rollout: Rollout, mismatch: tuple[torch.Tensor, ...]) -> dict:
        """The budget's update from the learner's π_dense vs π_sampler (``mismatch``), and the
        rollout's budget and dense share."""
        return fidelity_step(self.budget, rollout.batch.dense, mismatch, rollout.gens)

    def push(self, policy, version: int) -> dict:
        """``policy``'s weights to every engine; their next samples report ``version``."""
        return self.parts.source.push(policy, f"rollout-{version}")

    # --- eval / state ----------------------------------------------------------------------
    def evaluate(self, rollout_id: int) -> dict:
        """The eval sets' metrics after ``rollout_id`` rollouts, the engines held for them."""
        with self.parts.source.exclusive():
            return evaluate(self.parts.eval, rollout_id)

    def state(self, rollout_id: int) -> dict:
        """What a checkpoint after ``rollout_id`` rollouts keeps of this side (``resume``)."""
        data = self.parts.generate.data_states.get(rollout_id, self.prompts.state())
        return {"compress_budget": self.budget.budget, "data": data}

    def close(self) -> None:
        try:
            if self.parts is not None:
                self.parts.close()
        finally:
            self.launched.stop()


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_initialized() else 0

