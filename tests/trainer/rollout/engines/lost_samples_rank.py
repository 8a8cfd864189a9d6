"""One rank of ``test_lost_samples.test_one_ranks_failing_engine_fails_every_rank`` (run by
torchrun, gloo): an in-process engine on every rank, rank 1's failing every step; each rank
writes what its rollout raised to ``<out_dir>/rank<r>.txt``."""

from __future__ import annotations

import os
import sys

import torch.distributed as dist

from trainer.rollout.engines.config import EngineConfig
from trainer.rollout.engines.factory import engines_for
from trainer.rollout.engines.interface import RolloutConfig, RolloutError
from trainer.rollout.samples.data import Prompt
from trainer.rollout.manager import RolloutManager
from trainer.rollout.samples.rewards import RewardConfig
from trainer.rollout.engines.sharding import Placement

PROMPTS = [[5, 9, 14, 3], [7, 7, 21, 40, 2, 11], [3, 1, 4, 1, 5]]
CFG = RolloutConfig(max_response_len=12, seed=11)


def broken_launch(batch):
    raise ValueError("Pointer argument (at 0) cannot be accessed from Triton")


def main(model_dir: str, out_dir: str) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    # as the run builds them (assembly.py): the factory's engines for this rank's placement
    place = Placement(world, rank)
    engines = engines_for(EngineConfig(model_dir, {"device": "cpu"}, offload=False), place, "cpu")
    manager = RolloutManager(place, RewardConfig(rm_type="arithmetic"), engines)
    if rank == 1:
        manager.engines.engine.runner.launch = broken_launch
    try:
        manager.run([Prompt("p", ids, "1", {}) for ids in PROMPTS], 2, CFG)
        result = "no error"
    except RolloutError as e:
        result = str(e)
    finally:
        manager.close()
    with open(os.path.join(out_dir, f"rank{rank}.txt"), "w") as f:
        f.write(result)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:3])
