"""Decode-sized GEMMs (x @ W^T for M <= 256 rows) in Triton, with the MLP's silu*mul fused in.

Why: at decode batch sizes the layer GEMMs are short and wide (M = batch, K = 896..4096) and
cuBLAS picks tiles that leave most SMs idle or stream K in few CTAs: on the Qwen2.5-0.5B shape
at batch 256 they ran at ~1-1.5 TB/s of weight reads (docs/benchmarks.md). Here the tile, the
number of K splits and the warps come from a small table measured per (M bucket, N, K) on an
H100 (benchmarks/bench_gemm.py), and the gate/up GEMM computes silu(gate) * up in its epilogue:
one kernel, no [M, 2I] intermediate.

Numerics: fp32 accumulation, bias added in fp32, one rounding to the activation dtype (what
cuBLAS' bias epilogue does). The fused MLP rounds gate and up to the activation dtype before
silu*mul, exactly as the unfused GEMM -> fused_ops.silu_mul pair does, so the only difference
from cuBLAS is the order of the K sum. K splits write fp32 partials that one reduce kernel sums
in a fixed order: results are deterministic (no atomics).

Dispatch: CUDA, bf16/fp16, 2-D input with M <= MAX_M and a contiguous weight; everything else
(fp32 parity runs, prefill, the CPU) goes to F.linear.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .fused_ops import _jit, _precise, silu_mul, triton, tl, libdevice

MAX_M = 256
_ENABLED = True  # bench_gemm / tests flip this to compare against cuBLAS in one process


@dataclass(frozen=True)
class GemmConfig:
    block_m: int
    block_n: int
    block_k: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 4


def set_enabled(flag: bool) -> None:
    global _ENABLED
    _ENABLED = flag


def pick_config(m: int, n: int, k: int, fused: bool = False) -> GemmConfig:
    """Tile for an [m, k] x [k, n] product. Aim: >= ~1 CTA per SM with whole tiles of M (the
    activations are re-read from L2 per N tile, the weights once per M tile), splitting K
    when the output alone has too few tiles."""
    block_m = 16 if m <= 16 else 32 if m <= 32 else 64 if m <= 64 else 128
    block_n = 64 if n >= 4096 else 32 if block_m <= 32 else 64
    tiles = triton.cdiv(m, block_m) * triton.cdiv(n, block_n)
    split = 1
    while tiles * split * 2 <= 132 and k // (split * 2) >= 512:
        split *= 2
    block_k = 128 if k % 128 == 0 else 64
    tile_bytes = (block_m + (2 if fused else 1) * block_n) * block_k * 2
    return GemmConfig(block_m, block_n, block_k, split, 4 if block_m * block_n <= 64 * 64 else 8,
                      num_stages=max(2, min(4, 160 * 1024 // tile_bytes)))


def _use_triton(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return (_ENABLED and triton is not None and x.is_cuda and x.dim() == 2
            and x.dtype in (torch.bfloat16, torch.float16) and weight.dtype == x.dtype
            and 0 < x.shape[0] <= MAX_M and weight.is_contiguous())


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           config: GemmConfig | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias)."""
    if not _use_triton(x, weight):
        return F.linear(x, weight, bias)
    return _gemm(x, weight, bias, weight.shape[0], False, config)


