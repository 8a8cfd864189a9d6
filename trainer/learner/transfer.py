"""Host -> device copies that do not block the host (packing and the eviction masks use it)."""

from __future__ import annotations

import contextlib

import torch


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Host -> device without blocking the host: a plain ``.to(cuda)`` of pageable memory waits
    for the GPU to finish its queued work first (a sync); from pinned memory it does not."""
    if device.type != "cuda" or t.device.type != "cpu":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


@contextlib.contextmanager
def single_threaded():
    """torch's CPU ops on one thread in this block: packing and the replay records are many
    small ops, and on a host shared by several jobs each op's hand-off to a thread pool waits
    for the scheduler (measured: a pass's packing 0.4 s on one thread, 6 s on two, on a
    2-core host under a load of 30)."""
    threads = torch.get_num_threads()
    if threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
