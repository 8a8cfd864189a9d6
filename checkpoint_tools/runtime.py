"""What every process that runs Megatron needs around it, written once for the trainer
(``trainer/launch.py`` hands them on), the converters and the benchmarks: this rank's device, a
free port, and the parallel state ended. torch loads in the functions: the trainer's flags import
this module and need none of it."""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def default_device() -> "torch.device":
    """This rank's device: its current CUDA device, else the CPU."""
    import torch

    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() \
        else torch.device("cpu")


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on at ``host`` now (the OS picks it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def teardown() -> None:
    """Megatron's parallel state and the default process group, ended (where they exist)."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()
