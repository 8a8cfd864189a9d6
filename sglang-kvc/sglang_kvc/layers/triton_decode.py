"""Paged decode attention in Triton: one query token per request against its slots in the pool.

Split-KV (flash-decoding) in two stages. Stage 1, grid (request, block of KV heads, split): the
program takes all query heads of its KV heads (so q·Kᵀ is a tensor-core dot even for GQA), walks
its share of the request's slot table in BLOCK_N chunks with an online softmax, and writes a
partial output and its log-sum-exp. Stage 2, grid (request, query head): merges the splits.
With one split (large batches), stage 1 writes the output itself and stage 2 is not launched.

Why blocks of KV heads: with one token per slot, a request's K/V rows are scattered over the
pool, and a program per (request, KV head) read 128-byte pieces of them one dependent load after
another: ~1.1-2.1 TB/s on an H100 whatever the split, warps or pipelining (benchmarks.engine.decode_attention).
Reading a slot's heads as one row and prefetching the next block's slots is what helps.
With `NewTokenKV` (the engine's decode steps), stage 1 also applies RoPE to q and the new token's
k, writes its K/V into the pool and attends to it from registers: the separate RoPE + store
kernel goes (-1.5 us per layer at context 384 on an H100, docs/benchmarks.md). It rounds like
fused_ops' RoPE and is compiled without FMA contraction, so the pool gets the same bits.
Everything the kernels read per step (rows, kv_lens) is a tensor and the grid depends only on the
batch size, so a decode step can be captured in a CUDA graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..kvcache.kv_quant import is_fp8
from .fused_ops import _round, fp8_scales, rope_combine, to_fp8


@dataclass
class NewTokenKV:
    """The step's own K/V, un-rotated: stage 1 then applies RoPE to q and k itself, writes k and
    v into the pool at `slots`, and attends to the new token from registers. This replaces the
    separate RoPE + store kernel (one of ~10 kernels per layer in a launch-bound decode step)."""
    k: torch.Tensor  # [B, Hkv, D], any token/head strides, last dim dense (a split of qkv)
    v: torch.Tensor  # [B, Hkv, D], same
    positions: torch.Tensor  # [B] logical positions: the cos/sin rows
    cos: torch.Tensor  # [max_pos, D] tables (fp32 or the model dtype)
    sin: torch.Tensor
    slots: torch.Tensor  # [B] the new tokens' slots: table[row, kv_len - 1]
    # Compression's query ring (query_ring.py) of this layer, [table rows, w, Hq, D] in q's
    # dtype: stage 1 also writes the rotated q there, at [row, position % w] (what
    # QueryRing.record does), so the scoring policies keep the fused path. None: no ring.
    ring: torch.Tensor | None = None


@triton.jit
def _rope_tile(X, idx, partner, mask, cos, sin, sign):
    """RoPE of the values X[idx] (X[partner] holds each one's rotate_half partner, `sign` its
    sign), with fused_ops' rounding."""
    x = tl.load(X + idx, mask=mask, other=0.0).to(tl.float32)
    xr = tl.load(X + partner, mask=mask, other=0.0).to(tl.float32)
    return rope_combine(x, sign * xr, cos, sin, X.dtype.element_ty)


