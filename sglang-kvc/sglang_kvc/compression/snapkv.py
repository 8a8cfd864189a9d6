"""SnapKV (arXiv 2404.14469), decode-time as R-KV and Sparse-RL run it: pooled window attention."""

from __future__ import annotations

import torch

from .base import CompressionPolicy
from .scoring import pool1d, window_importance


class SnapKVPolicy(CompressionPolicy):
    def score(self, keys: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
        c = self.cfg
        old = keys[..., :keys.shape[-2] - c.window, :]
        return pool1d(window_importance(old, queries), c.kernel_size, c.pooling)
