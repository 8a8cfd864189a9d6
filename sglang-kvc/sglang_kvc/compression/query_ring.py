"""The last w post-RoPE queries of every running request, per layer.

Fused attention kernels never return attention weights, so scoring recomputes them at trigger
time from cached queries. The buffer is static ([layers, table rows, w, Hq, D], indexed by the
request's slot-table row), and a query at logical position p goes to ring slot p % w: one
`index_put_` per layer with device tensors only, which a CUDA graph captures. After w tokens
the ring holds exactly the last w queries; scoring never needs their order (mean over the window).
Row 0 is the padding row that padded CUDA-graph entries write to.
"""

from __future__ import annotations

import torch


class QueryRing:
    def __init__(self, num_layers: int, num_rows: int, window: int, num_heads: int,
                 head_dim: int, dtype: torch.dtype, device: torch.device):
        self.window = window
        self.buf = torch.zeros(num_layers, num_rows, window, num_heads, head_dim,
                               dtype=dtype, device=device)

    @property
    def bytes(self) -> int:
        return self.buf.numel() * self.buf.element_size()

    def record(self, layer: int, q: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor) -> None:
        """q [T, Hq, D] for tokens at logical `positions` [T] of table `rows` [T]."""
        self.buf[layer].index_put_((rows, positions % self.window), q)

    def gather(self, rows: torch.Tensor) -> torch.Tensor:
        """[R, L, Hq, w, D] for table rows [R]."""
        return self.buf[:, rows].permute(1, 0, 3, 2, 4)

    def copy_rows(self, dst: list[int], src: list[int]) -> None:
        """Rows `dst` get the queries of rows `src` (a request sharing another's prefill)."""
        dev = self.buf.device
        self.buf[:, torch.tensor(dst, device=dev)] = self.buf[:, torch.tensor(src, device=dev)]
