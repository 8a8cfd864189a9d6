"""FP8 KV storage (kvcache/kv_quant.py, KVPool): quantization against the format's own error
bound, byte-exact compaction, scales, flags and the device check.

Mutation checks (each fails a test here): dropping the clamp in `quantize` (e5m2 overflow turns
into inf), reading the uint8 bytes without `.view(fp8)` (numeric uint8 -> float), and
`KVPool.bytes` counting the model dtype's bytes.
"""

from __future__ import annotations

import json

import pytest
import torch

from sglang_kvc.kvcache.kv_cache import KVCache, KVPool
from sglang_kvc.kvcache.kv_quant import FP8_DTYPES, check_device, dequantize, load_scales, quantize
from sglang_kvc.server_args import ServerArgs

# Relative error of round-to-nearest with m mantissa bits: 2^-(m+1) for normal values.
REL = {torch.float8_e4m3fn: 2.0 ** -4, torch.float8_e5m2: 2.0 ** -3}
TINY = {torch.float8_e4m3fn: 2.0 ** -6, torch.float8_e5m2: 2.0 ** -14}  # smallest normals


@pytest.mark.parametrize("dtype", list(FP8_DTYPES.values()))
@pytest.mark.parametrize("scale", [1.0, 0.25, 3.0])
def test_round_trip_within_the_mantissa_bound(dtype, scale):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(4096, generator=g) * 4).to(torch.bfloat16)
    s = torch.tensor(scale)
    y = dequantize(quantize(x, s, dtype), s, torch.float32)
    err = (y - x.float()).abs()
    normal = x.float().abs() / scale >= TINY[dtype]
    assert (err[normal] <= REL[dtype] * x.float().abs()[normal] * (1 + 1e-6)).all()
    # below the smallest normal the grid step is fixed: half of it (times the scale) at most
    sub_step = TINY[dtype] * (2.0 ** -3 if dtype == torch.float8_e4m3fn else 2.0 ** -2)
    assert (err[~normal] <= scale * sub_step / 2 * (1 + 1e-6)).all()
    assert err.max() > 0  # it did round


@pytest.mark.parametrize("dtype", list(FP8_DTYPES.values()))
def test_saturates_instead_of_overflowing(dtype):
    top = torch.finfo(dtype).max
    x = torch.tensor([10 * top, -10 * top, 1.0])
    q = quantize(x, torch.tensor(1.0), dtype).float()
    assert q.tolist() == [top, -top, 1.0]


def _pool(dtype, slots=32, layers=2, heads=2, dim=8, scales=None):
    return KVPool(slots, layers, heads, dim, dtype, torch.device("cpu"), compute_dtype=torch.float32,
                  k_scale=scales, v_scale=None if scales is None else scales * 2)


@pytest.mark.parametrize("dtype", list(FP8_DTYPES.values()))
def test_pool_write_read_is_quantize_dequantize(dtype):
    scales = torch.tensor([0.5, 2.0])
    pool = _pool(dtype, scales=scales)
    assert pool.k.dtype == torch.uint8 and pool.bytes == 2 * 2 * 32 * 2 * 8  # 1 byte per element
    g = torch.Generator().manual_seed(1)
    k, v = torch.randn(5, 2, 8, generator=g), torch.randn(5, 2, 8, generator=g)
    slots = torch.tensor([3, 9, 4, 30, 1])
    pool.write(1, slots, k, v)
    rk, rv = pool.read(1, slots)
    ref_k = dequantize(quantize(k, scales[1], dtype), scales[1], torch.float32)
    ref_v = dequantize(quantize(v, 2 * scales[1], dtype), 2 * scales[1], torch.float32)
    assert torch.equal(rk, ref_k) and torch.equal(rv, ref_v)
    assert (rk - k).abs().max() <= REL[dtype] * k.abs().max() * 1.01
    assert torch.equal(pool.keys(slots[None])[1, 0], rk)  # the scoring read agrees
    assert pool.read(0, slots)[0].abs().max() == 0  # other layers untouched


