"""FlexAttention ``BlockMask`` tensors built by hand (replay, ``sparse_attention``, classifies its
own tiles instead of evaluating ``create_block_mask``):
the tile size, BlockMask's ordered form, its argument names, and per-layer views that inductor
takes without a copy."""

from __future__ import annotations

import itertools

import torch

BLOCK = 128  # FlexAttention's tile: the block mask classifies 128 x 128 tiles

_NAMES = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices",
          "q_num_blocks", "q_indices", "full_q_num_blocks", "full_q_indices")


def ordered(tiles: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """BlockMask's ordered form of ``[..., rows, cols]`` tiles: (count ``[..., rows]`` int32,
    indices ``[..., rows, cols]``: the listed columns first, ascending, then the others, as
    ``BlockMask.from_kv_blocks`` orders its transposes). int16 indices: they are kept for the
    rollout (``replay_cache``), at half the size of the int32 that the kernels read."""
    order = torch.argsort((~tiles).to(torch.int8), dim=-1, stable=True)
    small = tiles.shape[-1] <= torch.iinfo(torch.int16).max
    return tiles.sum(-1, dtype=torch.int32), order.to(torch.int16 if small else torch.int32)


def block_mask_tensors(t: tuple) -> dict:
    """BlockMask's tensor arguments from (kv num, kv idx, full ..., [q num, q idx, full ...])."""
    return dict(itertools.zip_longest(_NAMES, t))


def aligned_layers(x: torch.Tensor) -> list[torch.Tensor]:
    """``[L, ...]`` -> L int32 views of ``[...]``, each starting 16-byte aligned: inductor clones
    an input misaligned against its compiled assumption on every call."""
    layers, n = x.shape[0], x[0].numel()
    buf = torch.empty(layers, -(-n // 4) * 4, dtype=torch.int32, device=x.device)
    buf[:, :n] = x.reshape(layers, n)
    return [buf[i, :n].view(x.shape[1:]) for i in range(layers)]
