"""Paged decode attention in Triton: one query token per request against its slots in the pool.

Split-KV (flash-decoding) in two stages. Stage 1, grid (request, KV head, split): the program
takes all query heads of one KV head's group (so q·Kᵀ is a tensor-core dot even for GQA), walks
its share of the request's slot table in BLOCK_N chunks with an online softmax, and writes a
partial output and its log-sum-exp. Stage 2, grid (request, query head): merges the splits.
Everything the kernels read per step (rows, kv_lens) is a tensor and the grid depends only on the
batch size, so a decode step can be captured in a CUDA graph.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _stage1(Q, K, V, Table, Rows, Lens, MidO, MidLse, scale,
            stride_qb, stride_qh, stride_ks, stride_kh, stride_vs, stride_vh, stride_tr,
            stride_ob, stride_oh, stride_os,
            GROUP: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
            D: tl.constexpr, SPLITS: tl.constexpr, IEEE: tl.constexpr):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    row = tl.load(Rows + b).to(tl.int64)
    kv_len = tl.load(Lens + b)
    per_split = tl.cdiv(kv_len, SPLITS)
    start = split * per_split
    end = tl.minimum(start + per_split, kv_len)

    offs_h = tl.arange(0, BLOCK_H)
    hmask = offs_h < GROUP
    heads = kvh * GROUP + offs_h
    offs_d = tl.arange(0, D)
    q = tl.load(Q + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                mask=hmask[:, None], other=0.0)

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, D], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        nmask = offs_n < end
        slots = tl.load(Table + row * stride_tr + offs_n, mask=nmask, other=0).to(tl.int64)
        k = tl.load(K + slots[:, None] * stride_ks + kvh * stride_kh + offs_d[None, :],
                    mask=nmask[:, None], other=0.0)
        if IEEE:
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        s = tl.where(nmask[None, :], s * scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V + slots[:, None] * stride_vs + kvh * stride_vh + offs_d[None, :],
                    mask=nmask[:, None], other=0.0)
        if IEEE:
            pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new

    has = l_i > 0
    out = acc / tl.where(has, l_i, 1.0)[:, None]
    lse = tl.where(has, m_i + tl.log(tl.where(has, l_i, 1.0)), float("-inf"))
    base = b * stride_ob + heads * stride_oh + split * stride_os
    tl.store(MidO + base[:, None] + offs_d[None, :], out, mask=hmask[:, None])
    tl.store(MidLse + b * (stride_ob // D) + heads * (stride_oh // D) + split, lse, mask=hmask)


@triton.jit
def _stage2(MidO, MidLse, Out, stride_ob, stride_oh, stride_os, stride_outb, stride_outh,
            D: tl.constexpr, SPLITS: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    offs_s = tl.arange(0, SPLITS)
    offs_d = tl.arange(0, D)
    lse = tl.load(MidLse + b * (stride_ob // D) + h * (stride_oh // D) + offs_s)
    m = tl.max(lse, 0)
    w = tl.exp(lse - m)
    o = tl.load(MidO + b * stride_ob + h * stride_oh + offs_s[:, None] * stride_os + offs_d[None, :])
    out = tl.sum(o * w[:, None], 0) / tl.sum(w, 0)
    tl.store(Out + b * stride_outb + h * stride_outh + offs_d, out.to(Out.dtype.element_ty))


def paged_decode_attention(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                           table: torch.Tensor, rows: torch.Tensor, kv_lens: torch.Tensor,
                           scale: float, num_splits: int = 8, block_n: int = 64) -> torch.Tensor:
    """q [B, Hq, D]; k_pool/v_pool [num_slots, Hkv, D]; table [R, max_len] int32; rows [B];
    kv_lens [B] (every request must hold at least one slot). Returns [B, Hq, D] in q's dtype."""
    B, Hq, D = q.shape
    Hkv = k_pool.shape[1]
    group = Hq // Hkv
    assert D & (D - 1) == 0 and D >= 16, "head_dim must be a power of two >= 16"
    assert num_splits & (num_splits - 1) == 0
    q = q.contiguous()
    mid_o = torch.empty(B, Hq, num_splits, D, dtype=torch.float32, device=q.device)
    mid_lse = torch.empty(B, Hq, num_splits, dtype=torch.float32, device=q.device)
    out = torch.empty_like(q)
    block_h = max(16, triton.next_power_of_2(group))
    _stage1[(B, Hkv, num_splits)](
        q, k_pool, v_pool, table, rows, kv_lens, mid_o, mid_lse, scale,
        q.stride(0), q.stride(1), k_pool.stride(0), k_pool.stride(1),
        v_pool.stride(0), v_pool.stride(1), table.stride(0),
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2),
        GROUP=group, BLOCK_H=block_h, BLOCK_N=block_n, D=D, SPLITS=num_splits,
        IEEE=q.dtype == torch.float32, num_warps=4, num_stages=2)
    _stage2[(B, Hq)](mid_o, mid_lse, out, mid_o.stride(0), mid_o.stride(1), mid_o.stride(2),
                     out.stride(0), out.stride(1), D=D, SPLITS=num_splits)
    return out
