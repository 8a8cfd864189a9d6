"""One forward pass of the policy over a packed micro-batch -> per-position log-probs/entropy."""

from __future__ import annotations

import torch

from .logprobs import logprobs_and_entropy
from .packing import PackedBatch


def packed_forward(model, batch: PackedBatch) -> torch.Tensor:
    """The model's raw output on a packed batch: logits on the last pipeline stage, hidden
    states on the others (RoPE positions restart per sequence from ``cu_seqlens``)."""
    position_ids = torch.arange(batch.tokens.shape[1], device=batch.tokens.device).unsqueeze(0)
    return model(input_ids=batch.tokens, position_ids=position_ids, attention_mask=None,
                 packed_seq_params=batch.packed_seq_params())


def packed_logits(model, batch: PackedBatch) -> torch.Tensor:
    """Vocab-parallel logits ``[T, V_local]`` of a packed batch (single pipeline stage)."""
    return packed_forward(model, batch).reshape(batch.tokens.shape[1], -1)  # [1, T, V] -> [T, V]


def packed_logprobs(model, batch: PackedBatch, *, temperature: float = 1.0,
                    vocab_size: int | None = None, chunk_size: int = 1024,
                    with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-position fp32 log-prob of the next token (and entropy) over the whole pack ``[T]``."""
    logits = packed_logits(model, batch)
    return logprobs_and_entropy(logits, batch.targets, temperature=temperature,
                                vocab_size=vocab_size, chunk_size=chunk_size,
                                with_entropy=with_entropy)
