"""Process groups from the launcher, with a bounded rendezvous.

Under ``torchrun`` (standalone or multi-node ``--rdzv-*``) or any launcher that exports
``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT`` (slurm wrappers, Ray actors), the default
group comes from the launcher's own rendezvous (``env://``: torchrun's agent store when it offers
one) and the device from ``LOCAL_RANK``. A plain ``python -m trainer.train`` gets a private
one-rank group on an in-memory store: no port, so nothing can collide or wait.

Every rank announces itself on the store before the group is built, so a rank that never comes
is reported by number after ``--rendezvous-timeout`` seconds instead of a silent 10-minute wait.
Subprocesses get :func:`launcher_free_env`: a child that inherited ``RANK``/``MASTER_PORT`` would
try to join this job's rendezvous (the hang that hf2megatron under torchrun had).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import os
import socket
import time
from typing import TYPE_CHECKING

from checkpoint_tools.runtime import default_device, free_port, teardown  # noqa: F401 - handed on

if TYPE_CHECKING:  # torch loads in the functions that use it: the flags below need none of it
    import torch

# Variables by which launchers describe a rank's place in a job (torchrun, torch.distributed).
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                 "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR",
                 "MASTER_PORT")
LAUNCHER_PREFIXES = ("TORCHELASTIC_",)


_STARTED = time.monotonic()  # startup messages show the time since the trainer was imported


class RendezvousError(RuntimeError):
    """The ranks of this job could not meet; the message names the address and the ranks."""


@dataclasses.dataclass
class Launch:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    master_addr: str | None = None
    master_port: int | None = None
    launcher: str = "none"  # torchrun | env | none

    @property
    def where(self) -> str:
        return f"MASTER_ADDR={self.master_addr} MASTER_PORT={self.master_port}"


def _env_int(name: str, default: int | None = None) -> int | None:
    value = os.environ.get(name)
    if value in (None, ""):
        return default
    try:
        return int(value)
    except ValueError:
        raise RendezvousError(f"environment variable {name}={value!r} is not an integer") from None


def detect_launch() -> Launch:
    """This process's place in the job, from the launcher's environment (none: one rank)."""
    if "RANK" not in os.environ and "WORLD_SIZE" not in os.environ:
        return Launch()
    rank, world = _env_int("RANK", 0), _env_int("WORLD_SIZE", 1)
    if not 0 <= rank < world:
        raise RendezvousError(f"RANK={rank} is outside WORLD_SIZE={world}")
    launcher = "torchrun" if "TORCHELASTIC_RUN_ID" in os.environ else "env"
    missing = [v for v in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(v)]
    if missing and world > 1:
        raise RendezvousError(f"rank {rank}/{world}: {' and '.join(missing)} not set; launch "
                              f"with torchrun or export MASTER_ADDR and MASTER_PORT")
    return Launch(rank, world, _env_int("LOCAL_RANK", rank), os.environ.get("MASTER_ADDR"),
                  _env_int("MASTER_PORT"), launcher)


def launcher_free_env(env: dict | None = None) -> dict:
    """``env`` (default: this process's) without the launcher's variables, for subprocesses."""
    env = dict(os.environ if env is None else env)
    return {k: v for k, v in env.items()
            if k not in LAUNCHER_VARS and not k.startswith(LAUNCHER_PREFIXES)}


def select_device(launch: Launch) -> torch.device:
    """``cuda:LOCAL_RANK`` (made current) when there is a GPU, else the CPU."""
    import torch

    if not torch.cuda.is_available():
        return torch.device("cpu")
    count = torch.cuda.device_count()
    if launch.local_rank >= count:
        raise RendezvousError(f"rank {launch.rank}: LOCAL_RANK={launch.local_rank} but only "
                              f"{count} GPU(s) are visible (--nproc-per-node too large?)")
    torch.cuda.set_device(launch.local_rank)
    return torch.device("cuda", launch.local_rank)


def _connect(launch: Launch, timeout: float):
    """A client of torchrun's agent store when it offers one; otherwise rank 0 serves the store.
    Nobody waits for the others here: :func:`_wait_for_ranks` does, and can name the missing."""
    import torch.distributed as dist

    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    try:
        store = dist.TCPStore(launch.master_addr, launch.master_port, launch.world_size,
                              is_master=launch.rank == 0 and not agent,
                              timeout=datetime.timedelta(seconds=timeout),
                              wait_for_workers=False, multi_tenant=not agent)
    except (RuntimeError, TimeoutError, ValueError) as e:  # DistStoreError, DistNetworkError
        raise RendezvousError(
            f"rank {launch.rank}/{launch.world_size}: could not reach the rendezvous store at "
            f"{launch.where} within {timeout:.0f}s ({type(e).__name__}: {str(e).splitlines()[0]}); "
            f"check that rank 0 is running and the address is reachable from this host") from None
    return store


def _wait_for_ranks(store, launch: Launch, timeout: float) -> None:
    """Every rank checks in; after ``timeout`` the missing ranks are named."""
    import torch.distributed as dist

    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    checkin = dist.PrefixStore(f"sparse_rl/checkin/{attempt}", store)
    checkin.set(f"rank{launch.rank}", socket.gethostname())
    checkin.add("count", 1)
    deadline = time.monotonic() + timeout
    while checkin.add("count", 0) < launch.world_size:
        if time.monotonic() > deadline:
            missing = [r for r in range(launch.world_size) if not checkin.check([f"rank{r}"])]
            raise RendezvousError(
                f"rank {launch.rank}/{launch.world_size}: rendezvous at {launch.where} did not "
                f"complete within {timeout:.0f}s: rank(s) {missing} never joined (same command "
                f"on every node? raise --rendezvous-timeout if they start slowly)")
        time.sleep(0.05)


def init_process_group(launch: Launch, *, rendezvous_timeout: float = 300.0,
                       timeout_minutes: float = 30.0, backend: str | None = None) -> None:
    """The default process group for ``launch`` (gloo on CPU, NCCL on GPU)."""
    import torch
    import torch.distributed as dist

    from checkpoint_tools import cpu_megatron

    cpu_megatron.install_cpu_stand_ins()
    if dist.is_initialized():
        return
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if launch.launcher == "none":
        store = dist.HashStore()  # private: one rank, no port
    else:
        store = _connect(launch, rendezvous_timeout)
        _wait_for_ranks(store, launch, rendezvous_timeout)
    dist.init_process_group(backend, store=store, rank=launch.rank, world_size=launch.world_size,
                            timeout=datetime.timedelta(minutes=timeout_minutes))


def _is_rank0() -> bool:
    import torch.distributed as dist

    if dist.is_initialized():
        return dist.get_rank() == 0
    return os.environ.get("RANK", "0") == "0"


@contextlib.contextmanager
def phase(name: str):
    """Print a startup phase and its time on rank 0: ``[startup +5s] name ...`` then
    ``[startup +8s] name: 3.2s (detail)``; the body may set ``info["detail"]``."""
    show, info = _is_rank0(), {}
    if show:
        print(f"[startup +{time.monotonic() - _STARTED:.0f}s] {name} ...", flush=True)
    begin = time.perf_counter()
    yield info
    if show:
        detail = f" ({info['detail']})" if info.get("detail") else ""
        print(f"[startup +{time.monotonic() - _STARTED:.0f}s] {name}: "
              f"{time.perf_counter() - begin:.1f}s{detail}", flush=True)


@dataclasses.dataclass
class ParallelConfig:
    tensor: int = 1  # --tensor-model-parallel-size
    pipeline: int = 1  # --pipeline-model-parallel-size
    rendezvous_timeout: float = 300.0  # seconds for every rank to meet
    timeout_minutes: float = 30.0  # each collective's, once the job runs
    seed: int = 1234  # Megatron's model-parallel RNG seed


def parallel_config_from_args(args) -> ParallelConfig:
    return ParallelConfig(tensor=args.tensor_model_parallel_size,
                          pipeline=args.pipeline_model_parallel_size,
                          rendezvous_timeout=args.rendezvous_timeout,
                          timeout_minutes=args.distributed_timeout_minutes, seed=args.seed)


def init_parallel(cfg: ParallelConfig) -> None:
    """Process groups from the launcher (or a private one), then Megatron's parallel state."""
    import torch.distributed as dist

    from checkpoint_tools import cpu_megatron

    launch = detect_launch()
    model_parallel = cfg.tensor * cfg.pipeline
    if launch.world_size % model_parallel:
        raise RendezvousError(
            f"WORLD_SIZE={launch.world_size} is not divisible by --tensor-model-parallel-size x "
            f"--pipeline-model-parallel-size = {model_parallel}")
    how = "no launcher" if launch.launcher == "none" else f"{launch.launcher} launch"
    with phase(f"process group: rank 0 of {launch.world_size} ({how})") as info:
        device = select_device(launch)
        init_process_group(launch, rendezvous_timeout=cfg.rendezvous_timeout,
                           timeout_minutes=cfg.timeout_minutes)
        cpu_megatron.init_model_parallel(tp=cfg.tensor, pp=cfg.pipeline, seed=cfg.seed)
        info["detail"] = (f"{dist.get_backend()} on {device.type}, TP {cfg.tensor} x PP "
                          f"{cfg.pipeline} x DP {launch.world_size // model_parallel}")


def add_launch_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("launch (process groups come from torchrun / the launcher's env)")
    g.add_argument("--rendezvous-timeout", type=float, default=ParallelConfig.rendezvous_timeout,
                   help="seconds for all ranks to meet at MASTER_ADDR:MASTER_PORT before failing "
                        "with the missing ranks named")
    g.add_argument("--distributed-timeout-minutes", type=float,
                   default=ParallelConfig.timeout_minutes,
                   help="timeout of each collective once the job runs (Megatron's flag)")

