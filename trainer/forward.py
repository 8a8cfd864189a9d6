"""One forward pass of the policy over a packed micro-batch -> per-position log-probs/entropy."""

from __future__ import annotations

import torch

from .logprobs import logprobs_and_entropy
from .packing import PackedBatch


def packed_logits(model, batch: PackedBatch) -> torch.Tensor:
    """Vocab-parallel logits ``[T, V_local]`` of a packed batch (single pipeline stage)."""
    t = batch.tokens.shape[1]
    position_ids = torch.arange(t, device=batch.tokens.device).unsqueeze(0)  # RoPE uses cu_seqlens
    out = model(input_ids=batch.tokens, position_ids=position_ids, attention_mask=None,
                packed_seq_params=batch.packed_seq_params())
    return out.reshape(t, -1)  # GPTModel returns [b=1, T, V_local]


def packed_logprobs(model, batch: PackedBatch, *, temperature: float = 1.0,
                    vocab_size: int | None = None, chunk_size: int = 1024,
                    with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-position fp32 log-prob of the next token (and entropy) over the whole pack ``[T]``."""
    logits = packed_logits(model, batch)
    return logprobs_and_entropy(logits, batch.targets, temperature=temperature,
                                vocab_size=vocab_size, chunk_size=chunk_size,
                                with_entropy=with_entropy)
