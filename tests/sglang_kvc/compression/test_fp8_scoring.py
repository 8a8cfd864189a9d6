"""Compression on an FP8 pool: the compressor scores dequantized keys, and the kept sets
against the same keys held in bf16.

Overlap = |kept(FP8) ∩ kept(bf16)| / budget per (request, layer, KV head), printed. Measured
on these inputs (keys ~ N(0, 1.5^2), 160 tokens, window 8): means 0.93-0.97, minima 0.78-0.95
for R-KV and SnapKV at budgets 32 and 64 in both formats. Asserted: mean >= 0.85 and min >= 0.65
(a kept set is a top-k of scores, so near-ties legitimately flip), StreamingLLM exactly 1 (it
keeps positions only).

Mutation checks: the compressor reading the raw uint8 bytes (`pool.k[:, slots]`) fails
test_compressor_scores_dequantized_keys.
"""

from __future__ import annotations

import pytest
import torch

from sglang_kvc.compression import CompressionConfig, make_policy
from sglang_kvc.compression.compressor import Compressor
from sglang_kvc.compression.query_ring import QueryRing
from sglang_kvc.compression.trigger import Trigger
from sglang_kvc.kvcache.kv_cache import KVCache, KVPool
from sglang_kvc.kvcache.kv_quant import FP8_DTYPES

R, L, H, HQ, N, D, W = 2, 2, 2, 4, 160, 32, 8


def _case():
    g = torch.Generator().manual_seed(0)
    keys = (torch.randn(L, R * N, H, D, generator=g) * 1.5).bfloat16()
    queries = torch.randn(R, L, HQ, W, D, generator=g).bfloat16()
    return keys, queries


def _pool_keys(dtype, keys, device="cpu"):
    pool = KVPool(R * N + 1, L, H, D, dtype, torch.device(device), compute_dtype=torch.bfloat16)
    slots, keys = torch.arange(1, R * N + 1, device=device), keys.to(device)
    for layer in range(L):
        pool.write(layer, slots, keys[layer], keys[layer])
    return pool.keys(slots.view(R, N)).permute(1, 0, 3, 2, 4)  # [R, L, H, N, D], as compressor


DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA")])]  # cuda: R-KV's Triton scoring


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", list(FP8_DTYPES.values()))
@pytest.mark.parametrize("algorithm", ["rkv", "snapkv", "streamingllm"])
@pytest.mark.parametrize("budget", [32, 64])
def test_kept_sets_overlap_bf16(dtype, algorithm, budget, device):
    keys, queries = _case()
    queries = queries.to(device)
    policy = make_policy(CompressionConfig(algorithm, budget=budget, window=W))
    ref = policy.select(_pool_keys(torch.bfloat16, keys, device), queries, budget).flatten(0, 2)
    got = policy.select(_pool_keys(dtype, keys, device), queries, budget).flatten(0, 2)
    overlap = torch.tensor([len(set(a.tolist()) & set(b.tolist())) / budget for a, b in zip(ref, got)])
    print(f"{device} {dtype} {algorithm} B={budget}: kept-set overlap mean {overlap.mean():.3f} "
          f"min {overlap.min():.3f}")
    if algorithm == "streamingllm":
        assert (overlap == 1).all()
    else:
        assert overlap.mean() >= 0.85 and overlap.min() >= 0.65


def test_compressor_scores_dequantized_keys():
    """Compressor.compress on an FP8 pool keeps what the policy keeps for the dequantized keys,
    and the kept entries' bytes move exactly."""
    dtype = torch.float8_e4m3fn
    keys, queries = _case()
    cfg = CompressionConfig("rkv", budget=32, window=W)
    pool = KVPool(R * N + 1, L, H, D, dtype, torch.device("cpu"), compute_dtype=torch.bfloat16)
    kv = KVCache(pool, max_requests=R, max_len=N)
    ring = QueryRing(L, R + 1, W, HQ, D, torch.bfloat16, torch.device("cpu"))

    class Seq:
        peak_kv = num_compressions = tokens_evicted = num_computed = 0
        eviction = compress_budget = None

    seqs = [Seq() for _ in range(R)]
    for s in seqs:
        kv.attach(s)
    slots = kv.extend(seqs, [N] * R).view(R, N)
    for layer in range(L):
        pool.write(layer, slots.flatten(), keys[layer], keys[layer])
    for r, s in enumerate(seqs):
        ring.buf[:, s.row] = queries[r].permute(0, 2, 1, 3)  # [L, w, Hq, D]
    want = make_policy(cfg).select(_pool_keys(dtype, keys), queries, 32)
    before = pool.k[:, slots].clone()  # [L, R, N, H, D] bytes
    kept = Compressor(cfg, kv, ring, Trigger(cfg, set(), None)).compress(seqs)
    assert torch.equal(kept, want)
    for r in range(R):
        for layer in range(L):
            for h in range(H):
                src = before[layer, r, want[r, layer, h], h]
                assert torch.equal(pool.k[layer, slots[r, :32], h], src)
