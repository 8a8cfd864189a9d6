"""Where the rollout side's rollouts come from (``side.py``), synchronous or asynchronous, asked
the same way:

    source = rollout_source(manager, sync, generate, gate, start, num_rollout)  # assembly.py
    prompts, result, sampled = source.get(rollout_id)   # generated now, or by the thread
    with source.device_work():                          # the training thread's GPU work
        ...recompute, update...
    source.push(trainer, f"rollout-{rollout_id + 1}")   # the new weights to every engine
    with source.exclusive():                            # evaluation: the engines to itself
        ...

``SyncRollouts`` generates when asked; ``AsyncRolloutSource`` hands over what the generation
thread made within the staleness bound (``async_rollout.py``), and its pushes and evaluations
wait at the gate. The loop never asks which one it holds.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Callable

from .async_rollout import AsyncRollouts, WeightGate
from .dynamic_sampling import DynamicSampler
from .manager import RolloutManager
from .samples.fidelity import apply_budget
from .samples.staleness import rollout_staleness, version_number


@dataclasses.dataclass
class RolloutGenerator:
    """``generate(rollout_id)``: the rollout's prompts and result (and dynamic sampling's counts,
    when it is on), sampled with that rollout's seeds at the adaptive budget."""

    manager: RolloutManager
    prompts: object  # the PromptStream
    plan: object  # the RolloutPlan
    budget: object  # the BudgetController
    data_states: dict = dataclasses.field(default_factory=dict)  # id -> where its prompts began

    def __post_init__(self):
        dynamic = self.plan.dynamic
        self.sampler = DynamicSampler(dynamic) if dynamic.enabled else None

    def __call__(self, rollout_id: int) -> tuple:
        self.data_states[rollout_id] = self.prompts.state()  # where a resume must start it
        n, size = self.plan.n_samples, self.plan.batch_size
        sampling = apply_budget(self.budget, self.plan.sampling_for(rollout_id))
        if self.sampler is not None:
            return self.sampler.collect(self.manager, self.prompts, size, n, sampling)
        prompts = self.prompts.next_batch(size)
        return prompts, self.manager.run(prompts, n, sampling), {}


class SyncRollouts:
    """Generation when the loop asks: the synchronous run."""

    max_staleness = None  # no rollout is ever generated ahead of the weights

    def __init__(self, manager, sync, generate: Callable[[int], tuple]):
        self.manager, self.sync, self.generate = manager, sync, generate

    def get(self, rollout_id: int) -> tuple:
        return self.generate(rollout_id)

    def push(self, trainer, version: str) -> dict:
        """The trainer's weights to every engine; their next samples report ``version``."""
        out = self.sync.push(trainer, version)
        self.manager.version = version
        return out

    def exclusive(self):
        return contextlib.nullcontext()

    def device_work(self):
        return self.manager.engines.device_work(asynchronous=False)

    def staleness(self, result, rollout_id: int) -> dict:
        return {}

    def generation_seconds(self, result, waited: float) -> float:
        return waited  # the loop waited for the whole generation

    def close(self) -> None:
        pass


class AsyncRolloutSource:
    """The generation thread's rollouts, each within ``max_staleness`` of the weights it trains;
    pushes and evaluations wait at (or interrupt) the gate."""

    def __init__(self, manager, sync, generate: Callable[[int], tuple], gate: WeightGate,
                 start_rollout: int, num_rollout: int):
        self.manager, self.sync, self.generate, self.gate = manager, sync, generate, gate
        self.start_rollout, self.num_rollout = start_rollout, num_rollout
        self.producer: AsyncRollouts | None = None

    @property
    def max_staleness(self) -> int:
        return self.gate.max_staleness

    def get(self, rollout_id: int) -> tuple:
        if self.producer is None:  # started here: after any first push of the weights
            self.producer = AsyncRollouts(self.generate, self.gate,
                                          range(rollout_id, self.num_rollout)).start()
        return self.producer.get(rollout_id)

    def push(self, trainer, version: str) -> dict:
        with self.gate.update(version_number(version, self.start_rollout)), self.device_work():
            return self.sync.push(trainer, version)

    def exclusive(self):
        return self.gate.exclusive()

    def device_work(self):
        return self.manager.engines.device_work(asynchronous=True)

    def staleness(self, result, rollout_id: int) -> dict:
        """How many versions each sample lags the weights it trains (bound checked)."""
        return {**rollout_staleness(result.gens, rollout_id, self.gate.max_staleness,
                                    self.start_rollout),
                "rollout/interruptions": float(self.gate.interruptions)}

    def generation_seconds(self, result, waited: float) -> float:
        return max(s.seconds for s in result.shards)  # it overlapped training: the slowest engine

    def close(self) -> None:
        if self.producer is not None:
            self.producer.close()


RolloutSource = SyncRollouts | AsyncRolloutSource


def rollout_source(manager, sync, generate: Callable[[int], tuple], gate: WeightGate | None,
                   start_rollout: int, num_rollout: int) -> RolloutSource:
    """The run's source: asynchronous behind ``gate`` (``--max-staleness``), else synchronous
    (no gate). The engines serve version ``start_rollout`` now."""
    if gate is None:
        return SyncRollouts(manager, sync, generate)
    return AsyncRolloutSource(manager, sync, generate, gate, start_rollout, num_rollout)


def tokens_per_s(result, seconds: float) -> float:
    """Generated tokens per second of generation."""
    return sum(len(g.response_ids) for g in result.gens) / max(seconds, 1e-6)