def test_unquantized_pool_is_the_plain_buffers():
    pool = _pool(torch.bfloat16)
    assert pool.k.dtype == torch.bfloat16 and pool.layer_scales(0) is None
    k = torch.randn(3, 2, 8).to(torch.bfloat16)
    slots = torch.tensor([2, 5, 7])
    pool.write(0, slots, k, k)
    ref = torch.zeros(32, 2, 8, dtype=torch.bfloat16).index_copy_(0, slots, k)  # the old store
    assert torch.equal(pool.k[0], ref) and torch.equal(pool.read(0, slots)[0], k)


def test_compaction_moves_fp8_bytes_exactly():
    pool = _pool(torch.float8_e4m3fn, slots=64)
    kv = KVCache(pool, max_requests=4, max_len=32)

    class Seq:
        row = kv_len = None
        peak_kv = 0

    seqs = [Seq(), Seq()]
    for s in seqs:
        kv.attach(s)
    slots = kv.extend(seqs, [10, 10]).view(2, 10)
    g = torch.Generator().manual_seed(2)
    for layer in range(2):
        pool.write(layer, slots.flatten(), torch.randn(20, 2, 8, generator=g), torch.randn(20, 2, 8, generator=g))
    before_k, before_v = pool.k[:, slots].clone(), pool.v[:, slots].clone()  # [L, R, n, H, D]
    keep = torch.stack([torch.randperm(10, generator=g)[:4].sort().values for _ in range(2 * 2 * 2)])
    keep = keep.view(2, 2, 2, 4)  # [R, L, Hkv, k]
    kv.compact(seqs, slots, keep)
    for r in range(2):
        for layer in range(2):
            for h in range(2):
                for j in range(4):
                    src = keep[r, layer, h, j]
                    assert torch.equal(pool.k[layer, slots[r, j], h], before_k[layer, r, src, h])
                    assert torch.equal(pool.v[layer, slots[r, j], h], before_v[layer, r, src, h])


def test_scales_json(tmp_path):
    path = tmp_path / "kv.json"
    path.write_text(json.dumps({"kv_cache": {"dtype": "float8_e4m3fn",
                                             "scaling_factor": {"0": {"0": 0.5, "2": 4.0}}}}))
    assert load_scales(str(path), 3).tolist() == [0.5, 1.0, 4.0]
    assert load_scales(None, 2).tolist() == [1.0, 1.0]
    path.write_text("{}")
    with pytest.raises(ValueError, match="not a KV-scales JSON"):
        load_scales(str(path), 3)
    path.write_text(json.dumps({"kv_cache": {"scaling_factor": {"0": {"0": -1}}}}))
    with pytest.raises(ValueError, match="finite and > 0"):
        load_scales(str(path), 1)


def test_flags():
    assert ServerArgs(model_path="m", kv_cache_dtype="fp8_e5m2").kv_cache_dtype == "fp8_e5m2"
    with pytest.raises(ValueError, match="--kv-cache-dtype must be one of"):
        ServerArgs(model_path="m", kv_cache_dtype="fp8")
    with pytest.raises(ValueError, match="needs --kv-cache-dtype fp8"):
        ServerArgs(model_path="m", quantization_param_path="s.json")


def test_device_check(monkeypatch):
    cuda = torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    with pytest.raises(ValueError, match="capability >= 8.9"):
        check_device(torch.float8_e4m3fn, cuda, "triton")
    check_device(torch.float8_e5m2, cuda, "triton")  # Triton converts e5m2 on any CUDA device
    check_device(torch.float8_e4m3fn, cuda, "torch")  # torch casts work everywhere
    check_device(torch.float8_e4m3fn, torch.device("cpu"), "torch")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    check_device(torch.float8_e4m3fn, cuda, "triton")