def linear_silu_mul(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                    config: GemmConfig | None = None) -> torch.Tensor:
    """silu_mul(F.linear(x, weight, bias)) for weight = [gate; up] ([2I, K] -> out [M, I])."""
    if not _use_triton(x, weight):
        return silu_mul(F.linear(x, weight, bias))
    return _gemm(x, weight, bias, weight.shape[0] // 2, True, config)


def _gemm(x, weight, bias, n, fused, config):
    x = x if x.stride(1) == 1 else x.contiguous()
    m, k = x.shape
    cfg = config or pick_config(m, n, k, fused)
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    part = out if cfg.split_k == 1 else torch.empty(
        cfg.split_k * (2 if fused else 1), m, n, dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(m, cfg.block_m), triton.cdiv(n, cfg.block_n), cfg.split_k)
    has_bias = bias is not None
    _gemm_kernel[grid](
        x, weight, bias if has_bias else x, out, part, m, n, k, x.stride(0), weight.stride(0),
        HAS_BIAS=has_bias, SILU_MUL=fused, SPLIT_K=cfg.split_k, EVEN_K=k % (cfg.block_k * cfg.split_k) == 0,
        PRECISE=_precise(), BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    if cfg.split_k > 1:
        _reduce(part, bias, out, fused, cfg.split_k)
    return out


def _reduce(part, bias, out, fused, split):
    m, n = out.shape
    block = min(1024, triton.next_power_of_2(n))
    _split_reduce_kernel[(m, triton.cdiv(n, block))](
        part, bias if bias is not None else out, out, m, n, HAS_BIAS=bias is not None,
        SILU_MUL=fused, SPLIT_K=split, PRECISE=_precise(), BLOCK=block, num_warps=4)


# ---------------------------------------------------------------- kernels

@_jit
def _silu_mul_rounded(g, u, dtype: tl.constexpr, PRECISE: tl.constexpr):
    # gate and up as the GEMM would have stored them, then fused_ops._silu_mul_kernel's steps.
    g = g.to(dtype).to(tl.float32)
    u = u.to(dtype).to(tl.float32)
    if PRECISE:
        e = libdevice.exp(-g)
    else:
        e = tl.exp(-g)
    s = tl.math.div_rn(g, 1.0 + e).to(dtype).to(tl.float32)
    return s * u


@_jit
def _gemm_kernel(A, W, Bias, C, Part, M, N, K, sa_m, sw_n,
                 HAS_BIAS: tl.constexpr, SILU_MUL: tl.constexpr, SPLIT_K: tl.constexpr,
                 EVEN_K: tl.constexpr, PRECISE: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    # Grid (M tiles, N tiles, K splits); M tiles vary fastest, so the CTAs sharing a weight
    # tile run together and it is read from HBM about once.
    pid_m, pid_n, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m, mask_n = offs_m < M, offs_n < N
    k_len = tl.cdiv(tl.cdiv(K, SPLIT_K), BLOCK_K) * BLOCK_K
    k_start = pid_k * k_len
    a_ptr = A + offs_m[:, None].to(tl.int64) * sa_m + (k_start + offs_k)[None, :]
    w_ptr = W + offs_n[None, :].to(tl.int64) * sw_n + (k_start + offs_k)[:, None]
    up_off = N.to(tl.int64) * sw_n  # the up rows follow the gate rows
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, k_len, BLOCK_K):
        if EVEN_K:
            a = tl.load(a_ptr, mask=mask_m[:, None], other=0.0)
            w = tl.load(w_ptr, mask=mask_n[None, :], other=0.0)
        else:
            k_ok = (k_start + k + offs_k < K) & (k + offs_k < k_len)
            a = tl.load(a_ptr, mask=mask_m[:, None] & k_ok[None, :], other=0.0)
            w = tl.load(w_ptr, mask=mask_n[None, :] & k_ok[:, None], other=0.0)
        acc = tl.dot(a, w, acc)
        if SILU_MUL:
            if EVEN_K:
                wu = tl.load(w_ptr + up_off, mask=mask_n[None, :], other=0.0)
            else:
                wu = tl.load(w_ptr + up_off, mask=mask_n[None, :] & k_ok[:, None], other=0.0)
            acc_up = tl.dot(a, wu, acc_up)
        a_ptr += BLOCK_K
        w_ptr += BLOCK_K
    mask = mask_m[:, None] & mask_n[None, :]
    if SPLIT_K > 1:
        # fp32 partials [SPLIT_K (x2: gate, up), M, N]; _split_reduce_kernel finishes.
        p = Part + (pid_k * M + offs_m[:, None].to(tl.int64)) * N + offs_n[None, :]
        tl.store(p, acc, mask=mask)
        if SILU_MUL:
            tl.store(p + SPLIT_K * M * N, acc_up, mask=mask)
    else:
        dtype = C.dtype.element_ty
        if HAS_BIAS:
            acc += tl.load(Bias + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
            if SILU_MUL:
                acc_up += tl.load(Bias + N + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
        if SILU_MUL:
            acc = _silu_mul_rounded(acc, acc_up, dtype, PRECISE)
        tl.store(C + offs_m[:, None].to(tl.int64) * N + offs_n[None, :], acc.to(dtype), mask=mask)


@_jit
def _split_reduce_kernel(Part, Bias, C, M, N, HAS_BIAS: tl.constexpr, SILU_MUL: tl.constexpr,
                         SPLIT_K: tl.constexpr, PRECISE: tl.constexpr, BLOCK: tl.constexpr):
    # Grid (row, column block): the K splits summed in index order (deterministic).
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):
        acc += tl.load(Part + (s * M + row) * N + offs, mask=mask, other=0.0)
        if SILU_MUL:
            acc_up += tl.load(Part + ((SPLIT_K + s) * M + row) * N + offs, mask=mask, other=0.0)
    dtype = C.dtype.element_ty
    if HAS_BIAS:
        acc += tl.load(Bias + offs, mask=mask, other=0.0).to(tl.float32)
        if SILU_MUL:
            acc_up += tl.load(Bias + N + offs, mask=mask, other=0.0).to(tl.float32)
    if SILU_MUL:
        acc = _silu_mul_rounded(acc, acc_up, dtype, PRECISE)
    tl.store(C + row * N + offs, acc.to(dtype), mask=mask)
