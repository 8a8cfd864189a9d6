"""One run's configuration, assembled from the flags: each package reads its own
(``rollout/config.py``, ``learner/config.py``, ``algorithms/argparse_flags.py``, ``tracking/``,
``learner/checkpoint_policy.py``); this module puts them side by side and resolves what depends on
more than one (resuming from ``--save``).

    cfg = run_config_from_args(args)    # then trainer/train.py: rollout side, learner, loop
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from .algorithms.argparse_flags import AlgorithmConfig, config_from_args
from .learner.checkpoint import is_trainer_checkpoint
from .learner.checkpoint_policy import CheckpointPolicy, checkpoint_policy_from_args
from .learner.config import LearnerConfig, learner_config_from_args
from .rollout.config import RolloutSetup, rollout_setup_from_args
from .tracking import TrackingConfig, tracking_config_from_args


@dataclasses.dataclass
class LoopConfig:
    num_rollout: int
    eval_interval: int | None = None  # evaluate every N rollouts
    save_dir: Path | None = None  # trainer checkpoints
    save_interval: int | None = None  # save every N rollouts (and always after the last)
    eval_before_train: bool = False  # evaluate the starting policy too, logged as step 0
    checkpoint: CheckpointPolicy = CheckpointPolicy()  # what a save holds, how many stay


@dataclasses.dataclass
class RunConfig:
    """One run, one config per package, each read from the flags by that package."""

    loop: LoopConfig
    rollout: RolloutSetup
    learner: LearnerConfig
    algo: AlgorithmConfig
    tracking: TrackingConfig
    flags: dict  # every flag as resolved: recorded in checkpoints and the metrics' config


def run_config_from_args(args: argparse.Namespace) -> RunConfig:
    args = _resume_from_save(args)
    loop = LoopConfig(args.num_rollout, args.eval_interval,
                      Path(args.save) if args.save else None, args.save_interval,
                      args.eval_before_train, checkpoint_policy_from_args(args))
    logs = loop.save_dir / "logs" if loop.save_dir else Path("runs/train")
    rollout, learner = rollout_setup_from_args(args), learner_config_from_args(args)
    # what the flags' defaults resolved to, as they were recorded before the configs did it
    flags = {**vars(args), "weight_sync": rollout.weight_sync.mode,
             "global_batch_size": learner.global_batch_size}
    return RunConfig(loop, rollout, learner, config_from_args(args),
                     tracking_config_from_args(args, default_dir=logs), flags=flags)


def _resume_from_save(args: argparse.Namespace) -> argparse.Namespace:
    """A ``--save`` folder that holds a trainer checkpoint is resumed, unless ``--load`` names a
    trainer checkpoint itself: the same command goes on after an interrupt (slime's idiom of
    ``--load`` = ``--save``; ``--load`` then only gives the first run's weights)."""
    if is_trainer_checkpoint(args.load) or not is_trainer_checkpoint(args.save):
        return args
    if rank() == 0:
        print(f"[startup] --save {args.save} holds a checkpoint of this run: resuming from it "
              f"(pass another --save to start over)", flush=True)
    return argparse.Namespace(**{**vars(args), "load": args.save})


def rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_initialized() else 0


def engine_device() -> str:
    """This rank's GPU for an engine it starts (``cpu`` without one)."""
    import torch

    return f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "cpu"
