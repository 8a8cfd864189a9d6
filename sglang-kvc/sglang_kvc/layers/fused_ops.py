"""Fused elementwise ops of a decoder layer: one Triton kernel each, plus a torch reference.

Why: a small model's decode step is launch-bound. Unfused, a layer runs ~40 tiny kernels (an
RMSNorm alone is seven, RoPE fourteen); with these ops (and RoPE + store inside the decode
attention kernel, triton_decode) a decode layer runs eight:
  add_rmsnorm -> qkv GEMM -> attention -> o_proj -> add_rmsnorm -> gate_up -> silu_mul -> down.

Numerics are today's: each kernel rounds where torch rounds. Elementwise products and sums of
bf16/fp16 values are computed in fp32 and rounded to the activation dtype after each op (what
torch's elementwise kernels do), casts round to nearest even in both, and kernels are compiled
without FMA contraction (`enable_fp_fusion=False`: a contracted mul+add rounds once instead of
twice). RoPE and silu*mul therefore match torch bit for bit. The norms' fp32 sum of squares is
reduced in another order than torch's, so a normed value may differ by 1 ulp, rarely.

Dispatch: the Triton kernel for CUDA tensors when triton imports, else the torch reference (the
CPU path, and the tests' oracle). Kernels take shapes and strides only and their grids depend on
shapes only: no host syncs, so they run inside captured CUDA graphs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..kvcache.kv_quant import is_fp8, quantize

try:
    import triton
    import triton.language as tl
    from triton.language.extra import libdevice
except ImportError:  # CPU-only installs: the torch references serve every call
    triton = tl = libdevice = None


def _jit(fn):
    # Without triton the kernels are plain (never launched) functions, so this module imports.
    return fn if triton is None else triton.jit(fn)


def _use_triton(x: torch.Tensor) -> bool:
    return triton is not None and x.is_cuda


def _precise() -> bool:
    # libdevice (CUDA's own expf/rsqrtf, what torch's kernels call) is not in the interpreter.
    return not triton.knobs.runtime.interpret


# ---------------------------------------------------------------- torch references (CPU path)

def rmsnorm_torch(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF's RMSNorm: fp32 statistics, cast back to x's dtype, then times the weight."""
    dtype = x.dtype
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def add_rmsnorm_torch(x, residual, weight, eps):
    residual = residual + x
    return rmsnorm_torch(residual, weight, eps), residual


def rope_torch(q, k, positions, cos, sin):
    """Rotated copies of q [T, Hq, D] and k [T, Hkv, D]. cos/sin: [max_pos, D] tables, fp32 or
    already in the model dtype (a module `.to(dtype)` casts buffers: the same single rounding)."""
    cos = cos[positions].to(q.dtype)[:, None, :]
    sin = sin[positions].to(q.dtype)[:, None, :]
    return _rotate(q, cos, sin), _rotate(k, cos, sin)


