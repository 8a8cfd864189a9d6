"""What a trainer checkpoint holds and how many stay: Megatron's ``--no-save-optim`` /
``--no-save-rng`` / ``--no-load-optim`` / ``--no-load-rng`` and ``--save-retain-interval``, and
``--save-retain K`` (the last K). No torch here: the parser is built from it.

    policy = checkpoint_policy_from_args(args)
    policy.to_remove([1, 2, 3, 4, 5])   # the folders a save of 5 makes superfluous

A checkpoint costs, per parameter, 2 bytes of bf16 weights + 4 of fp32 master weights + 8 of
Adam's two moments = 14 bytes (fp32 training, as on a CPU: 4 + 8 = 12); a weights-only one
(``--no-save-optim``) 2 (4). ``docs/training.md`` has the measurements.
"""

from __future__ import annotations

import argparse
import dataclasses


@dataclasses.dataclass(frozen=True)
class CheckpointPolicy:
    save_optim: bool = True  # Adam's moments and master weights: needed to resume exactly
    save_rng: bool = True
    load_optim: bool = True  # False: the weights only, a fresh optimizer (with a warning)
    load_rng: bool = True
    retain: int | None = None  # keep the last K checkpoints; None: all
    retain_interval: int | None = None  # also keep every N-th (Megatron's); alone: the last 1

    @property
    def keep_last(self) -> int | None:
        if self.retain is None and self.retain_interval is not None:
            return 1  # Megatron: only the latest, besides the retained multiples
        return self.retain

    def to_remove(self, iterations: list[int]) -> list[int]:
        """Of the complete checkpoints ``iterations``, those the policy no longer keeps: all but
        the newest ``keep_last`` and the multiples of ``retain_interval``."""
        if self.keep_last is None:
            return []
        newest = sorted(iterations)[-self.keep_last:]
        every = self.retain_interval
        return [i for i in sorted(iterations)
                if i not in newest and not (every and i % every == 0)]


def checkpoint_policy_from_args(args: argparse.Namespace) -> CheckpointPolicy:
    return CheckpointPolicy(save_optim=not args.no_save_optim, save_rng=not args.no_save_rng,
                            load_optim=not args.no_load_optim, load_rng=not args.no_load_rng,
                            retain=args.save_retain, retain_interval=args.save_retain_interval)


def add_checkpoint_args(g) -> None:
    """Into the learner's "model and checkpoints" group."""
    g.add_argument("--save-retain", type=int, default=None, metavar="K",
                   help="keep only the last K checkpoints in --save (older ones are deleted "
                        "after each save; default: all)")
    g.add_argument("--save-retain-interval", type=int, default=None, metavar="N",
                   help="Megatron's: also keep every checkpoint whose iteration is a multiple "
                        "of N; alone, every other one but the latest is deleted")
    g.add_argument("--no-save-optim", action="store_true",
                   help="weights only (2 bytes a parameter in bf16 instead of 14): for "
                        "evaluation and export (megatron2hf); a run cannot resume exactly from it")
    g.add_argument("--no-save-rng", action="store_true", help="leave out the RNG states")
    g.add_argument("--no-load-optim", action="store_true",
                   help="resume with the checkpoint's weights and a fresh optimizer (needed to "
                        "go on from a --no-save-optim checkpoint)")
    g.add_argument("--no-load-rng", action="store_true", help="do not restore the RNG states")


def check_checkpoint_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    for flag in ("save_retain", "save_retain_interval"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            parser.error(f"--{flag.replace('_', '-')} must be >= 1")
    if (args.save_retain or args.save_retain_interval) and not args.save:
        parser.error("--save-retain / --save-retain-interval need --save")
