"""Paged extend attention in Triton: the new tokens of requests that already hold KV (a cached
prefix, a session's earlier turns) against their whole row of the pool, in one kernel.

Why: torch's path (attention.TorchAttention.extend) gathers each request's row, expands the KV
heads, builds a mask and runs SDPA, ~10 kernels and their host work per layer of every such
prefill. A multi-turn rollout's continuation prefills were host-bound on an H200: 70-90 ms a
step for ~3 ms of GPU work (docs/benchmarks.md, issue 66). Here one launch a layer reads the
slot table and the pool in place, with each request's causal limit taken from its lengths.

Grid (work item, query head): a work item is one request's block of BLOCK_M new tokens, listed
by the host (`work` [2, W]: request index, first new token of the block), so a step of many
short continuations and one long prompt launches no empty programs; an item whose block starts
past its request's new tokens does nothing (the padding of a captured step's list). The backend stores the new tokens' K/V
first, so a request's keys are row[:held + n] of the table: its held slots, then its new tokens;
new token i (row position held + i) sees keys j <= held + i. Softmax online in fp32, as flash
attention does. An FP8 pool is read as the decode kernel reads it (k_scale joins the softmax
scale, v_scale multiplies the output), so the step attends to what later steps will read. The
online softmax of a block of keys is the decode kernel's (triton_decode.online_softmax_block).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..kvcache.kv_quant import is_fp8
from .fused_ops import fp8_scales
from .triton_decode import online_softmax_block


@triton.jit
def _extend(Q, K, V, Table, Req, Work, Out, scale, KS, VS,
            stride_qt, stride_qh, stride_ks, stride_vs, stride_tr, stride_ot, stride_oh, stride_req,
            stride_work, GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
            D: tl.constexpr, IEEE: tl.constexpr, FP8: tl.constexpr):
    w = tl.program_id(0)
    h = tl.program_id(1)
    e = tl.load(Work + w)
    m0 = tl.load(Work + stride_work + w)
    # Req [4, E]: table row, first flat token, new tokens, held slots
    row = tl.load(Req + e).to(tl.int64)
    first = tl.load(Req + stride_req + e).to(tl.int64)
    n_new = tl.load(Req + 2 * stride_req + e)
    held = tl.load(Req + 3 * stride_req + e)
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    mmask = offs_m < n_new
    q_ptr = Q + (first + offs_m)[:, None] * stride_qt + h * stride_qh + offs_d[None, :]
    q = tl.load(q_ptr, mask=mmask[:, None], other=0.0)
    if FP8:
        v_scale = tl.load(VS)
        qk_scale = scale * tl.load(KS)
    else:
        qk_scale = scale
    # keys this block's last query sees; none for a block past the request's new tokens
    end = tl.where(m0 < n_new, held + tl.minimum(n_new, m0 + BLOCK_M), 0)
    limit = held + offs_m  # each query's last visible key
    kv_col = (h // GROUP) * D + offs_d
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    table = Table + row * stride_tr
    # Key 0 is in the first block and visible to every query, so no row's maximum stays -inf.
    for n0 in range(0, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        nmask = offs_n < end
        slots = tl.load(table + offs_n, mask=nmask, other=0).to(tl.int64)
        k = tl.load(K + slots[:, None] * stride_ks + kv_col[None, :], mask=nmask[:, None], other=0.0)
        v = tl.load(V + slots[:, None] * stride_vs + kv_col[None, :], mask=nmask[:, None], other=0.0)
        if FP8:  # exact: every FP8 value is a bf16/fp16/fp32 value
            k = k.to(Q.dtype.element_ty)
            v = v.to(Q.dtype.element_ty)
        visible = (offs_n[None, :] <= limit[:, None]) & nmask[None, :]
        m_i, l_i, acc = online_softmax_block(q, k, v, visible, qk_scale, m_i, l_i, acc, IEEE)
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    if FP8:
        out = out * v_scale
    o_ptr = Out + (first + offs_m)[:, None] * stride_ot + h * stride_oh + offs_d[None, :]
    tl.store(o_ptr, out.to(Out.dtype.element_ty), mask=mmask[:, None])


def extend_supported(head_dim: int) -> bool:
    """Whether the kernel takes this head size: a power of two >= 16 (the dot's tile)."""
    return head_dim >= 16 and head_dim & (head_dim - 1) == 0


def paged_extend_attention(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                           table: torch.Tensor, requests: torch.Tensor, work: torch.Tensor,
                           block_m: int, scale: float, out: torch.Tensor | None = None, scales=None,
                           block_n: int = 64, num_warps: int = 4, num_stages: int = 2) -> torch.Tensor:
    """q [T, Hq, D] (the prefill's flat tokens, rotated; last dim dense); k_pool/v_pool
    [num_slots, Hkv, D] holding every request's keys at table[row, :held + new]; requests
    [4, E] int32 (table row, first flat token, new tokens, held slots per request); work [2, W]
    int32, the blocks of `block_m` new tokens to compute (step_io.extend_work; padding entries point
    past their request's tokens). Writes those tokens of `out` [T, Hq, D] (new when None; other
    tokens are left as they are) and returns it. FP8 pools: `scales` = (k_scale, v_scale)
    one-element fp32 tensors, as paged_decode_attention takes them."""
    T, Hq, D = q.shape
    Hkv = k_pool.shape[1]
    assert extend_supported(D), f"head_dim {D}: the kernel takes powers of two >= 16"
    for pool in (k_pool, v_pool):
        assert pool.stride(2) == 1 and pool.stride(1) == D, "a slot's heads must be dense"
    # (row views of larger buffers, a captured step's, are fine: each row dense)
    assert requests.shape[0] == 4 and requests.stride(1) == 1 and Hq % Hkv == 0
    assert work.shape[0] == 2 and work.stride(1) == 1 and block_m >= 16
    q = q if q.stride(-1) == 1 else q.contiguous()
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device) if out is None else out
    assert out.shape == q.shape and out.stride(-1) == 1
    fp8 = is_fp8(k_pool.dtype)
    k_scale, v_scale = fp8_scales(scales, q.device) if fp8 else (q, q)
    W = work.shape[1]
    if W == 0:
        return out
    _extend[(W, Hq)](
        q, k_pool, v_pool, table, requests, work, out, scale, k_scale, v_scale,
        q.stride(0), q.stride(1), k_pool.stride(0), v_pool.stride(0), table.stride(0),
        out.stride(0), out.stride(1), requests.stride(0), work.stride(0), GROUP=Hq // Hkv, BLOCK_M=block_m,
        BLOCK_N=block_n, D=D,
        IEEE=q.dtype == torch.float32, FP8=fp8, num_warps=num_warps, num_stages=num_stages)
    return out
