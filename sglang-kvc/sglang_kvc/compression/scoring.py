"""Score pieces shared by the policies: window-query importance, pooling, key redundancy."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def window_importance(keys: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
    """Attention of the w window queries to the non-window keys.

    keys [..., Hkv, m, D] (the non-window tokens), queries [..., Hq, w, D] -> [..., Hkv, m]:
    softmax over the m keys per query (fp32, window keys excluded as in R-KV/SnapKV decode),
    mean over the w queries, then max over the query heads of each KV head's group.
    """
    *lead, hkv, m, d = keys.shape
    hq, w = queries.shape[-3], queries.shape[-2]
    g = hq // hkv
    q = queries.float().reshape(*lead, hkv, g * w, d)
    logits = q @ keys.float().transpose(-1, -2) * d ** -0.5  # [..., Hkv, g*w, m]
    probs = logits.softmax(dim=-1).reshape(*lead, hkv, g, w, m)
    return probs.mean(dim=-2).amax(dim=-2)


def pool1d(x: torch.Tensor, kernel: int, kind: str) -> torch.Tensor:
    """Stride-1 pooling over the last dim with kernel//2 padding, so the length is kept.
    Smoothing spreads a token's importance to its neighbours (SnapKV keeps clusters)."""
    if kernel == 1:
        return x
    shape = x.shape
    flat = x.reshape(-1, 1, shape[-1])
    if kind == "max":
        out = F.max_pool1d(flat, kernel, stride=1, padding=kernel // 2)
    else:  # zero padding counts in the average, as F.avg_pool1d does in SnapKV
        out = F.avg_pool1d(flat, kernel, stride=1, padding=kernel // 2)
    return out.reshape(shape)


def key_redundancy(keys: torch.Tensor, threshold: float) -> torch.Tensor:
    """R-KV redundancy of each token among the non-window keys [..., m, D] -> [..., m]: one
    Triton pass on CUDA (`triton_scoring.py`, no m x m matrix), the torch reference elsewhere."""
    if fused_redundancy(keys.device, keys.shape[-1]):
        from .triton_scoring import key_redundancy as fused

        return fused(keys, threshold)
    return key_redundancy_torch(keys, threshold)


def fused_redundancy(device, head_dim: int) -> bool:
    """Whether key_redundancy takes the one-pass Triton kernel (CUDA, a power-of-two head of at
    least 16), which holds no m x m similarity matrix."""
    return torch.device(device).type == "cuda" and head_dim >= 16 and head_dim & (head_dim - 1) == 0


def key_redundancy_torch(keys: torch.Tensor, threshold: float) -> torch.Tensor:
    """R-KV redundancy of each token among the non-window keys [..., m, D] -> [..., m].

    Cosine similarity matrix S with a zero diagonal; for every row i the most recent j whose
    similarity exceeds `threshold` gets S_ij = 0 (the newest near-duplicate is spared, so a
    repeated phrase keeps its latest copy); redundancy = softmax over j of the column means.

    The m x m matrix is the cost (R requests x L layers x Hkv heads of them per compaction), so
    it is read as few times as possible: the zeroed entries are subtracted from the column sums
    instead of being written back, and "most recent j" is an argmax over a reversed bool mask.
    """
    k = F.normalize(keys.float(), dim=-1)
    sim = k @ k.transpose(-1, -2)  # [..., m, m]
    m = sim.shape[-1]
    sim.diagonal(dim1=-2, dim2=-1).zero_()
    similar = (sim > threshold).flip(-1)
    last = (m - 1) - similar.to(torch.uint8).argmax(dim=-1, keepdim=True)  # first True, reversed
    spared = sim.gather(-1, last) * similar.gather(-1, (m - 1) - last)  # 0 where no j qualifies
    col = sim.sum(dim=-2)
    col.scatter_add_(-1, last.squeeze(-1), -spared.squeeze(-1))
    return (col / m).softmax(dim=-1)
