"""R-KV key redundancy in one Triton pass, without the m x m similarity matrix.

`scoring.key_redundancy` needs, per (request, layer, KV head), the column sums of the cosine
similarity matrix S (zero diagonal) and, for every row i, the newest j with S_ij > threshold and
that entry. Materialised, S is m x m fp32 per head: ~20 GB of traffic for a compaction round of
256 requests x 24 layers x 2 heads at m = 632 (90 ms of a 106 ms round on an H100). S is
symmetric, so column sums are row sums: one program per block of rows walks the columns tile by
tile and keeps, per row, its sum, its newest qualifying column and that column's value. The
scatter of the spared entries and the softmax stay in torch (O(m) per head).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_I = 64  # rows per program
BLOCK_J = 64  # columns per tile


@triton.jit
def _unit_rows(base, offs, mask, stride_m, offs_d):
    """Rows `offs` of one head's keys, fp32 and L2-normalised as F.normalize does (eps 1e-12)."""
    k = tl.load(base + offs[:, None] * stride_m + offs_d[None, :], mask=mask[:, None], other=0.0)
    k = k.to(tl.float32)
    return k / tl.maximum(tl.sqrt(tl.sum(k * k, 1)), 1e-12)[:, None]


@triton.jit
def _row_stats(K, RowSum, Last, Spared, m, threshold, stride_b, stride_m,
               D: tl.constexpr, BLOCK_I: tl.constexpr, BLOCK_J: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    offs_i = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)
    imask = offs_i < m
    offs_d = tl.arange(0, D)
    base = K + b * stride_b
    ki = _unit_rows(base, offs_i, imask, stride_m, offs_d)
    rowsum = tl.zeros([BLOCK_I], tl.float32)
    last = tl.full([BLOCK_I], -1, tl.int32)
    spared = tl.zeros([BLOCK_I], tl.float32)
    for j0 in range(0, m, BLOCK_J):
        offs_j = j0 + tl.arange(0, BLOCK_J)
        jmask = offs_j < m
        kj = _unit_rows(base, offs_j, jmask, stride_m, offs_d)
        # 3xTF32: fp32-accurate similarities (the threshold test is sensitive) on tensor cores.
        s = tl.dot(ki, tl.trans(kj), input_precision="tf32x3")
        s = tl.where(offs_i[:, None] == offs_j[None, :], 0.0, s)  # zero diagonal, still tested
        s = tl.where(jmask[None, :], s, 0.0)
        rowsum += tl.sum(s, 1)
        newest = tl.max(tl.where((s > threshold) & jmask[None, :], offs_j[None, :], -1), 1)
        value = tl.sum(tl.where(offs_j[None, :] == newest[:, None], s, 0.0), 1)
        found = newest >= 0  # tiles go left to right: a hit here is newer than any before
        last = tl.where(found, newest, last)
        spared = tl.where(found, value, spared)
    out = b * m + offs_i
    tl.store(RowSum + out, rowsum, mask=imask)
    tl.store(Last + out, last, mask=imask)
    tl.store(Spared + out, spared, mask=imask)


def row_stats(keys: torch.Tensor, threshold: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """keys [B, m, D] (any float dtype, unit stride in D) -> per row of S: sum [B, m] fp32,
    newest j with S_ij > threshold [B, m] int32 (-1: none), and S_ij there [B, m] fp32 (0: none)."""
    B, m, D = keys.shape
    if keys.stride(-1) != 1:
        keys = keys.contiguous()
    rowsum = torch.empty(B, m, dtype=torch.float32, device=keys.device)
    last = torch.empty(B, m, dtype=torch.int32, device=keys.device)
    spared = torch.empty(B, m, dtype=torch.float32, device=keys.device)
    grid = (B, triton.cdiv(m, BLOCK_I))
    _row_stats[grid](keys, rowsum, last, spared, m, float(threshold), keys.stride(0), keys.stride(1),
                     D=D, BLOCK_I=BLOCK_I, BLOCK_J=BLOCK_J, num_warps=4)
    return rowsum, last, spared


def key_redundancy(keys: torch.Tensor, threshold: float) -> torch.Tensor:
    """Same result as `scoring.key_redundancy_torch` for keys [..., m, D] on CUDA."""
    *lead, m, D = keys.shape
    if D & (D - 1) or D < 16:
        raise ValueError(f"head_dim {D} must be a power of two >= 16 for the Triton path")
    col, last, spared = row_stats(keys.reshape(-1, m, D), threshold)
    found = last >= 0
    col.scatter_add_(-1, last.clamp(min=0).long(), torch.where(found, -spared, 0.0))
    return (col / m).softmax(dim=-1).reshape(*lead, m)