def _rotate(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def silu_mul_torch(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


# ---------------------------------------------------------------- public ops

def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim of x [T, N] or [T, H, N] (any row strides, last dim dense)."""
    if _use_triton(x):
        return _norm_triton(x, None, weight, eps)[0]
    return rmsnorm_torch(x, weight, eps)


def add_rmsnorm(x, residual, weight, eps):
    """(rmsnorm(residual + x), residual + x): the residual add rounded to the dtype, as torch's."""
    if _use_triton(x):
        return _norm_triton(x, residual, weight, eps)
    return add_rmsnorm_torch(x, residual, weight, eps)


def rope_(q, k, positions, cos, sin):
    """RoPE q [T, Hq, D] and k [T, Hkv, D] in place (views with any token/head strides, e.g. a
    split of the qkv output; last dim dense) at `positions` [T]; returns (q, k)."""
    if _use_triton(q):
        _rope_triton(q, k, positions, cos, sin, q_out=q)
        return q, k
    qr, kr = rope_torch(q, k, positions, cos, sin)
    return q.copy_(qr), k.copy_(kr)


def rope_store_(q, k, v, positions, cos, sin, k_cache, v_cache, slots, q_out=None, scales=None):
    """rope_ plus the KV store: rotated k and v also go to k_cache[slots], v_cache[slots]
    (caches [num_slots, Hkv, D]). k is rotated in place (prefill attends over it); rotated q
    goes to `q_out` (default: in place) and is returned. FP8 caches (views of a KVPool's
    bytes) get k / k_scale and v / v_scale quantized (kv_quant.quantize); `scales` is the
    (k_scale, v_scale) pair of one-element tensors (None: 1.0)."""
    q_out = q if q_out is None else q_out
    if _use_triton(q):
        _rope_triton(q, k, positions, cos, sin, q_out, (v, k_cache, v_cache, slots), scales)
        return q_out
    qr, kr = rope_torch(q, k, positions, cos, sin)
    q_out.copy_(qr)
    k.copy_(kr)
    k_scale, v_scale = scales if scales is not None else (None, None)
    _store_torch(k_cache, slots, kr, k_scale)
    _store_torch(v_cache, slots, v, v_scale)
    return q_out


def _store_torch(cache: torch.Tensor, slots: torch.Tensor, x: torch.Tensor, scale) -> None:
    if not is_fp8(cache.dtype):
        cache.index_copy_(0, slots, x)
        return
    scale = torch.ones((), device=x.device) if scale is None else scale
    # torch has no FP8 index_copy_ on a CPU: copy the bytes
    cache.view(torch.uint8).index_copy_(0, slots, quantize(x, scale, cache.dtype).view(torch.uint8))


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for gate_up = [gate | up] along the last dim ([T, 2I] -> [T, I])."""
    if _use_triton(gate_up):
        return _silu_mul_triton(gate_up)
    return silu_mul_torch(gate_up)


def row_argmax(x: torch.Tensor) -> torch.Tensor:
    """x.argmax(dim=-1) of a [B, V] tensor (int64; the first index among equal maxima). On CUDA
    two Triton kernels (per-chunk maxima, then their merge in chunk order): torch's argmax over
    a 152k bf16 vocabulary ran at ~1.4 TB/s, 54 us of a 2 ms decode step at batch 256. Finite
    inputs give torch's index exactly; a NaN counts as +inf (torch returns the NaN's index)."""
    if _use_triton(x) and x.dim() == 2 and x.shape[1] > 0:
        return _row_argmax_triton(x)
    return x.argmax(dim=-1)


# ---------------------------------------------------------------- launchers

def counter_uniform(seeds: torch.Tensor, steps: torch.Tensor) -> torch.Tensor | None:
    """sampler.uniform_from_counter in one kernel (its torch form launches ~25 tiny kernels per
    decode step); None when Triton does not serve this device, so the caller falls back."""
    return _counter_uniform_triton(seeds, steps) if _use_triton(seeds) else None


def _counter_uniform_triton(seeds: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    out = torch.empty(seeds.shape[0], dtype=torch.float64, device=seeds.device)
    n = seeds.shape[0]
    _counter_uniform_kernel[(triton.cdiv(n, 256),)](seeds, steps, out, n, BLOCK=256)
    return out


_ARGMAX_CHUNK = 8192


def _row_argmax_triton(x: torch.Tensor) -> torch.Tensor:
    x = _dense_last(x)
    B, V = x.shape
    chunks = triton.cdiv(V, _ARGMAX_CHUNK)
    vals = torch.empty(B, chunks, dtype=torch.float32, device=x.device)
    idx = torch.empty(B, chunks, dtype=torch.int64, device=x.device)
    _argmax_chunk_kernel[(B, chunks)](x, vals, idx, x.stride(0), V, chunks,
                                      CHUNK=_ARGMAX_CHUNK, BLOCK=2048, num_warps=8)
    out = torch.empty(B, dtype=torch.int64, device=x.device)
    _argmax_merge_kernel[(B,)](vals, idx, out, chunks, BLOCK=triton.next_power_of_2(chunks))
    return out


def _dense_last(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def _rows3(x: torch.Tensor) -> torch.Tensor:
    # Kernels see rows as [R0, R1, N]; a 2D input gets a unit middle dim.
    assert x.dim() in (2, 3), x.shape
    return x[:, None, :] if x.dim() == 2 else x


def _norm_triton(x, residual, weight, eps):
    x = _dense_last(x)
    n = x.shape[-1]
    out = torch.empty(x.shape, dtype=torch.promote_types(weight.dtype, x.dtype), device=x.device)
    if residual is None:
        res, res_out = x, x  # unused (HAS_RES off); res_out's dtype is the rounding dtype
    else:
        assert residual.shape == x.shape and residual.dtype == x.dtype
        res, res_out = _dense_last(residual), torch.empty(x.shape, dtype=x.dtype, device=x.device)
    x3, r3 = _rows3(x), _rows3(res)
    block = triton.next_power_of_2(n)
    _rmsnorm_kernel[(x3.shape[0], x3.shape[1])](
        x3, r3, weight, out, res_out, x3.stride(0), x3.stride(1), r3.stride(0), r3.stride(1),
        n, eps, HAS_RES=residual is not None, PRECISE=_precise(), BLOCK=block,
        num_warps=min(max(block // 256, 1), 16), enable_fp_fusion=False)
    return out, (None if residual is None else res_out)


def _rope_triton(q, k, positions, cos, sin, q_out, store=None, scales=None):
    T, hq, d = q.shape
    hkv = k.shape[1]
    assert d % 2 == 0 and k.shape == (T, hkv, d) and q_out.shape == q.shape
    assert q.stride(-1) == k.stride(-1) == q_out.stride(-1) == 1, "last dim must be dense"
    assert cos.stride() == sin.stride() and cos.stride(-1) == 1
    v, k_cache, v_cache, slots = store if store is not None else (k, k, k, positions)
    if store is not None:
        assert v.stride(-1) == k_cache.stride(-1) == v_cache.stride(-1) == 1
    fp8 = is_fp8(k_cache.dtype)
    k_scale, v_scale = fp8_scales(scales, q.device) if fp8 else (q, q)
    block_hq, block_half = triton.next_power_of_2(hq), triton.next_power_of_2(d // 2)
    _rope_kernel[(T,)](
        q, k, v, q_out, positions, cos, sin, k_cache, v_cache, slots, k_scale, v_scale,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        q_out.stride(0), q_out.stride(1), cos.stride(0),
        k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1), hq, hkv,
        HALF=d // 2, BLOCK_HQ=block_hq, BLOCK_HKV=triton.next_power_of_2(hkv),
        BLOCK_HALF=block_half, STORE=store is not None, FP8=fp8,
        FP8_MAX=torch.finfo(k_cache.dtype).max if fp8 else 0.0,
        num_warps=max(1, min(8, block_hq * block_half // 256)), enable_fp_fusion=False)


def fp8_scales(scales, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(k_scale, v_scale) one-element fp32 tensors for a kernel (None: ones)."""
    if scales is None:
        one = torch.ones(1, dtype=torch.float32, device=device)
        return one, one
    return scales


def _silu_mul_triton(gate_up: torch.Tensor) -> torch.Tensor:
    gate_up = _dense_last(gate_up)
    assert gate_up.dim() == 2 and gate_up.shape[1] % 2 == 0, gate_up.shape
    T, inter = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty(T, inter, dtype=gate_up.dtype, device=gate_up.device)
    block = min(1024, triton.next_power_of_2(inter))
    _silu_mul_kernel[(T, triton.cdiv(inter, block))](
        gate_up, out, gate_up.stride(0), out.stride(0), inter, PRECISE=_precise(), BLOCK=block,
        num_warps=4, enable_fp_fusion=False)
    return out


# ---------------------------------------------------------------- kernels

@_jit
def _round(x, dtype: tl.constexpr):
    """x (fp32) rounded to `dtype` and widened back: torch's rounding after each bf16/fp16 op."""
    return x.to(dtype).to(tl.float32)


@_jit
def _rmsnorm_kernel(X, R, W, Out, ResOut, sx0, sx1, sr0, sr1, N, eps,
                    HAS_RES: tl.constexpr, PRECISE: tl.constexpr, BLOCK: tl.constexpr):
    # One program per row (i, j) of a [R0, R1, N] view; outputs are dense [R0, R1, N].
    i = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < N
    out_row = (i * tl.num_programs(1) + j) * N
    dtype = ResOut.dtype.element_ty  # the activation dtype (ResOut is X when HAS_RES is off)
    x = tl.load(X + i * sx0 + j * sx1 + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_RES:
        r = tl.load(R + i * sr0 + j * sr1 + offs, mask=mask, other=0.0).to(tl.float32)
        x = _round(r + x, dtype)
        tl.store(ResOut + out_row + offs, x.to(dtype), mask=mask)
    var = tl.math.div_rn(tl.sum(x * x, axis=0), N * 1.0)
    if PRECISE:
        rstd = libdevice.rsqrt(var + eps)
    else:
        rstd = tl.math.rsqrt(var + eps)
    h = _round(x * rstd, dtype)
    w = tl.load(W + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(Out + out_row + offs, (w * h).to(Out.dtype.element_ty), mask=mask)


@_jit
def to_fp8(x, scale, dtype: tl.constexpr, FP8_MAX: tl.constexpr):
    """kv_quant.quantize in a kernel: x / scale (IEEE division), saturated, rounded to
    nearest even."""
    y = tl.math.div_rn(x.to(tl.float32), scale)
    y = tl.minimum(tl.maximum(y, -FP8_MAX), FP8_MAX)
    return y.to(dtype, fp_downcast_rounding="rtne")


@_jit
def rope_combine(x, partner, cos, sin, dtype: tl.constexpr):
    """x*cos + partner*sin (partner = the rotate_half value, sign included), fp32 in, rounded to
    `dtype` after each product and after the sum, as torch's bf16/fp16 ops round."""
    return (_round(x * cos, dtype) + _round(partner * sin, dtype)).to(dtype)


@_jit
def _rope_heads(X, XO, sx_h, sxo_h, H, cos1, cos2, sin1, sin2,
                BLOCK_H: tl.constexpr, HALF: tl.constexpr, BLOCK_HALF: tl.constexpr):
    """Rotate one token's H heads (X, XO point at its rows); returns both halves and the mask.
    out = x*cos + rotate_half(x)*sin, rounded after each op like torch (rotate_half = [-x2, x1])."""
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_HALF)[None, :]
    mask = (h < H) & (d < HALF)
    dtype = X.dtype.element_ty
    x1 = tl.load(X + h * sx_h + d, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(X + h * sx_h + HALF + d, mask=mask, other=0.0).to(tl.float32)
    o1 = rope_combine(x1, -x2, cos1, sin1, dtype)
    o2 = rope_combine(x2, x1, cos2, sin2, dtype)
    tl.store(XO + h * sxo_h + d, o1, mask=mask)
    tl.store(XO + h * sxo_h + HALF + d, o2, mask=mask)
    return o1, o2, mask


@_jit
def _rope_kernel(Q, K, V, QO, Pos, Cos, Sin, KC, VC, Slots, KS, VS,
                 sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, sqo_t, sqo_h, s_cos,
                 skc_s, skc_h, svc_s, svc_h, HQ, HKV,
                 HALF: tl.constexpr, BLOCK_HQ: tl.constexpr, BLOCK_HKV: tl.constexpr,
                 BLOCK_HALF: tl.constexpr, STORE: tl.constexpr, FP8: tl.constexpr,
                 FP8_MAX: tl.constexpr):
    # One program per token: all its q and k heads share one cos/sin row.
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(Pos + t).to(tl.int64)
    d = tl.arange(0, BLOCK_HALF)[None, :]
    dmask = d < HALF
    dtype = Q.dtype.element_ty  # the tables are cast to q's dtype, as rope_torch does
    row = pos * s_cos
    cos1 = _round(tl.load(Cos + row + d, mask=dmask, other=0.0), dtype)
    cos2 = _round(tl.load(Cos + row + HALF + d, mask=dmask, other=0.0), dtype)
    sin1 = _round(tl.load(Sin + row + d, mask=dmask, other=0.0), dtype)
    sin2 = _round(tl.load(Sin + row + HALF + d, mask=dmask, other=0.0), dtype)
    _rope_heads(Q + t * sq_t, QO + t * sqo_t, sq_h, sqo_h, HQ, cos1, cos2, sin1, sin2,
                BLOCK_HQ, HALF, BLOCK_HALF)
    k1, k2, kmask = _rope_heads(K + t * sk_t, K + t * sk_t, sk_h, sk_h, HKV, cos1, cos2, sin1,
                                sin2, BLOCK_HKV, HALF, BLOCK_HALF)
    if STORE:
        slot = tl.load(Slots + t).to(tl.int64)  # int64: a layer's pool can pass 2^31 elements
        h = tl.arange(0, BLOCK_HKV)[:, None]
        kc = KC + slot * skc_s + h * skc_h + d
        vp = V + t * sv_t + h * sv_h + d
        vc = VC + slot * svc_s + h * svc_h + d
        if FP8:  # quantized store (kv_quant.py)
            ks = tl.load(KS)
            vs = tl.load(VS)
            cdt = KC.dtype.element_ty
            tl.store(kc, to_fp8(k1, ks, cdt, FP8_MAX), mask=kmask)
            tl.store(kc + HALF, to_fp8(k2, ks, cdt, FP8_MAX), mask=kmask)
            tl.store(vc, to_fp8(tl.load(vp, mask=kmask), vs, cdt, FP8_MAX), mask=kmask)
            tl.store(vc + HALF, to_fp8(tl.load(vp + HALF, mask=kmask), vs, cdt, FP8_MAX), mask=kmask)
        else:
            tl.store(kc, k1.to(KC.dtype.element_ty), mask=kmask)
            tl.store(kc + HALF, k2.to(KC.dtype.element_ty), mask=kmask)
            tl.store(vc, tl.load(vp, mask=kmask).to(VC.dtype.element_ty), mask=kmask)
            tl.store(vc + HALF, tl.load(vp + HALF, mask=kmask).to(VC.dtype.element_ty), mask=kmask)


@_jit
def _silu_mul_kernel(GU, Out, s_gu, s_out, I, PRECISE: tl.constexpr, BLOCK: tl.constexpr):
    # Grid (token, column block). silu in fp32 as torch: x / (1 + exp(-x)), IEEE division.
    t = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < I
    dtype = Out.dtype.element_ty
    g = tl.load(GU + t * s_gu + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(GU + t * s_gu + I + offs, mask=mask, other=0.0).to(tl.float32)
    if PRECISE:
        e = libdevice.exp(-g)
    else:
        e = tl.exp(-g)
    s = _round(tl.math.div_rn(g, 1.0 + e), dtype)
    tl.store(Out + t * s_out + offs, (s * u).to(dtype), mask=mask)


@_jit
def _mix32(x):
    # The same integer steps as sampler._mix32 (int64 lanes holding values < 2**32).
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x = x ^ (x >> 15)
    x = (x * 0x5BD1E995) & 0xFFFFFFFF
    return x ^ (x >> 16)


@_jit
def _counter_uniform_kernel(Seeds, Steps, Out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    seed = tl.load(Seeds + offs, mask=mask, other=0).to(tl.int64)
    step = tl.load(Steps + offs, mask=mask, other=0).to(tl.int64)
    h = _mix32(_mix32(seed & 0xFFFFFFFF) ^ ((step * 0x9E3779B9) & 0xFFFFFFFF))
    tl.store(Out + offs, (h.to(tl.float64) + 0.5) / 4294967296.0, mask=mask)


@_jit
def _argmax_chunk_kernel(X, Vals, Idx, sx, V, chunks, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    # Grid (row, chunk). Each lane keeps its running max and the first column reaching it
    # (strictly larger wins), so the loads of the chunk's blocks are not serialised by
    # reductions; one reduction at the end takes the smallest column among lanes at the max.
    row = tl.program_id(0).to(tl.int64)
    start = tl.program_id(1) * CHUNK
    best = tl.full((BLOCK,), float("-inf"), tl.float32)
    best_i = start + tl.arange(0, BLOCK)  # an all -inf chunk answers its first column
    for off in tl.static_range(0, CHUNK, BLOCK):
        cols = start + off + tl.arange(0, BLOCK)
        v = tl.load(X + row * sx + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
        v = tl.where(v != v, float("inf"), v)
        take = v > best
        best = tl.where(take, v, best)
        best_i = tl.where(take, cols, best_i)
    m = tl.max(best, axis=0)
    tl.store(Vals + row * chunks + tl.program_id(1), m)
    first = tl.min(tl.where(best == m, best_i, 2147483647), axis=0)
    tl.store(Idx + row * chunks + tl.program_id(1), first.to(tl.int64))


@_jit
def _argmax_merge_kernel(Vals, Idx, Out, chunks, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, BLOCK)
    v = tl.load(Vals + row * chunks + c, mask=c < chunks, other=float("-inf"))
    i = tl.load(Idx + row * chunks + c, mask=c < chunks, other=0)
    first = tl.argmax(v, axis=0, tie_break_left=True)  # an all -inf row: chunk 0, index 0
    tl.store(Out + row, tl.sum(tl.where(c == first, i, 0), axis=0))
