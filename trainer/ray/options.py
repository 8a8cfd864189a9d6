"""The Ray job's own flags (slime's names); every other flag goes to ``trainer.train``.

    --actor-num-nodes 1 --actor-num-gpus-per-node 8 --colocate        one engine per trainer rank
    --actor-num-nodes 1 --actor-num-gpus-per-node 4 --rollout-num-gpus 4   4 engines behind a router
"""

from __future__ import annotations

import argparse
import dataclasses
import os


class RayJobError(RuntimeError):
    """The job cannot start or went wrong; the message says what, and names the flag or rank."""


@dataclasses.dataclass
class RayOptions:
    """What the Ray job's flags say: every field is filled from them (``parse``), so the
    defaults are the parser's alone."""

    actor_num_nodes: int
    actor_num_gpus_per_node: int
    rollout_num_gpus: int
    rollout_num_gpus_per_engine: int
    colocate: bool
    ray_address: str | None
    local_num_gpus: int | None
    ray_connect_timeout: float
    placement_timeout: float
    engine_start_timeout: float

    @property
    def trainer_gpus(self) -> int:
        return self.actor_num_nodes * self.actor_num_gpus_per_node

    @property
    def num_engines(self) -> int:
        """Disaggregated engines (colocated engines live inside the trainer ranks)."""
        return 0 if self.colocate else self.rollout_num_gpus // self.rollout_num_gpus_per_engine

    @property
    def gpus_needed(self) -> int:
        return self.trainer_gpus + (0 if self.colocate else self.rollout_num_gpus)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m trainer.ray_job", allow_abbrev=False,  # never swallow a trainer flag
        description="GRPO trainer ranks as Ray actors; rollout engines colocated in them "
                    "(--colocate) or as separate engine actors behind sglang-router.",
        epilog="Every other flag goes to python -m trainer.train (see its --help).")
    g = p.add_argument_group("placement (slime's flags)")
    g.add_argument("--actor-num-nodes", type=int, default=1, help="nodes of trainer ranks")
    g.add_argument("--actor-num-gpus-per-node", type=int, default=1,
                   help="trainer ranks (one GPU each) per node")
    g.add_argument("--rollout-num-gpus", type=int, default=0,
                   help="GPUs of disaggregated rollout engines (0: colocated engines)")
    g.add_argument("--rollout-num-gpus-per-engine", type=int, default=1)
    g.add_argument("--colocate", action="store_true",
                   help="each data-parallel trainer rank hosts its engine on its own GPU (the "
                        "default when --rollout-num-gpus is 0)")
    g = p.add_argument_group("cluster")
    g.add_argument("--ray-address", default=os.environ.get("RAY_ADDRESS"),
                   help="a running cluster ('auto' for the one `ray start` made on this node; "
                        "default $RAY_ADDRESS); none: start a local one for this job")
    g.add_argument("--ray-connect-timeout", type=float, default=60.0,
                   help="seconds to reach the cluster at --ray-address before failing")
    g.add_argument("--local-num-gpus", type=int, default=None,
                   help="GPUs a local cluster declares (default: the CUDA devices here; on a "
                        "machine without CUDA, what the job asks for, run on the CPU)")
    g.add_argument("--placement-timeout", type=float, default=300.0,
                   help="seconds to wait for the GPUs before failing with what is missing")
    g.add_argument("--engine-start-timeout", type=float, default=900.0,
                   help="seconds for the rollout engines to load and answer /health")
    return p


def parse(argv: list[str]) -> tuple[RayOptions, list[str]]:
    """(the Ray options, the trainer's flags); a wrong combination exits naming the flag."""
    parser = build_parser()
    ns, rest = parser.parse_known_args(argv)
    opts = RayOptions(**vars(ns))
    try:
        check(opts, rest)
    except RayJobError as e:
        parser.error(str(e))
    if opts.colocate or opts.rollout_num_gpus == 0:
        opts.colocate = True
    return opts, rest


def check(opts: RayOptions, trainer_argv: list[str]) -> None:
    for flag in ("actor_num_nodes", "actor_num_gpus_per_node", "rollout_num_gpus_per_engine"):
        if getattr(opts, flag) < 1:
            raise RayJobError(f"--{flag.replace('_', '-')} must be >= 1")
    if opts.rollout_num_gpus < 0:
        raise RayJobError("--rollout-num-gpus must be >= 0")
    if opts.rollout_num_gpus % opts.rollout_num_gpus_per_engine:
        raise RayJobError(f"--rollout-num-gpus {opts.rollout_num_gpus} is not divisible by "
                          f"--rollout-num-gpus-per-engine {opts.rollout_num_gpus_per_engine}")
    if opts.rollout_num_gpus_per_engine > 1:
        raise RayJobError(f"--rollout-num-gpus-per-engine {opts.rollout_num_gpus_per_engine}: an "
                          "sglang-kvc engine serves the model on one GPU (no tensor parallelism); "
                          "use 1, so --rollout-num-gpus engines are started")
    if opts.colocate and opts.rollout_num_gpus not in (0, opts.trainer_gpus):
        raise RayJobError(f"--colocate puts one engine on each trainer GPU: --rollout-num-gpus "
                          f"must be left out or equal {opts.trainer_gpus} (--actor-num-nodes x "
                          f"--actor-num-gpus-per-node), got {opts.rollout_num_gpus}")
    check_trainer_flags(opts, trainer_argv)
    for name in ("ray_connect_timeout", "placement_timeout", "engine_start_timeout"):
        if getattr(opts, name) <= 0:
            raise RayJobError(f"--{name.replace('_', '-')} must be > 0")


def check_trainer_flags(opts: RayOptions, trainer_argv: list[str]) -> None:
    """Flags the job sets itself in disaggregated mode may not come from the user too."""
    if opts.colocate or opts.rollout_num_gpus == 0:
        return
    for flag in ("--rollout-server-urls", "--rollout-engine-urls"):
        if any(a == flag or a.startswith(flag + "=") for a in trainer_argv):
            raise RayJobError(f"{flag} and --rollout-num-gpus {opts.rollout_num_gpus}: the job "
                              f"starts the engines and sets {flag} itself; give one or the other")
