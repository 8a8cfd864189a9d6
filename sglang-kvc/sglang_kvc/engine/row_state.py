"""Per-request state that decode steps read on the GPU, indexed by slot-table row.

- `last_token[row]`: the request's newest sampled token, written by the step that sampled it and
  read as the next decode step's input. The host never has to know a token before the GPU feeds
  it back, which is what lets the engine launch step N+1 before reading step N's outputs.
- `stop_ids[row]`: the token ids that end the request (EOS unless ignore_eos, and its
  stop_token_ids), padded with -1; each step compares the sampled tokens against them on the GPU
  and sends one flag per request back with the tokens.

Row 0 is the padding row of CUDA-graph batches, as in the slot table.
"""

from __future__ import annotations

import torch


class RowState:
    def __init__(self, num_rows: int, device: torch.device, width: int = 4):
        self.device = device
        self.last_token = torch.zeros(num_rows, dtype=torch.int64, device=device)
        self.stop_ids = torch.full((num_rows, width), -1, dtype=torch.int64, device=device)

    def admit(self, rows: torch.Tensor, stop_sets: list[list[int]]) -> None:
        """Set the stop ids of newly admitted requests (one host->device copy)."""
        width = max(1, max(len(s) for s in stop_sets))
        if width > self.stop_ids.shape[1]:
            self._widen(width)
        width = self.stop_ids.shape[1]
        padded = [s + [-1] * (width - len(s)) for s in stop_sets]
        self.stop_ids[rows] = torch.tensor(padded, dtype=torch.int64).to(self.device, non_blocking=True)

    def _widen(self, width: int) -> None:
        wider = torch.full((self.stop_ids.shape[0], width), -1, dtype=torch.int64, device=self.device)
        wider[:, :self.stop_ids.shape[1]] = self.stop_ids
        self.stop_ids = wider

    def record(self, rows: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Store the sampled ids as the rows' next inputs; returns which ids are stop ids."""
        self.last_token.index_copy_(0, rows, ids)
        return (self.stop_ids[rows] == ids[:, None]).any(dim=1)
