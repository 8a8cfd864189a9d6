"""Host -> device copies that do not block the host (packing and the eviction masks use it)."""

from __future__ import annotations

import torch


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Host -> device without blocking the host: a plain ``.to(cuda)`` of pageable memory waits
    for the GPU to finish its queued work first (a sync); from pinned memory it does not."""
    if device.type != "cuda" or t.device.type != "cpu":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)
