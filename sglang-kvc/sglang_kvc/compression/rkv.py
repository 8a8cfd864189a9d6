"""R-KV (arXiv 2505.24133): importance minus redundancy, for long reasoning traces."""

from __future__ import annotations

import torch

from .base import CompressionPolicy
from .scoring import key_redundancy, pool1d, window_importance


class RKVPolicy(CompressionPolicy):
    def scratch_elems(self, m: int) -> int:
        return m * m  # the key similarity matrix of the torch path

    def score(self, keys: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
        c = self.cfg
        old = keys[..., :keys.shape[-2] - c.window, :]
        importance = pool1d(window_importance(old, queries), c.kernel_size, c.pooling)
        redundancy = key_redundancy(old, c.sim_threshold)
        return c.mix_lambda * importance - (1.0 - c.mix_lambda) * redundancy
