"""``--weight-sync auto`` with servers, settled once they answer: which GPU each one runs on.

From the flags alone (``config.weight_sync_mode``) servers on a GPU get NCCL first (SGLang's
``update_weights_from_distributed``), then, on this host, CUDA IPC and the disk. NCCL cannot put
two ranks of one group on one GPU (it rejects the duplicate device), so a server on the
trainer's own GPU (one GPU holding both) would reach IPC only after a first push had failed.
sglang-kvc servers say which GPU they run on (``/get_server_info``: ``gpu_uuid``); when one runs
on rank 0's GPU (rank 0 sends every push), IPC is the first choice and the disk the fallback.
Servers on other GPUs keep NCCL first; a server that does not say (stock SGLang) keeps the
flags' order. An explicit ``--weight-sync`` is never changed (its fallback list is empty).

    ws = settle_for_servers(ws, door)   # factory.weight_sync_for, on every rank (rank 0 decides)
"""

from __future__ import annotations

import dataclasses

from .config import WeightSyncConfig
from .interface import Engines


@dataclasses.dataclass
class Choice:
    """The settled config and why, for the startup line."""

    sync: WeightSyncConfig
    why: str


def settle(ws: WeightSyncConfig, server_gpus: list[str | None], trainer_gpu: str | None) -> Choice:
    """``auto``'s order for servers on ``server_gpus`` (UUIDs; None: unknown) from a trainer on
    ``trainer_gpu`` (None: no GPU). Only ``auto`` on this host is settled here: it is the one
    whose fallbacks hold ``ipc``."""
    if not _settles(ws):
        return Choice(ws, "as the flags give it")
    shared = [i for i, gpu in enumerate(server_gpus) if trainer_gpu and gpu == trainer_gpu]
    if not shared:
        known = "" if all(server_gpus) else " (a server that does not say its GPU is taken to be on another)"
        return Choice(ws, f"the servers run on other GPUs than the trainer's{known}")
    rest = tuple(m for m in ws.fallback if m != "ipc")
    return Choice(dataclasses.replace(ws, mode="ipc", fallback=rest),
                  f"server(s) {shared} run on the trainer's own GPU, where NCCL cannot pair two ranks")


def _settles(ws: WeightSyncConfig) -> bool:
    """``auto`` with servers on this host: NCCL first, CUDA IPC among its fallbacks."""
    return ws.mode == "distributed" and "ipc" in ws.fallback


def describe(choice: Choice) -> str:
    order = " then ".join((choice.sync.mode, *choice.sync.fallback))
    return f"[weight sync] {order}: {choice.why}"


def trainer_gpu_uuid() -> str | None:
    import torch

    if not torch.cuda.is_available():
        return None
    return str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)


def settle_for_servers(ws: WeightSyncConfig, door: Engines | None) -> WeightSyncConfig:
    """``settle`` with the servers behind ``door`` (this rank's weights door: None where it
    talks to none), decided on rank 0 and the same on every rank (the fallbacks are taken by
    every rank together)."""
    if not _settles(ws):
        return ws
    choice = None
    if _rank() == 0:
        gpus = door.gpu_uuids() if door is not None else []
        choice = settle(ws, gpus, trainer_gpu_uuid())
        print(describe(choice), flush=True)
    return _from_rank0(choice).sync


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_initialized() else 0


def _from_rank0(choice: Choice | None) -> Choice:
    import torch.distributed as dist

    if not dist.is_initialized():
        return choice
    box = [choice]
    dist.broadcast_object_list(box, src=0)
    return box[0]
