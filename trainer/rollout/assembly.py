"""The rollout side's parts, built in one place for every placement: ``side.py`` (the door the
loop asks) builds them here and nothing under ``engines/``.

    launched, setup = launch_rollout(setup, device)          # before the models: engine processes
    parts = assemble_rollout(setup, inputs, launched.restart_hook(launcher_hook), device)
    parts.source.get(rollout_id) / parts.source.push(...)    # source.py
    parts.eval, parts.generation_gpus
    parts.close(); launched.stop()

``assemble_rollout`` builds each piece once, in the order they need each other: this rank's
engines (``engines/factory.py`` decides which), the weight sync and the restart hook on them, the
asynchronous gate, the partial-rollout wrapper around the engines, the manager over the wrapper,
then the generator, the source and the evaluation on that manager. Nothing is swapped on an
object after it is built.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from ..launch import phase
from .async_rollout import AsyncConfig, WeightGate, memory_safe, weight_gate
from .config import RolloutSetup
from .engines.capacity import pool_detail, run_capacity
from .engines.factory import (Launched, RestartHookFactory, connect_restarts, describe,
                              engine_placement, engines_for, generation_gpus, launch_engines,
                              weight_sync_for)
from .engines.interface import Engines, RolloutError
from .engines.processes import EngineProcessError
from .engines.sharding import Placement
from .engines.weight_sync import WeightSync
from .evaluation import EvalSetup
from .manager import RolloutManager
from .partial import ResumableBackend
from .source import RolloutGenerator, RolloutSource, rollout_source

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from ..algorithms.adaptive_budget import BudgetController
    from .samples.data import PromptStream

__all__ = ["ROLLOUT_ERRORS", "Launched", "RestartHookFactory", "RolloutInputs", "RolloutParts",
           "assemble_rollout", "launch_rollout"]

# what the rollout side raises with a message for the user (the CLI prints it, no traceback)
ROLLOUT_ERRORS = (RolloutError, EngineProcessError)


@dataclasses.dataclass
class RolloutInputs:
    """What the run hands its rollout side: data, plug-in, budget, where it writes, its span."""

    tokenizer: PreTrainedTokenizerBase
    plugin: Callable  # the generate plug-in: the single-turn default, a user's, or multi-turn (``samples/generate.py``)
    prompts: PromptStream
    eval_sets: dict[str, list]  # name -> prompts
    budget: BudgetController
    log_dir: Path  # eval_samples/ goes under it
    work_dir: Path  # weight_sync/ goes under it
    write: bool  # this rank writes the eval rows (rank 0)
    start_rollout: int  # the engines serve this version when the run starts
    num_rollout: int


@dataclasses.dataclass
class RolloutParts:
    """This rank's rollouts: the manager, the weight sync, the source the loop asks, the eval."""

    manager: RolloutManager
    sync: WeightSync
    generate: RolloutGenerator
    source: RolloutSource
    eval: EvalSetup
    generation_gpus: int | None  # GPUs that generate (None: servers elsewhere, count unknown)

    def close(self) -> None:
        self.source.close()
        self.manager.close()


def launch_rollout(setup: RolloutSetup, device: str) -> tuple[Launched, RolloutSetup]:
    """What starts before the models load (``--rollout-engine-process`` / ``--rollout-num-gpus``:
    their processes) and ``setup`` pointed at every engine's URL."""
    launched = launch_engines(setup.engines, device)
    return launched, dataclasses.replace(setup, engines=launched.config)


def assemble_rollout(setup: RolloutSetup, inputs: RolloutInputs,
                     restart_hook: RestartHookFactory | None, device: str) -> RolloutParts:
    """This rank's rollout side for ``setup``, whatever the placement (see the module's text)."""
    engines, place = open_engines(setup, inputs.prompts.prompts, device)
    sync = weight_sync_for(setup.weight_sync, setup.engines, engines, inputs.work_dir)
    connect_restarts(engines, restart_hook, sync)
    # rollout n+1 generates while update n runs, where the placement's memory allows
    gate = weight_gate(memory_safe(setup.asynchrony, setup.engines), inputs.start_rollout,
                       engines)
    manager = RolloutManager(generation_place(place, gate), setup.plan.reward,
                             engines=resumable(engines, gate, setup.asynchrony,
                                               inputs.start_rollout),
                             generate_plugin=inputs.plugin, tokenizer=inputs.tokenizer)
    generate = RolloutGenerator(manager, inputs.prompts, setup.plan, inputs.budget)
    source = rollout_source(manager, sync, generate, gate, inputs.start_rollout,
                            inputs.num_rollout)
    evals = EvalSetup(manager, inputs.eval_sets, setup.plan, inputs.budget, inputs.log_dir,
                      write=inputs.write)
    return RolloutParts(manager, sync, generate, source, evals,
                       generation_gpus(setup.engines, _world_size()))


def open_engines(setup: RolloutSetup, prompts: list, device: str) -> tuple[Engines, Placement]:
    """This rank's engines and role, as a startup phase that reports rank 0's KV pool and what
    it holds."""
    cfg = setup.engines
    place = engine_placement(cfg)
    with phase(f"start {describe(cfg, place)}") as info:
        engines = engines_for(cfg, place, device)
        pool = engines.pool()
        info["detail"] = pool and (f"{pool_detail(pool)}; " + run_capacity(
            pool["capacity"], cfg.engine_flags, prompts, setup.plan.sampling.max_response_len,
            setup.plan.n_samples))
    return engines, place


def generation_place(place: Placement, gate: WeightGate | None) -> Placement:
    """Asynchronous with several ranks: the rollout gathers get a process group of their own,
    since they run in the generation thread while training uses the default group."""
    import torch.distributed as dist

    if gate is None or not dist.is_initialized() or dist.get_world_size() <= 1:
        return place
    return dataclasses.replace(place, group=dist.new_group(backend="gloo"))


def resumable(engines: Engines, gate: WeightGate | None, cfg: AsyncConfig, version: int):
    """Partial rollouts: requests a push interrupts continue under the new weights."""
    return ResumableBackend(engines, gate, version) if cfg.partial_rollout else engines


def _world_size() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_initialized() else 1
