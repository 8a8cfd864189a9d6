"""R-KV (arXiv 2505.24133): importance minus redundancy, for long reasoning traces."""

from __future__ import annotations

import torch

from .base import CompressionPolicy
from .scoring import fused_redundancy, key_redundancy, pool1d, window_importance


class RKVPolicy(CompressionPolicy):
    def scratch_elems(self, m: int, device, head_dim: int) -> int:
        # the key similarity matrix of the torch path; the Triton pass holds none
        return 0 if fused_redundancy(device, head_dim) else m * m

    def score(self, keys: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
        c = self.cfg
        old = keys[..., :keys.shape[-2] - c.window, :]
        importance = pool1d(window_importance(old, queries), c.kernel_size, c.pooling)
        redundancy = key_redundancy(old, c.sim_threshold)
        return c.mix_lambda * importance - (1.0 - c.mix_lambda) * redundancy
