"""Fused ops (fused_ops.py) against their torch references and against the unfused formulas that
model.py used before fusion (copied below as independent oracles).

Three tiers:
- CPU (always): the torch references equal the unfused formulas bit for bit; the in-place and
  store variants behave like TorchAttention.store.
- Triton interpreter (CPU; only with triton importable and TRITON_INTERPRET=1): the kernels in
  fp32 and fp16. The interpreter truncates fp32->bf16 casts (real GPUs round to nearest even),
  so bf16 is left to the GPU tier; numpy's fp16 casts round like CUDA's, so fp16 checks the
  rounding logic.
- GPU (`gpu` marker, skipped without CUDA): the kernels in fp32/bf16/fp16, strided q/k views as
  the model makes them, CUDA-graph replay, and slot offsets past 2^31 elements.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from sglang_kvc.layers import fused_ops as fo

NORM_SHAPES = [(1, 576), (7, 896), (300, 896), (300, 576)]
ROPE_HEADS = [(9, 3, 64), (14, 2, 64), (14, 2, 128)]  # (Hq, Hkv, D)
TOKENS = [1, 7, 300]
EPS = 1e-6

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _interpreting() -> bool:
    return fo.triton is not None and os.environ.get("TRITON_INTERPRET") == "1"


interpreter = pytest.mark.skipif(not _interpreting(), reason="needs triton and TRITON_INTERPRET=1")


# ---------------------------------------------------------------- oracles: model.py before fusion

def unfused_rmsnorm(x, weight, eps):
    dtype = x.dtype
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def unfused_rope(positions, q, k, cos_table, sin_table):
    cos = cos_table[positions].to(q.dtype)[:, None, :]
    sin = sin_table[positions].to(q.dtype)[:, None, :]

    def rotate(x):
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin

    return rotate(q), rotate(k)


def unfused_silu_mul(gate_up, inter):
    gate, up = gate_up.split(inter, dim=-1)
    return F.silu(gate) * up


# ---------------------------------------------------------------- helpers

def ulps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|a - b| in units in the last place (distance of the bit patterns; same-sign values)."""
    assert a.dtype == b.dtype
    as_int = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}
    it = as_int[a.dtype]
    return (a.contiguous().view(it).long() - b.contiguous().view(it).long()).abs()


def assert_norm_close(got, ref):
    if got.dtype == torch.float32:
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
        return
    # The kernel sums the fp32 squares in another order than torch's reduction, so a normed value
    # sitting on a rounding boundary of the 16-bit dtype may round the other way: 1 ulp before
    # the weight multiply, which the multiply can stretch to 2 ulp. Rare: allow 0.5% of elements.
    d = ulps(got, ref)
    assert d.max() <= 2, d.max()
    assert (d > 0).float().mean() <= 5e-3, (d > 0).float().mean()


def assert_elementwise_close(got, ref):
    """silu*mul: same fp32 formula as torch (x / (1 + exp(-x)), IEEE division; on CUDA the same
    expf). Where the exps differ in the last fp32 bit (numpy's in the interpreter vs torch's CPU
    one), silu may round 1 ulp apart in the 16-bit dtype, which the multiply by up can stretch to
    2 ulp; rare."""
    if got.dtype == torch.float32:
        torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-6)
        return
    d = ulps(got, ref)
    assert d.max() <= 2, d.max()
    assert (d > 0).float().mean() <= 1e-3, (d > 0).float().mean()


