"""DAPO's over-long reward shaping, on plain tensors (training rewards only, never eval).

- Soft over-long punishment (verl's ``overlong_buffer``: ``len``, ``penalty_factor``): with the
  maximum response length L and a buffer of B tokens, a response of length l gets

      penalty(l) = -min(1, max(0, l - (L - B)) / B) * factor

  added to its reward: nothing up to L - B tokens, then linearly down to -factor at L.
- Over-long filtering: truncated samples (the engine stopped them at L) leave the loss; they
  still count in their group's reward statistics, as rejected samples do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the flags build this config: torch loads with the functions below
    import torch


@dataclass
class OverlongConfig:
    buffer_len: int = 0  # --overlong-buffer-len; 0 = no soft penalty
    penalty_factor: float = 1.0  # --overlong-penalty-factor: the penalty at the maximum length
    filtering: bool = False  # --overlong-filtering: truncated samples masked from the loss

    def __post_init__(self) -> None:
        if self.buffer_len < 0:
            raise ValueError(f"overlong buffer_len must be >= 0, got {self.buffer_len}")
        if self.penalty_factor < 0:
            raise ValueError(f"overlong penalty_factor must be >= 0, got {self.penalty_factor}")

    @property
    def penalizes(self) -> bool:
        return self.buffer_len > 0 and self.penalty_factor > 0


def overlong_penalty(lengths: torch.Tensor, max_len: int, cfg: OverlongConfig) -> torch.Tensor:
    """[N] penalties (<= 0, fp32) for responses of ``lengths`` tokens; zeros when off."""
    import torch

    lengths = lengths.float()
    if not cfg.penalizes:
        return torch.zeros_like(lengths)
    expected = max_len - cfg.buffer_len  # verl: longer than this starts paying
    excess = (lengths - expected).clamp_min(0.0) / cfg.buffer_len
    return -excess.clamp_max(1.0) * cfg.penalty_factor


def keep_rows(truncated: list[bool], cfg: OverlongConfig) -> torch.Tensor | None:
    """[N] bool rows that stay in the loss, or None when nothing is filtered."""
    import torch

    if not cfg.filtering or not any(truncated):
        return None
    return ~torch.tensor(truncated, dtype=torch.bool)