@triton.jit
def online_softmax_block(q, k, v, visible, qk_scale, m_i, l_i, acc, IEEE: tl.constexpr):
    """One block of keys of flash attention's online softmax (the decode and the extend kernels):
    the scores q·kᵀ, scaled and -inf where not `visible`, update the running max `m_i`, sum `l_i`
    and output `acc` (fp32); p is rounded to v's dtype for its product, as the dots take it.
    Returns the new (m_i, l_i, acc)."""
    if IEEE:
        s = tl.dot(q, tl.trans(k), input_precision="ieee")
    else:
        s = tl.dot(q, tl.trans(k))
    s = tl.where(visible, s * qk_scale, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    if IEEE:
        pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")
    else:
        pv = tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc * alpha[:, None] + pv


@triton.jit
def _stage1(Q, K, V, Table, Rows, Lens, MidO, MidLse, Out, scale, KS, VS,
            stride_qb, stride_qh, stride_ks, stride_vs, stride_tr, stride_ob, stride_oh, stride_os,
            stride_outb, stride_outh,
            KN, VN, Pos, Cos, Sin, Slots, stride_knb, stride_knh, stride_vnb, stride_vnh, stride_cos,
            Ring, stride_rr, stride_rw, stride_rh, ring_w,
            HQ: tl.constexpr, HKV: tl.constexpr, GROUP: tl.constexpr, KVB: tl.constexpr,
            BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr, SPLITS: tl.constexpr,
            IEEE: tl.constexpr, NEW: tl.constexpr, FP8: tl.constexpr, FP8_MAX: tl.constexpr,
            RING: tl.constexpr):
    # Grid (request, block of KVB KV heads, split). A slot's KVB heads are one contiguous row of
    # KVB * D values, read whole; each query row carries its vector in its KV head's D columns
    # and zeros elsewhere, so one dot gives every head its own scores and one dot (then a pick
    # of the head's columns) its own output.
    b = tl.program_id(0)
    kv0 = tl.program_id(1) * KVB
    split = tl.program_id(2)
    row = tl.load(Rows + b).to(tl.int64)
    kv_len = tl.load(Lens + b)
    per_split = tl.cdiv(kv_len, SPLITS)
    start = split * per_split
    end = tl.minimum(start + per_split, kv_len)

    offs_c = tl.arange(0, KVB * D)
    col_head = offs_c // D  # local KV head of each column
    cmask = kv0 + col_head < HKV
    offs_h = tl.arange(0, BLOCK_H)
    row_head = offs_h // GROUP  # local KV head of each query row
    heads = kv0 * GROUP + offs_h
    hmask = (offs_h < KVB * GROUP) & (heads < HQ)
    qmask = hmask[:, None] & (row_head[:, None] == col_head[None, :]) & cmask[None, :]
    q_idx = b * stride_qb + heads[:, None] * stride_qh
    dcol = offs_c % D  # each column's index within its head
    if FP8:  # FP8 pool: K read as fp8 -> q's dtype; k_scale joins the softmax scale, v_scale
        # multiplies the output (kv_quant.py: stored = x / scale)
        v_scale = tl.load(VS)
        qk_scale = scale * tl.load(KS)
    else:
        qk_scale = scale
    if NEW:  # rotate q and the new k here; the new token is the last of the request's kv_len
        pos = tl.load(Pos + b).to(tl.int64)
        partner = (dcol + D // 2) % D
        cos = _round(tl.load(Cos + pos * stride_cos + dcol), Q.dtype.element_ty)
        sin = _round(tl.load(Sin + pos * stride_cos + dcol), Q.dtype.element_ty)
        sign = tl.where(dcol < D // 2, -1.0, 1.0)
        q = _rope_tile(Q, q_idx + dcol[None, :], q_idx + partner[None, :], qmask, cos[None, :],
                       sin[None, :], sign[None, :])
        if RING:  # each head's rotated q (its own D columns) to the ring, once per KV block
            if split == 0:
                dst = Ring + row * stride_rr + (pos % ring_w) * stride_rw
                tl.store(dst + heads[:, None] * stride_rh + dcol[None, :], q, mask=qmask)
        kn_idx = b * stride_knb + (kv0 + col_head) * stride_knh
        k_new = _rope_tile(KN, kn_idx + dcol, kn_idx + partner, cmask, cos, sin, sign)
        v_new = tl.load(VN + b * stride_vnb + (kv0 + col_head) * stride_vnh + dcol, mask=cmask)
        has_new = (end == kv_len) & (start < end)  # the split holding position kv_len - 1
        end = tl.where(has_new, end - 1, end)  # the pool loop stops before it
        if FP8:  # store the quantized K/V and attend to them, as a later step reads them
            k_new = to_fp8(k_new, tl.load(KS), K.dtype.element_ty, FP8_MAX)
            v_new = to_fp8(v_new, v_scale, V.dtype.element_ty, FP8_MAX)
        if has_new:
            slot = tl.load(Slots + b).to(tl.int64)
            tl.store(K + slot * stride_ks + kv0 * D + offs_c, k_new.to(K.dtype.element_ty), mask=cmask)
            tl.store(V + slot * stride_vs + kv0 * D + offs_c, v_new.to(V.dtype.element_ty), mask=cmask)
        if FP8:
            k_new = k_new.to(Q.dtype.element_ty)
            v_new = v_new.to(Q.dtype.element_ty)
    else:
        q = tl.load(Q + q_idx + dcol[None, :], mask=qmask, other=0.0)

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, KVB * D], tl.float32)
    offs_n = tl.arange(0, BLOCK_N)
    table = Table + row * stride_tr
    # The next block's slots are loaded one iteration ahead: the K/V gathers then wait on one
    # memory round trip per block, not two.
    next_slots = tl.load(table + start + offs_n, mask=start + offs_n < end, other=0)
    for n0 in range(start, end, BLOCK_N):
        nmask = n0 + offs_n < end
        slots = next_slots.to(tl.int64)
        ahead = n0 + BLOCK_N + offs_n
        next_slots = tl.load(table + ahead, mask=ahead < end, other=0)
        kv_mask = nmask[:, None] & cmask[None, :]
        k = tl.load(K + slots[:, None] * stride_ks + kv0 * D + offs_c[None, :], mask=kv_mask, other=0.0)
        v = tl.load(V + slots[:, None] * stride_vs + kv0 * D + offs_c[None, :], mask=kv_mask, other=0.0)
        if FP8:  # exact: every FP8 value is a bf16/fp16/fp32 value
            k = k.to(Q.dtype.element_ty)
            v = v.to(Q.dtype.element_ty)
        m_i, l_i, acc = online_softmax_block(q, k, v, nmask[None, :], qk_scale, m_i, l_i, acc, IEEE)
    if NEW:
        if has_new:  # the new token from registers; p rounded for the product as the dots do
            s_new = tl.sum(q.to(tl.float32) * k_new.to(tl.float32)[None, :], 1) * qk_scale
            m_new = tl.maximum(m_i, s_new)
            alpha = tl.exp(m_i - m_new)
            p_new = tl.exp(s_new - m_new)
            l_i = l_i * alpha + p_new
            pv = p_new.to(v_new.dtype).to(tl.float32)[:, None] * v_new.to(tl.float32)[None, :]
            acc = acc * alpha[:, None] + pv
            m_i = m_new

    # each query row keeps the D columns of its own KV head
    acc3 = tl.reshape(acc, [BLOCK_H, KVB, D])
    own = row_head[:, None] == tl.arange(0, KVB)[None, :]
    acc = tl.sum(tl.where(own[:, :, None], acc3, 0.0), axis=1)
    has = l_i > 0
    out = acc / tl.where(has, l_i, 1.0)[:, None]
    if FP8:
        out = out * v_scale
    offs_d = tl.arange(0, D)
    if SPLITS == 1:  # the whole context: the final output, no merge kernel
        dst = Out + b * stride_outb + heads[:, None] * stride_outh + offs_d[None, :]
        tl.store(dst, out.to(Out.dtype.element_ty), mask=hmask[:, None])
        return
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


def kv_heads_per_program(hkv: int, d: int, max_cols: int = 256) -> int:
    """KV heads one stage-1 program reads per slot: as many as fit in `max_cols` values (a
    power of two, at most the head count rounded up), at least one."""
    kvb = 1
    while kvb * 2 * d <= max_cols and kvb < hkv:
        kvb *= 2
    return kvb


def num_kv_splits(batch_size: int, kv_blocks: int, target: int = 256) -> int:
    """Splits giving ~`target` (request, KV-head block, split) programs: enough to fill an H100
    (132 SMs) twice. Depends on shapes only, so a captured graph's grid stays valid whatever
    the sequence lengths. (Measured at batch 256 on the 0.5B shape: one split is as fast as two
    at long contexts and faster at short ones; benchmarks.engine.decode_attention.)"""
    splits = 1
    while splits < 32 and batch_size * kv_blocks * splits < target:
        splits *= 2
    return splits


def paged_decode_attention(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                           table: torch.Tensor, rows: torch.Tensor, kv_lens: torch.Tensor,
                           scale: float, num_splits: int | None = None, block_n: int = 64, num_warps: int = 4,
                           num_stages: int = 2, kv_per_program: int | None = None,
                           new: NewTokenKV | None = None, scales=None) -> torch.Tensor:
    """q [B, Hq, D] (any token/head strides, last dim dense); k_pool/v_pool [num_slots, Hkv, D]
    (heads dense within a slot); table [R, max_len] int32; rows [B]; kv_lens [B] (every request
    must hold at least one slot). Returns [B, Hq, D] in q's dtype. `num_splits` /
    `kv_per_program` None: picked from the shapes (num_kv_splits / kv_heads_per_program).
    `new`: q and the new token's K/V are un-rotated; the kernel ropes and stores them.
    FP8 pools (views of a KVPool's bytes): `scales` = (k_scale, v_scale) one-element fp32
    tensors (None: 1.0); reads dequantize in the kernel, the new token is stored quantized."""
    B, Hq, D = q.shape
    Hkv = k_pool.shape[1]
    assert D & (D - 1) == 0 and D >= 16, "head_dim must be a power of two >= 16"
    for pool in (k_pool, v_pool):
        assert pool.stride(2) == 1 and pool.stride(1) == D, "a slot's heads must be dense"
    kvb = kv_per_program or kv_heads_per_program(Hkv, D)
    num_splits = num_splits or num_kv_splits(B, triton.cdiv(Hkv, kvb))
    assert num_splits & (num_splits - 1) == 0
    q = q if q.stride(-1) == 1 else q.contiguous()
    mid_shape = (B, Hq, num_splits, D) if num_splits > 1 else (1, 1, 1, D)  # unused with one split
    mid_o = torch.empty(mid_shape, dtype=torch.float32, device=q.device)
    mid_lse = torch.empty(mid_shape[:3], dtype=torch.float32, device=q.device)
    out = torch.empty((B, Hq, D), dtype=q.dtype, device=q.device)
    fp8 = is_fp8(k_pool.dtype)
    k_scale, v_scale = fp8_scales(scales, q.device) if fp8 else (q, q)
    _stage1[(B, triton.cdiv(Hkv, kvb), num_splits)](
        q, k_pool, v_pool, table, rows, kv_lens, mid_o, mid_lse, out, scale, k_scale, v_scale,
        q.stride(0), q.stride(1), k_pool.stride(0), v_pool.stride(0), table.stride(0),
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), out.stride(0), out.stride(1),
        *_new_token_args(new, q), *_ring_args(new, q), HQ=Hq, HKV=Hkv, GROUP=Hq // Hkv, KVB=kvb,
        BLOCK_H=max(16, triton.next_power_of_2(kvb * Hq // Hkv)), BLOCK_N=block_n, D=D,
        SPLITS=num_splits, IEEE=q.dtype == torch.float32, NEW=new is not None, FP8=fp8,
        FP8_MAX=torch.finfo(k_pool.dtype).max if fp8 else 0.0,
        RING=new is not None and new.ring is not None, num_warps=num_warps, num_stages=num_stages,
        # RoPE rounds after each op like torch (fused_ops): no contraction into FMAs
        enable_fp_fusion=new is None)
    if num_splits > 1:
        _stage2[(B, Hq)](mid_o, mid_lse, out, mid_o.stride(0), mid_o.stride(1), mid_o.stride(2),
                         out.stride(0), out.stride(1), D=D, SPLITS=num_splits)
    return out


def _new_token_args(new: NewTokenKV | None, q: torch.Tensor) -> tuple:
    """Stage 1's KN, VN, Pos, Cos, Sin, Slots and their strides (placeholders without `new`)."""
    if new is None:
        return (q, q, q, q, q, q, 0, 0, 0, 0, 0)
    k, v, cos = new.k, new.v, new.cos
    assert k.shape == v.shape and k.shape[0] == q.shape[0] and k.shape[2] == q.shape[2]
    assert k.stride(-1) == v.stride(-1) == 1 and cos.stride() == new.sin.stride() and cos.stride(-1) == 1
    return (k, v, new.positions, cos, new.sin, new.slots,
            k.stride(0), k.stride(1), v.stride(0), v.stride(1), cos.stride(0))


def _ring_args(new: NewTokenKV | None, q: torch.Tensor) -> tuple:
    """Stage 1's Ring, its row / window / head strides and its window (placeholders without)."""
    if new is None or new.ring is None:
        return (q, 0, 0, 0, 1)
    ring = new.ring
    assert ring.dtype == q.dtype and ring.stride(-1) == 1 and ring.shape[2:] == q.shape[1:]
    return (ring, ring.stride(0), ring.stride(1), ring.stride(2), ring.shape[1])