def rope_tables(max_pos: int, d: int, device):
    # Same construction as model.Rotary (theta 1e6, scale 1).
    inv_freq = 1.0 / (1e6 ** (torch.arange(0, d, 2, dtype=torch.float32, device=device) / d))
    freqs = torch.arange(max_pos, dtype=torch.float32, device=device)[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def qkv_views(T, hq, hkv, d, dtype, device, seed=0):
    """Strided q, k, v views of one qkv matmul output, as model.Attention makes them."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    qkv = torch.randn(T, (hq + 2 * hkv) * d, generator=g).to(dtype=dtype, device=device) * 3
    q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
    return q.reshape(T, hq, d), k.reshape(T, hkv, d), v.reshape(T, hkv, d)


def norm_inputs(T, n, dtype, device, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    x, r = (torch.randn(T, n, generator=g) * 4 for _ in range(2))
    w = torch.rand(n, generator=g) * 2 - 0.5
    return x.to(device, dtype), r.to(device, dtype), w.to(device, dtype)


# ---------------------------------------------------------------- CPU: references == old formulas

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T,n", NORM_SHAPES)
def test_norm_references_match_unfused(T, n, dtype):
    x, r, w = norm_inputs(T, n, dtype, "cpu")
    assert torch.equal(fo.rmsnorm(x, w, EPS), unfused_rmsnorm(x, w, EPS))
    normed, res = fo.add_rmsnorm(x, r, w, EPS)
    old = r + x  # model.py before: x = x + block(...)
    assert torch.equal(res, old) and torch.equal(normed, unfused_rmsnorm(old, w, EPS))


@pytest.mark.parametrize("table_dtype", ["fp32", "model"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hq,hkv,d", ROPE_HEADS)
@pytest.mark.parametrize("T", TOKENS)
def test_rope_references_match_unfused(T, hq, hkv, d, dtype, table_dtype):
    cos, sin = rope_tables(4096, d, "cpu")
    if table_dtype == "model":  # the engine's tables after CausalLM(...).to(dtype)
        cos, sin = cos.to(dtype), sin.to(dtype)
    pos = torch.randint(0, 4096, (T,))
    q, k, v = qkv_views(T, hq, hkv, d, dtype, "cpu")
    rq, rk = unfused_rope(pos, q, k, cos, sin)
    k_cache, v_cache = (torch.zeros(T + 5, hkv, d, dtype=dtype) for _ in range(2))
    slots = torch.randperm(T + 5)[:T]
    q2, k2, v2 = (t.clone() for t in (q, k, v))
    fo.rope_(q, k, pos, cos, sin)
    assert torch.equal(q, rq) and torch.equal(k, rk)
    q_out = torch.empty(T, hq, d, dtype=dtype)
    assert fo.rope_store_(q2, k2, v2, pos, cos, sin, k_cache, v_cache, slots, q_out=q_out) is q_out
    assert torch.equal(q_out, rq) and torch.equal(k2, rk)
    assert torch.equal(k_cache[slots], rk) and torch.equal(v_cache[slots], v2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T", TOKENS)
def test_silu_mul_reference_matches_unfused(T, dtype):
    gu = torch.randn(T, 2 * 608).to(dtype) * 4
    assert torch.equal(fo.silu_mul(gu), unfused_silu_mul(gu, 608))


# ---------------------------------------------------------------- shared kernel checks

def check_norms(T, n, dtype, device, call_kernels):
    """call_kernels: True = the Triton launchers directly (interpreter), else the public ops."""
    x, r, w = norm_inputs(T, n, dtype, device)
    if call_kernels:
        normed, res = fo._norm_triton(x, r, w, EPS)
        plain = fo._norm_triton(x, None, w, EPS)[0]
    else:
        normed, res = fo.add_rmsnorm(x, r, w, EPS)
        plain = fo.rmsnorm(x, w, EPS)
    assert torch.equal(res, r + x)  # the residual add rounds exactly like torch's
    assert_norm_close(normed, unfused_rmsnorm(r + x, w, EPS))
    assert_norm_close(plain, unfused_rmsnorm(x, w, EPS))
    ref_normed, _ = fo.add_rmsnorm_torch(x, r, w, EPS)
    assert_norm_close(normed, ref_normed)


def check_qk_norm(dtype, device, call_kernels):
    """Per-head RMSNorm (Qwen3 q_norm) over a strided [T, H, D] view."""
    q, _, _ = qkv_views(7, 14, 2, 64, dtype, device)
    w = (torch.rand(64) + 0.5).to(device, dtype)
    got = fo._norm_triton(q, None, w, EPS)[0] if call_kernels else fo.rmsnorm(q, w, EPS)
    assert got.shape == q.shape
    assert_norm_close(got, unfused_rmsnorm(q, w, EPS))


def check_rope(T, hq, hkv, d, dtype, device, call_kernels, table_dtype=torch.float32):
    # Tables in fp32, or in the model dtype as the engine has them after CausalLM(...).to(dtype).
    cos, sin = (t.to(table_dtype) for t in rope_tables(4096, d, device))
    pos = torch.randint(0, 4096, (T,), device=device)
    q, k, v = qkv_views(T, hq, hkv, d, dtype, device)
    rq, rk = unfused_rope(pos, q, k, cos, sin)
    if T > 1:
        assert q.stride(0) != hq * d  # really strided, as the model passes them
    num_slots = T + 11
    k_cache, v_cache = (torch.zeros(num_slots, hkv, d, dtype=dtype, device=device) for _ in range(2))
    slots = (torch.randperm(num_slots - 1) + 1)[:T].to(device)
    q2, k2, v2 = (t.clone() for t in (q, k, v))
    q_out = torch.empty(T, hq, d, dtype=dtype, device=device)
    if call_kernels:
        fo._rope_triton(q, k, pos, cos, sin, q_out=q)
        fo._rope_triton(q2, k2, pos, cos, sin, q_out, (v2, k_cache, v_cache, slots))
    else:
        fo.rope_(q, k, pos, cos, sin)
        fo.rope_store_(q2, k2, v2, pos, cos, sin, k_cache, v_cache, slots, q_out=q_out)
    # Exact: products and sums rounded like torch, no FMA contraction.
    assert torch.equal(q, rq) and torch.equal(k, rk)
    assert torch.equal(q_out, rq) and torch.equal(k2, rk)
    assert torch.equal(k_cache[slots], rk) and torch.equal(v_cache[slots], v2)
    untouched = torch.ones(num_slots, dtype=torch.bool, device=device)
    untouched[slots] = False
    assert not k_cache[untouched].any() and not v_cache[untouched].any()


def check_silu_mul(T, inter, dtype, device, call_kernels):
    g = torch.Generator(device="cpu").manual_seed(T)
    gu = (torch.randn(T, 2 * inter, generator=g) * 4).to(device, dtype)
    got = fo._silu_mul_triton(gu) if call_kernels else fo.silu_mul(gu)
    assert_elementwise_close(got, unfused_silu_mul(gu, inter))


# ---------------------------------------------------------------- Triton interpreter (CPU)

@interpreter
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("T,n", NORM_SHAPES)
def test_interpreter_norms(T, n, dtype):
    check_norms(T, n, dtype, "cpu", call_kernels=True)


@interpreter
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_interpreter_qk_norm(dtype):
    check_qk_norm(dtype, "cpu", call_kernels=True)


@interpreter
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("hq,hkv,d", ROPE_HEADS)
@pytest.mark.parametrize("T", TOKENS)
def test_interpreter_rope(T, hq, hkv, d, dtype):
    check_rope(T, hq, hkv, d, dtype, "cpu", call_kernels=True)


@interpreter
def test_interpreter_rope_tables_in_model_dtype():
    check_rope(7, 14, 2, 64, torch.float16, "cpu", call_kernels=True, table_dtype=torch.float16)


@interpreter
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("T,inter", [(1, 4864), (7, 608), (300, 100)])
def test_interpreter_silu_mul(T, inter, dtype):
    # fp32 tolerance covers numpy's exp vs torch's CPU exp; fp16 rounds the same values.
    check_silu_mul(T, inter, dtype, "cpu", call_kernels=True)


# ---------------------------------------------------------------- GPU

GPU_DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", GPU_DTYPES)
@pytest.mark.parametrize("T,n", NORM_SHAPES + [(65537, 896), (3, 3584)])
def test_gpu_norms(T, n, dtype):
    check_norms(T, n, dtype, "cuda", call_kernels=False)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", GPU_DTYPES)
def test_gpu_qk_norm(dtype):
    check_qk_norm(dtype, "cuda", call_kernels=False)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", GPU_DTYPES)
@pytest.mark.parametrize("hq,hkv,d", ROPE_HEADS)
@pytest.mark.parametrize("T", TOKENS)
def test_gpu_rope(T, hq, hkv, d, dtype):
    check_rope(T, hq, hkv, d, dtype, "cuda", call_kernels=False)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_rope_tables_in_model_dtype(dtype):
    check_rope(300, 14, 2, 64, dtype, "cuda", call_kernels=False, table_dtype=dtype)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", GPU_DTYPES)
@pytest.mark.parametrize("T,inter", [(1, 4864), (7, 608), (300, 4864), (256, 100)])
def test_gpu_silu_mul(T, inter, dtype):
    check_silu_mul(T, inter, dtype, "cuda", call_kernels=False)


@pytest.mark.gpu
@needs_cuda
def test_gpu_ops_replay_in_cuda_graph():
    """Captured once, replayed on new inputs: no host syncs, nothing shaped by tensor values."""
    dev, dt, T, hq, hkv, d, n = "cuda", torch.bfloat16, 16, 14, 2, 64, 896
    cos, sin = rope_tables(1024, d, dev)
    x, r, w = norm_inputs(T, n, dt, dev)
    qkv = torch.zeros(T, (hq + 2 * hkv) * d, dtype=dt, device=dev)
    pos = torch.zeros(T, dtype=torch.int64, device=dev)
    slots = torch.zeros(T, dtype=torch.int64, device=dev)
    k_cache, v_cache = (torch.zeros(64, hkv, d, dtype=dt, device=dev) for _ in range(2))

    def step():
        q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
        q, k, v = q.view(T, hq, d), k.view(T, hkv, d), v.view(T, hkv, d)
        q_out = torch.empty(T, hq, d, dtype=dt, device=dev)
        fo.rope_store_(q, k, v, pos, cos, sin, k_cache, v_cache, slots, q_out=q_out)
        normed, res = fo.add_rmsnorm(x, r, w, EPS)
        return q_out, k, normed, res, fo.silu_mul(qkv[:, :2 * 256])

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()  # compile outside capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = step()

    q0, k0, v0 = qkv_views(T, hq, hkv, d, dt, dev, seed=5)
    qkv.copy_(torch.cat([q0.reshape(T, -1), k0.reshape(T, -1), v0.reshape(T, -1)], dim=-1))
    gu_ref = qkv[:, :2 * 256].clone()
    pos.copy_(torch.randint(0, 1024, (T,), device=dev))
    slots.copy_(torch.randperm(63, device=dev)[:T] + 1)
    x.normal_()
    graph.replay()
    torch.cuda.synchronize()
    q_out, k, normed, res, act = outs
    rq, rk = unfused_rope(pos, q0, k0, cos, sin)
    assert torch.equal(q_out, rq) and torch.equal(k, rk) and torch.equal(k_cache[slots], rk)
    assert torch.equal(v_cache[slots], v0)
    assert torch.equal(res, r + x)
    assert_norm_close(normed, unfused_rmsnorm(r + x, w, EPS))
    assert_elementwise_close(act, unfused_silu_mul(gu_ref, 256))


@pytest.mark.gpu
@needs_cuda
def test_gpu_store_past_2_31_elements():
    """Slot offsets are int64: a layer's pool can hold more than 2^31 elements."""
    dev, dt, hkv, d = "cuda", torch.bfloat16, 1, 64
    num_slots = (1 << 31) // (hkv * d) + 1024
    try:
        k_cache = torch.empty(num_slots, hkv, d, dtype=dt, device=dev)
        v_cache = torch.empty(num_slots, hkv, d, dtype=dt, device=dev)
    except torch.OutOfMemoryError:
        pytest.skip("not enough GPU memory for a 2^31-element pool")
    T = 4
    cos, sin = rope_tables(64, d, dev)
    pos = torch.arange(T, device=dev)
    slots = torch.tensor([1, num_slots // 2, num_slots - 2, num_slots - 1], device=dev)
    q, k, v = qkv_views(T, 2, hkv, d, dt, dev)
    rq, rk = unfused_rope(pos, q, k, cos, sin)
    fo.rope_store_(q, k, v, pos, cos, sin, k_cache, v_cache, slots)
    assert torch.equal(q, rq) and torch.equal(k_cache[slots], rk) and torch.equal(v_cache[slots], v)



def _counter_cases(device):
    g = torch.Generator().manual_seed(0)
    seeds = torch.cat([torch.randint(0, 2 ** 32, (997,), generator=g), torch.tensor([0, 2 ** 32 - 1])])
    steps = torch.cat([torch.randint(0, 1 << 20, (997,), generator=g), torch.tensor([0, (1 << 20) - 1])])
    return seeds.to(device), steps.to(device)


def _counter_torch(seeds, steps):
    m = 0xFFFFFFFF

    def mix(x):
        x = x ^ (x >> 16)
        x = (x * 0x7FEB352D) & m
        x = x ^ (x >> 15)
        x = (x * 0x5BD1E995) & m
        return x ^ (x >> 16)

    return (mix(mix(seeds & m) ^ ((steps * 0x9E3779B9) & m)).double() + 0.5) / 2.0 ** 32


@interpreter
def test_interpreter_counter_uniform():
    seeds, steps = _counter_cases("cpu")
    assert torch.equal(fo._counter_uniform_triton(seeds, steps), _counter_torch(seeds, steps))


@needs_cuda
@pytest.mark.gpu
def test_gpu_counter_uniform_bit_equal_to_cpu():
    """The sampler's noise must not depend on the device: same seeds and steps, same doubles."""
    seeds, steps = _counter_cases("cuda")
    got = fo.counter_uniform(seeds, steps)
    assert got is not None and torch.equal(got.cpu(), _counter_torch(seeds.cpu(), steps.cpu()))


# ---------------------------------------------------------------- greedy argmax

def argmax_cases(device):
    """Rows with ties (the first index must win, also across 8192-wide chunks), a row of -inf
    but one entry, an all -inf row, and a vocabulary that is no multiple of the block."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 20_001, generator=g)
    x[1, [5, 9000, 17000]] = 50.0  # a tie across chunks
    x[2, [100, 101]] = 50.0  # a tie inside one block
    x[3] = float("-inf")
    x[3, 19_999] = -3.0
    x[4] = float("-inf")
    x[5, 20_000] = 60.0  # the very last column
    return x.to(device)


def check_argmax(device, dtype):
    x = argmax_cases(device).to(dtype)
    got = fo._row_argmax_triton(x)
    assert got.dtype == torch.int64
    assert torch.equal(got.cpu(), x.float().cpu().argmax(dim=-1))
    wide = torch.randn(3, 151_936, device=device).to(dtype)[:, ::2]  # strided: copied dense
    assert torch.equal(fo._row_argmax_triton(wide).cpu(), wide.float().cpu().argmax(dim=-1))


@interpreter
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_interpreter_row_argmax(dtype):
    check_argmax("cpu", dtype)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_gpu_row_argmax(dtype):
    check_argmax("cuda", dtype)


def test_row_argmax_cpu_is_torch():
    x = argmax_cases("cpu")
    assert torch.equal(fo.row_argmax(x), x.argmax(dim=-1))
