"""One forward pass of the policy over a packed micro-batch -> per-position log-probs/entropy."""

from __future__ import annotations

import torch

from .fusions import rope as fused_rope
from .logprobs import logprobs_and_entropy
from .packing import PackedBatch


def packed_forward(model, batch: PackedBatch) -> torch.Tensor:
    """The model's raw output on a packed batch: logits on the last pipeline stage, hidden
    states on the others (RoPE positions restart per sequence: the pack's ``positions``, made
    on the host with the rest of it; our fused RoPE takes them instead of deriving its own)."""
    fused_rope.use_positions(batch.cu_seqlens, batch.positions)
    return model(input_ids=batch.tokens, position_ids=batch.positions.unsqueeze(0),
                 attention_mask=None, packed_seq_params=batch.packed_seq_params())


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
