"""The decode GEMMs (triton_gemm.py) against an fp32 torch reference of the same products.

Runs on CUDA (`gpu` marker), or on CPU under the Triton interpreter (TRITON_INTERPRET=1 with
triton importable); skipped otherwise. Covers K splits (with and without a ragged last split),
M and N not multiples of the tile, bias, the fused silu*mul epilogue, and a strided input. The
fused MLP must equal the unfused chain (GEMM rounded to the dtype, then silu*mul) computed from
the same fp32 sums: its only freedom is the order of the K sum.
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch
import torch.nn.functional as F

from sglang_kvc.fused_ops import silu_mul_torch

HAS_TRITON = importlib.util.find_spec("triton") is not None
INTERPRET = HAS_TRITON and os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not (torch.cuda.is_available() or INTERPRET), reason="needs CUDA or TRITON_INTERPRET=1")]
# The interpreter rounds fp32->bf16 by truncation; fp16 rounds the same on both.
DTYPES = [torch.float16] if DEVICE == "cpu" else [torch.float16, torch.bfloat16]

# (M, N, K, config or None for the picked one)
CASES = [(5, 48, 64, None), (40, 96, 256, (32, 32, 64, 1)), (40, 96, 256, (32, 32, 64, 2)),
         (64, 64, 320, (64, 32, 64, 4)), (17, 80, 200, (16, 32, 64, 2))]


def gemm():
    from sglang_kvc import triton_gemm

    return triton_gemm


def make(m, n, k, dtype, seed=0, bias=True, stride_pad=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k + stride_pad, generator=g)
    w = torch.randn(n, k, generator=g) / k ** 0.5
    b = torch.randn(n, generator=g) if bias else None
    to = dict(dtype=dtype, device=DEVICE)
    return x.to(**to)[:, :k], w.to(**to), None if b is None else b.to(**to)


def config(spec):
    return None if spec is None else gemm().GemmConfig(*spec)


def reference(x, w, b):
    return F.linear(x.float(), w.float(), None if b is None else b.float())


@pytest.mark.parametrize("m,n,k,spec", CASES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [False, True])
def test_linear_matches_fp32_reference(m, n, k, spec, dtype, bias):
    x, w, b = make(m, n, k, dtype, bias=bias)
    got = gemm()._gemm(x, w, b, n, False, config(spec))
    assert got.dtype == dtype and got.shape == (m, n)
    # one rounding of the fp32 sum: within half an ulp plus the K-order difference
    torch.testing.assert_close(got.float(), reference(x, w, b).to(dtype).float(), rtol=8e-3, atol=2e-3)


@pytest.mark.parametrize("m,n,k,spec", CASES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_silu_mul_matches_unfused_chain(m, n, k, spec, dtype):
    x, w, b = make(m, 2 * n, k, dtype, seed=1)
    got = gemm()._gemm(x, w, b, n, True, config(spec))
    want = silu_mul_torch(reference(x, w, b).to(dtype))
    assert got.shape == (m, n)
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=4e-3)


def test_strided_input_and_public_dispatch():
    x, w, b = make(7, 32, 64, torch.float16, stride_pad=16)
    assert not x.is_contiguous()
    got = gemm()._gemm(x, w, b, 32, False, None)
    torch.testing.assert_close(got.float(), reference(x, w, b).half().float(), rtol=8e-3, atol=2e-3)
    # fp32 and CPU inputs never reach Triton: the public ops equal F.linear exactly there
    xf, wf, bf = (t.float() for t in (x, w, b))
    assert torch.equal(gemm().linear(xf, wf, bf), F.linear(xf, wf, bf))


def test_split_k_is_deterministic():
    x, w, b = make(33, 64, 512, torch.float16, seed=3)
    cfg = gemm().GemmConfig(32, 32, 64, 4)
    first = gemm()._gemm(x, w, b, 64, False, cfg)
    assert torch.equal(first, gemm()._gemm(x, w, b, 64, False, cfg))


def test_picked_configs_cover_decode_shapes():
    """The table's tiles fit each shape: whole M tiles up to 128, K splits that keep >= 512 of
    K each, and at most ~1 CTA per SM of an H100 from the splits."""
    for m in (1, 8, 64, 100, 256):
        for n, k in ((1152, 896), (896, 4864), (9728, 896), (896, 896), (960, 576)):
            c = gemm().pick_config(m, n, k)
            assert c.block_m <= max(16, triton_next_pow2(m)) and c.block_m <= 128
            assert c.split_k == 1 or k // c.split_k >= 512
            tiles = -(-m // c.block_m) * -(-n // c.block_n)
            assert c.split_k == 1 or tiles * c.split_k <= 132


def triton_next_pow2(v):
    return 1 << (v - 1).bit_length()
