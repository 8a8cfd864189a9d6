"""The Triton R-KV redundancy (compression/triton_scoring.py) against the torch reference
(`scoring.key_redundancy_torch`, which materialises the m x m similarity matrix).

Runs on CUDA (`gpu` marker), or on CPU under the Triton interpreter (TRITON_INTERPRET=1 with
triton importable); skipped otherwise. Inputs include exact and near duplicates so that the
"newest similar key is spared" branch decides part of the result, rows with no similar key, and
a negative threshold (the zero diagonal then qualifies, as in the reference).
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from sglang_kvc.compression import CompressionConfig, RKVPolicy
from sglang_kvc.compression.scoring import key_redundancy_torch

HAS_TRITON = importlib.util.find_spec("triton") is not None
INTERPRET = HAS_TRITON and os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not (torch.cuda.is_available() or INTERPRET), reason="needs CUDA or TRITON_INTERPRET=1")]

# Small under the interpreter (it runs every program in Python).
SIZES = [1, 17, 200] if DEVICE == "cpu" else [1, 17, 200, 632, 1000]


def keys_with_duplicates(lead, m, d, dtype, seed=0):
    """Random keys where every 5th is a copy and every 7th a slightly perturbed copy of an
    earlier key: similarities above 0.5 exist, and which copy is newest matters."""
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(*lead, m, d, generator=g)
    for j in range(1, m):
        if j % 5 == 0:
            k[..., j, :] = k[..., j // 2, :]
        elif j % 7 == 0:
            k[..., j, :] = k[..., j - 3, :] + 0.3 * torch.randn(*lead, d, generator=g)
    return k.to(dtype).to(DEVICE)


def fused(keys, threshold):
    from sglang_kvc.compression.triton_scoring import key_redundancy

    return key_redundancy(keys, threshold)


@pytest.mark.parametrize("m", SIZES)
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("threshold", [0.5, 0.0, -0.1])
def test_redundancy_matches_reference(m, d, dtype, threshold):
    keys = keys_with_duplicates((3, 2), m, d, dtype)
    ref = key_redundancy_torch(keys, threshold)
    got = fused(keys, threshold)
    # Both compute fp32 cosines from the same (rounded) keys; the kernel sums a row in another
    # order and uses 3xTF32 products (~fp32 accuracy), so softmax inputs agree to ~1e-6.
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-7)


def test_spared_entry_decides_the_result():
    """Without the newest-duplicate rule the result differs: the kernel must implement it."""
    keys = keys_with_duplicates((2,), 40, 64, torch.float32)
    ref = key_redundancy_torch(keys, 0.5)
    no_rule = key_redundancy_torch(keys, 2.0)  # nothing qualifies: the rule never applies
    assert (ref - no_rule).abs().max() > 1e-4
    torch.testing.assert_close(fused(keys, 0.5), ref, rtol=1e-5, atol=1e-7)


def test_non_contiguous_view_as_the_compressor_passes_it():
    # compressor.py: pool.k[:, slots] is [L, R, n, Hkv, D], permuted to [R, L, Hkv, n, D], and
    # the policy drops the window: a strided view.
    L, R, n, H, d, w = 2, 3, 50, 2, 64, 8
    gathered = keys_with_duplicates((L, R), n * H, d, torch.bfloat16).view(L, R, n, H, d)
    view = gathered.permute(1, 0, 3, 2, 4)[..., :n - w, :]
    torch.testing.assert_close(fused(view, 0.5), key_redundancy_torch(view, 0.5), rtol=1e-5, atol=1e-7)


def test_rkv_selection_unchanged():
    cfg = CompressionConfig(algorithm="rkv", budget=24, window=4)
    R, L, Hkv, Hq, n, d = 2, 2, 2, 4, 60, 64
    keys = keys_with_duplicates((R, L, Hkv), n, d, torch.float32, seed=1)
    queries = torch.randn(R, L, Hq, cfg.window, d, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    policy = RKVPolicy(cfg)
    got = policy.select(keys, queries, cfg.budget)  # dispatches to Triton on CUDA
    import sglang_kvc.compression.rkv as rkv

    orig = rkv.key_redundancy
    rkv.key_redundancy = key_redundancy_torch
    try:
        ref = policy.select(keys, queries, cfg.budget)
    finally:
        rkv.key_redundancy = orig
    if DEVICE == "cpu":  # the dispatcher keeps CPU on the reference: compare the kernel directly
        rkv.key_redundancy = fused
        try:
            got = policy.select(keys, queries, cfg.budget)
        finally:
            rkv.key_redundancy = orig
    assert torch.equal(got, ref)
