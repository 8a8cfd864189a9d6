"""Small host -> device copies of integers that never wait for the GPU.

`torch.tensor(values, device=cuda)`, and `.to(cuda, non_blocking=True)` from pageable memory, copy
synchronously: CUDA syncs the stream before a pageable host-to-device copy, so the host waits for
every kernel queued before it (with overlap scheduling, the decode step in flight). From pinned
memory the copy is queued behind them and the host goes on (torch's pinned allocator keeps the
buffer until the copy is done). On a CPU device nothing is pinned or copied twice.
"""

from __future__ import annotations

import numpy as np
import torch


def ints_to_device(values, device, dtype: torch.dtype | None = torch.int64) -> torch.Tensor:
    """A list or numpy array of ints (a prefill's token ids, table rows, slot-table indices) as a
    `dtype` tensor on `device` (None: an array's own dtype), without a device sync. A list goes
    through numpy: torch.tensor of a 4k-int list took 0.66 ms on a CPU here, np.fromiter 0.07 ms."""
    device = torch.device(device)
    if not isinstance(values, np.ndarray):
        values = np.fromiter(values, dtype=np.int64, count=len(values))
    host = torch.from_numpy(values)
    host = host if dtype is None else host.to(dtype)
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)
