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


def to_device_together(tensors: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """Several host tensors to ``device`` in one copy: their bytes side by side in one (pinned,
    for a GPU) buffer, copied without blocking the host, viewed back as the same dtypes and
    shapes there (16-byte aligned parts: no kernel to split them)."""
    layout, offset = [], 0
    for t in tensors:
        size = t.numel() * t.element_size()
        layout.append((offset, size, t.dtype, t.shape))
        offset += -(-size // 16) * 16
    buf = torch.empty(offset, dtype=torch.uint8, pin_memory=device.type == "cuda")
    for t, (start, size, _, _) in zip(tensors, layout):
        buf[start:start + size] = t.contiguous().reshape(-1).view(torch.uint8)
    moved = buf.to(device, non_blocking=True)
    return [moved[start:start + size].view(dtype).reshape(shape)
            for start, size, dtype, shape in layout]
