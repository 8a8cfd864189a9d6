"""``--rollout-engine-process``: the colocated engine as a child process on this rank's device.

Why: an in-process engine shares the trainer's Python interpreter. Under ``--max-staleness`` its
decode loop and Megatron's forward/backward both run host-bound Python at small and middle
scale, and they take turns on the GIL: on one H200 async overlapped only 1.10-1.12x
(docs/benchmarks.md). As a child process (``python -m sglang_kvc.launch_server`` with the run's
``--sglang-*`` flags and this rank's device) each side has its own interpreter; the trainer talks
to it over HTTP as to any server. Weights go by CUDA IPC handles on a GPU (``ipc``, no copy
through the host) and as tensors over HTTP on a CPU; an engine that dies is restarted and
re-synced (``fleet.py``).

Every rank that would host a colocated engine starts one; all ranks learn every engine's URL, and
generation goes to all of them from rank 0, as with ``--rollout-server-urls``. The engine keeps
its KV pool while the trainer trains (the memory split is ``--sglang-mem-fraction-static`` /
``--sglang-max-total-tokens``), which is what lets it generate meanwhile.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import torch
import torch.distributed as dist

from ...launch import phase
from .fleet import EngineFleet, FleetConfig

_NOT_PASSED = {"model_path", "host", "port"}  # the fleet sets these itself


class EngineProcessError(RuntimeError):
    """An engine process that would not start (its log's tail is in the message)."""


def server_argv(server_args) -> list[str]:
    """``launch_server`` flags for every ServerArgs field set away from its default."""
    argv: list[str] = []
    for f in dataclasses.fields(server_args):
        value = getattr(server_args, f.name)
        if f.name in _NOT_PASSED or value == f.default or value is None:
            continue
        argv += _flag(f, value)
    return argv


def _flag(f: dataclasses.Field, value) -> list[str]:
    flag = "--" + f.name.replace("_", "-")
    if not isinstance(value, bool):
        return [flag, str(value)]
    if value:
        return [flag]
    if f.metadata.get("negatable"):
        return ["--no-" + flag[2:]]
    raise ValueError(f"{flag} cannot be turned off on launch_server's command line")


def weight_transport() -> str:
    """``--weight-sync auto`` for an engine process: CUDA IPC on a GPU, tensors over HTTP else."""
    return "ipc" if torch.cuda.is_available() else "tensor"


def engine_processes(engines, device: str):
    """``--rollout-engine-process`` (this rank's engine as a child process) or
    ``--rollout-num-gpus`` (engines on GPUs of their own, started by rank 0), as a startup
    phase: the fleet (None where this rank starts none) and ``engines`` (an ``EngineConfig``)
    pointed at every engine's URL. Unchanged, with no fleet, when neither flag is given."""
    if not (engines.engine_process or engines.num_gpus):
        return None, engines
    with phase("start the rollout engine process(es)") as info:
        fleet, urls = start_engine_processes(engines, device)
        info["detail"] = ", ".join(urls) + f"; logs under {engines.log_dir / 'engines'}"
    return fleet, dataclasses.replace(engines, server_urls=urls)


def start_engine_processes(engines, device: str) -> tuple[EngineFleet | None, list[str]]:
    """This rank's engine process(es): with ``--rollout-engine-process`` its colocated engine on
    ``device`` (if it hosts one), with ``--rollout-num-gpus N`` (global rank 0) N engines on the
    node's GPUs after the trainer's. Returns them and every engine's URL, on every rank. Call
    after the process groups and Megatron's parallel state exist."""
    from .sharding import Placement, gather_shards, placement

    if engines.num_gpus:
        rank0 = not dist.is_initialized() or dist.get_rank() == 0
        fleet = _start(_disaggregated(engines), "--rollout-num-gpus") if rank0 else None
        urls = gather_shards(fleet.urls if fleet else None, Placement(1, 0 if rank0 else None))
        return fleet, urls[0]
    place = placement(remote=False, per_gpu=engines.per_gpu)
    fleet = _start(_colocated(engines, device), "--rollout-engine-process") \
        if place.generates else None
    # in generator order, so rollout_engine<i> is generating rank i's engine
    return fleet, gather_shards(fleet.urls[0] if fleet else None, place)


def _start(cfg: FleetConfig, flag: str) -> EngineFleet:
    """The fleet, up; one that will not start is an error naming ``flag`` and the engine's log."""
    fleet = EngineFleet(cfg)
    try:
        fleet.start()
    except (RuntimeError, TimeoutError) as e:
        raise EngineProcessError(f"{flag}: {e}") from e
    return fleet


def _colocated(engines, device: str) -> FleetConfig:
    return FleetConfig(engines.model_path, 1, server_argv(engines.server_args(device)),
                       host=_bind_host(), log_dir=str(_engine_logs(engines.log_dir)))


def _disaggregated(engines) -> FleetConfig:
    """``--rollout-num-gpus`` engines, one GPU each (``CUDA_VISIBLE_DEVICES``), on the GPUs of
    this node that the trainer's ranks do not use; on a CPU machine, CPU engines."""
    n = engines.num_gpus
    gpus = rollout_gpus(n, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    device = "cuda:0" if gpus else "cpu"  # the one GPU each engine sees
    env = [{"CUDA_VISIBLE_DEVICES": g} for g in gpus] or None
    return FleetConfig(engines.model_path, n, server_argv(engines.server_args(device)),
                       host=_bind_host(), log_dir=str(engines.log_dir / "engines"), env=env)


def rollout_gpus(num: int, trainer_gpus: int) -> list[str]:
    """The GPUs (as ``CUDA_VISIBLE_DEVICES`` entries) of ``num`` engines placed after this
    node's ``trainer_gpus`` trainer GPUs; [] without CUDA."""
    if not torch.cuda.is_available():
        return []
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = visible.split(",") if visible else [str(i) for i in range(torch.cuda.device_count())]
    if trainer_gpus + num > len(ids):
        raise EngineProcessError(
            f"--rollout-num-gpus {num} needs {num} GPU(s) beside the trainer's {trainer_gpus} on "
            f"this node; {len(ids)} visible (lower --nproc-per-node / NUM_GPUS or ROLLOUT_GPUS)")
    return ids[trainer_gpus:trainer_gpus + num]


def _engine_logs(log_dir: Path) -> Path:
    """``engines/`` (one rank), ``engines/rank<r>/`` (several: each rank's fleet names its one
    engine ``engine0.log``)."""
    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    return log_dir / "engines" if world == 1 else log_dir / "engines" / f"rank{rank}"


def _bind_host() -> str:
    """Loopback on one node; the node's address when rank 0 must reach engines on others."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    if world <= local:
        return "127.0.0.1"
    import socket

    return socket.gethostbyname(socket.gethostname())

