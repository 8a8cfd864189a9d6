"""StreamingLLM (arXiv 2309.17453): keep the first `num_sink` tokens and the most recent ones."""

from __future__ import annotations

import torch

from .base import CompressionPolicy


class StreamingLLMPolicy(CompressionPolicy):
    needs_queries = False  # position-only: no query ring needed

    def score(self, keys: torch.Tensor, queries: torch.Tensor | None) -> torch.Tensor:
        *lead, n, _ = keys.shape
        m = n - self.cfg.window
        # Newer scores higher; sinks above everything. Same set for every layer and head.
        s = torch.arange(m, device=keys.device, dtype=torch.float32)
        s[:self.cfg.num_sink] = float("inf")
        return s.expand(*lead, m)
