"""Decode attention over an FP8 pool, against two references.

1. Exactness (CPU, torch path): TorchAttention over an FP8 pool equals (to fp32 summation
   order) SDPA over K/V rounded through torch's own FP8 cast (`x.to(fp8)`, not kv_quant).
2. A derived bound against the unquantized attention. Each stored element has relative error
   <= eps (2^-4 e4m3, 2^-3 e5m2; inputs kept in the normal range). A score s_j = c q.k_j then
   moves by d_j <= eps c sum_i |q_i k_ji|, every softmax weight by a factor within
   exp(+-2 max_j d_j), so ||p' - p||_1 <= exp(2 max d) - 1, and
       |o' - o| <= sum_j p'_j |v'_j - v_j| + |sum_j (p'_j - p_j) v_j|
                <= eps max|v| + (exp(2 max d) - 1) max|v|.
   The test computes that bound per query from the data and checks the observed error.
3. GPU (`gpu`): the Triton decode kernel and the fused RoPE + store kernel on FP8 pools against
   the torch path: identical stored bytes, outputs equal to fp32 accumulation-order rounding.

Mutation checks: `dequantize` ignoring the scale, or KVPool.write casting without dividing by it,
fails test 1 (scale 0.5); attending to the new token unquantized in the Triton kernel is what
the GPU test's comparison with the separate store + attend would catch (not run here: no GPU).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sglang_kvc.kvcache.kv_cache import KVCache, KVPool
from sglang_kvc.kvcache.kv_quant import FP8_DTYPES
from sglang_kvc.layers.attention import AttentionMetadata, TorchAttention

EPS = {torch.float8_e4m3fn: 2.0 ** -4, torch.float8_e5m2: 2.0 ** -3}
HQ, HKV, D = 4, 2, 16


def _setup(dtype, device="cpu", model_dtype=torch.float32, B=3, lens=(5, 17, 40), scales=None,
           slots=128):
    pool = KVPool(slots, 1, HKV, D, dtype, torch.device(device), compute_dtype=model_dtype,
                  k_scale=scales, v_scale=scales)
    kv = KVCache(pool, max_requests=B, max_len=64)
    g = torch.Generator().manual_seed(0)
    table_slots = torch.randperm(slots - 1, generator=g)[:sum(lens)] + 1
    k = (torch.randn(sum(lens), HKV, D, generator=g) * 2).to(model_dtype).to(device)
    v = (torch.randn(sum(lens), HKV, D, generator=g) * 2).to(model_dtype).to(device)
    table_slots = table_slots.to(device)
    pool.write(0, table_slots, k, v)
    start = 0
    for i, n in enumerate(lens):
        kv.req_to_token.table[i + 1, :n] = table_slots[start:start + n].int()
        start += n
    q = torch.randn(B, HQ, D, generator=g).to(model_dtype).to(device)
    rows = torch.arange(1, B + 1, device=device)
    meta = AttentionMetadata(False, table_slots[:B], rows=rows,
                             kv_lens=torch.tensor(lens, dtype=torch.int32, device=device),
                             max_kv_len=max(lens))
    return kv, k, v, table_slots, q, meta


def _dense(q, k, v, lens, kv_dtype=None, scale=1.0):
    """Per-request SDPA over the given K/V [T, Hkv, D] (optionally rounded through kv_dtype)."""
    if kv_dtype is not None:
        k = (k.float() / scale).to(kv_dtype).float().mul(scale).to(k.dtype)
        v = (v.float() / scale).to(kv_dtype).float().mul(scale).to(v.dtype)
    outs, start = [], 0
    for i, n in enumerate(lens):
        kk, vv = (t[start:start + n].transpose(0, 1)[None] for t in (k, v))
        outs.append(F.scaled_dot_product_attention(q[i][None, :, None], kk, vv, scale=D ** -0.5,
                                                   enable_gqa=True)[0, :, 0])
        start += n
    return torch.stack(outs)


@pytest.mark.parametrize("dtype", list(FP8_DTYPES.values()))
@pytest.mark.parametrize("scale", [1.0, 0.5])
def test_torch_decode_equals_attention_over_rounded_kv(dtype, scale):
    lens = (5, 17, 40)
    kv, k, v, _, q, meta = _setup(dtype, lens=lens, scales=torch.tensor([scale]))
    attn = TorchAttention(kv, HQ, D)
    attn.meta = meta
    out = attn.decode(0, q)
    # equal up to fp32 summation order (padded batch vs one request at a time)
    torch.testing.assert_close(out, _dense(q, k, v, lens, dtype, scale), rtol=1e-6, atol=1e-6)
    assert (out - _dense(q, k, v, lens)).abs().max() > 1e-3  # FP8 did round


@pytest.mark.parametrize("dtype", list(FP8_DTYPES.values()))
def test_torch_decode_within_the_derived_bound(dtype):
    lens = (5, 17, 40)
    kv, k, v, _, q, meta = _setup(dtype, lens=lens)
    attn = TorchAttention(kv, HQ, D)
    attn.meta = meta
    err = (attn.decode(0, q) - _dense(q, k, v, lens)).abs()  # [B, Hq, D]
    eps, start = EPS[dtype], 0
    for i, n in enumerate(lens):
        kk = k[start:start + n].repeat_interleave(HQ // HKV, dim=1)  # [n, Hq, D]
        vmax = v[start:start + n].abs().amax()
        delta = eps * D ** -0.5 * (q[i][None].abs() * kk.abs()).sum(-1).amax(0)  # [Hq]
        bound = (eps + torch.expm1(2 * delta)) * vmax  # [Hq]
        assert (err[i] <= bound[:, None] * 1.001 + 1e-6).all(), (i, err[i].amax(-1), bound)
        start += n


# ------------------------------------------------------------------------------------ GPU

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _capable(dtype) -> bool:
    return dtype != torch.float8_e4m3fn or torch.cuda.get_device_capability() >= (8, 9)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", list(FP8_DTYPES.values()))
@pytest.mark.parametrize("scale", [1.0, 0.5])
def test_gpu_triton_decode_matches_torch_path(dtype, scale):
    from sglang_kvc.layers.triton_decode import paged_decode_attention

    if not _capable(dtype):
        pytest.skip("e4m3 needs capability >= 8.9")
    lens = (5, 17, 40)
    kv, k, v, _, q, meta = _setup(dtype, "cuda", torch.bfloat16, lens=lens,
                                  scales=torch.tensor([scale]))
    attn = TorchAttention(kv, HQ, D)
    attn.meta = meta
    ref = attn.decode(0, q).float()
    pool = kv.pool
    for splits in (1, 4):
        out = paged_decode_attention(q, *pool.layer_buffers(0), kv.req_to_token.table, meta.rows,
                                     meta.kv_lens, D ** -0.5, splits, scales=pool.layer_scales(0))
        err = (out.float() - ref).norm() / ref.norm()
        assert err < 1e-2, (splits, err.item())


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", list(FP8_DTYPES.values()))
def test_gpu_fused_store_bytes_match_torch_quantize(dtype):
    """rope_store_ (Triton) and the decode kernel's own store (NewTokenKV) write the bytes
    kv_quant.quantize writes, and the kernel attends to the quantized new token."""
    from sglang_kvc.layers.fused_ops import rope_store_, rope_torch
    from sglang_kvc.layers.triton_decode import NewTokenKV, paged_decode_attention

    if not _capable(dtype):
        pytest.skip("e4m3 needs capability >= 8.9")
    lens = (5, 17, 40)
    kv, _, _, _, q, meta = _setup(dtype, "cuda", torch.bfloat16, lens=lens,
                                  scales=torch.tensor([0.75]))
    pool, B = kv.pool, len(lens)
    new_slots = kv.req_to_token.table[meta.rows, meta.kv_lens.long() - 1].long()
    g = torch.Generator(device="cuda").manual_seed(3)
    k_new = torch.randn(B, HKV, D, device="cuda", generator=g).bfloat16() * 3
    v_new = torch.randn(B, HKV, D, device="cuda", generator=g).bfloat16() * 3
    positions = meta.kv_lens.long() - 1
    freqs = torch.arange(64, device="cuda").float()[:, None] * (1e-2 ** torch.arange(D // 2, device="cuda") / D)
    cos, sin = torch.cat([freqs, freqs], -1).cos(), torch.cat([freqs, freqs], -1).sin()
    k_rot = rope_torch(q, k_new, positions, cos, sin)[1]
    want = KVPool(pool.num_slots, 1, HKV, D, dtype, torch.device("cuda"), torch.bfloat16,
                  pool.k_scale, pool.v_scale)
    want.k.copy_(pool.k)
    want.v.copy_(pool.v)
    want.write(0, new_slots, k_rot, v_new)  # the torch path's bytes
    before = pool.k.clone(), pool.v.clone()
    q_out = rope_store_(q.clone(), k_new.clone(), v_new, positions, cos, sin, *pool.layer_buffers(0),
                        new_slots, q_out=torch.empty_like(q), scales=pool.layer_scales(0))
    assert torch.equal(pool.k, want.k) and torch.equal(pool.v, want.v)
    ref = paged_decode_attention(q_out, *pool.layer_buffers(0), kv.req_to_token.table, meta.rows,
                                 meta.kv_lens, D ** -0.5, scales=pool.layer_scales(0))
    pool.k.copy_(before[0])
    pool.v.copy_(before[1])
    new = NewTokenKV(k_new, v_new, positions, cos, sin, new_slots)
    out = paged_decode_attention(q, *pool.layer_buffers(0), kv.req_to_token.table, meta.rows,
                                 meta.kv_lens, D ** -0.5, new=new, scales=pool.layer_scales(0))
    assert torch.equal(pool.k, want.k) and torch.equal(pool.v, want.v)
    err = (out.float() - ref.float()).norm() / ref.float().norm()
    assert err < 5e-3, err.item()
