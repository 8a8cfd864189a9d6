"""The paged Triton extend kernel (triton_extend.py) against a float64 dense reference, and the
Triton backend's prefill with held KV against the torch backend's.

Runs on CUDA (`gpu` marker), or on CPU under the Triton interpreter (TRITON_INTERPRET=1 with
triton importable; fp32 only, smaller shapes); skipped otherwise.
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

HAS_TRITON = importlib.util.find_spec("triton") is not None
INTERPRET = HAS_TRITON and os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.bfloat16, torch.float32] if DEVICE == "cuda" else [torch.float32]
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not (torch.cuda.is_available() or INTERPRET), reason="needs CUDA or TRITON_INTERPRET=1")]


def _reference(q, k_pool, v_pool, table, req, scale):
    """Per request, float64: new query i over row[:held + i + 1] of the pool."""
    out = {}
    hq, hkv = q.shape[1], k_pool.shape[1]
    for row, first, n, held in req.t().tolist():
        slots = table[row, :held + n].long()
        k = k_pool[slots].double().repeat_interleave(hq // hkv, dim=1)  # [L, Hq, D]
        v = v_pool[slots].double().repeat_interleave(hq // hkv, dim=1)
        qq = q[first:first + n].double()  # [n, Hq, D]
        s = torch.einsum("nhd,lhd->hnl", qq, k) * scale
        visible = torch.arange(held + n)[None, :] <= (held + torch.arange(n))[:, None]
        s = s.masked_fill(~visible.to(s.device)[None], float("-inf"))
        out[first] = torch.einsum("hnl,lhd->nhd", s.softmax(-1), v)
    return out


def _layout(held, new, hq, hkv, d, dtype, num_slots, gen):
    """A pool holding each request's row (held slots then its new tokens' slots, scattered over
    the pool), the flat queries, and the kernel's [4, E] request block (rows shuffled)."""
    dev = DEVICE
    k_pool = torch.randn(num_slots, hkv, d, generator=gen).to(dev, dtype)
    v_pool = torch.randn(num_slots, hkv, d, generator=gen).to(dev, dtype)
    E, T = len(held), sum(new)
    table = torch.zeros(E + 3, max(h + n for h, n in zip(held, new)) + 5, dtype=torch.int32)
    rows = (torch.randperm(E + 2, generator=gen)[:E] + 1).tolist()
    perm = (torch.randperm(num_slots - 1, generator=gen) + 1).tolist()
    firsts, at = [], 0
    for r, h, n in zip(rows, held, new):
        table[r, :h + n] = torch.tensor(perm[:h + n], dtype=torch.int32)
        perm = perm[h + n:]
        firsts.append(at)
        at += n
    req = torch.tensor([rows, firsts, new, held], dtype=torch.int32)
    q = torch.randn(T, hq, d, generator=gen).to(dev, dtype)
    return q, k_pool, v_pool, table.to(dev), req.to(dev)


def _work(new, block_m=32, pad=0):
    """The work list of step_io.extend_work, plus `pad` items past every request (a captured
    step's padding), as the kernel's [2, W] int32."""
    from sglang_kvc.engine.step_io import extend_work

    items = extend_work(new, block_m) + [(0, 1 << 30)] * pad
    return torch.tensor(items, dtype=torch.int32).t().contiguous().to(DEVICE)


def test_extend_work_lists_every_block_once():
    from sglang_kvc.engine.step_io import extend_work

    assert extend_work([3, 70, 32, 33], 32) == [(0, 0), (1, 0), (1, 32), (1, 64), (2, 0), (3, 0), (3, 32)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hq,hkv,d", [(9, 3, 64), (14, 2, 64), (4, 1, 16), (16, 8, 128)])
def test_paged_extend_matches_dense(dtype, hq, hkv, d):
    """Held 0 (a plain causal prefill), one new token, new runs past one query block (32) and
    held rows past one key block (64), GQA groups of 1-7 (3: not a power of two); three padding
    work items that must write nothing."""
    from sglang_kvc.layers.triton_extend import paged_extend_attention

    gen = torch.Generator().manual_seed(0)
    held, new = [0, 5, 70, 1, 130], [7, 1, 40, 33, 3]
    q, k_pool, v_pool, table, req = _layout(held, new, hq, hkv, d, dtype, 1024, gen)
    scale = d ** -0.5
    out = paged_extend_attention(q, k_pool, v_pool, table, req, _work(new, pad=3), 32, scale)
    want = _reference(q, k_pool, v_pool, table.cpu(), req.cpu(), scale)
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-5
    for first, ref in want.items():
        got = out[first:first + ref.shape[0]].double().cpu()
        torch.testing.assert_close(got, ref.cpu(), rtol=tol, atol=tol)


def test_paged_extend_writes_only_its_requests_tokens():
    """With `out` given (the causal pass's output of a mixed prefill), tokens of requests not in
    the block keep their values; blocks of 16 new tokens; the request block and the work list
    as row views of larger buffers, with padding items."""
    from sglang_kvc.layers.triton_extend import paged_extend_attention

    gen = torch.Generator().manual_seed(1)
    held, new = [3, 9], [4, 6]
    q, k_pool, v_pool, table, req = _layout(held, new, 4, 2, 16, torch.float32, 256, gen)
    # a third request's 5 tokens sit between them in the flat batch: shift the second's first
    q = torch.cat([q[:4], torch.randn(5, 4, 16, generator=gen).to(DEVICE), q[4:]])
    req[1, 1] += 5
    sentinel = torch.full_like(q, 7.0)
    # as a captured step passes them: row views of larger static buffers
    req_buf = torch.full((4, 9), -5, dtype=torch.int32, device=DEVICE)
    req_buf[:, :2] = req
    work = _work(new, 16, pad=2)
    work_buf = torch.full((2, work.shape[1] + 6), -5, dtype=torch.int32, device=DEVICE)
    work_buf[:, :work.shape[1]] = work
    out = paged_extend_attention(q, k_pool, v_pool, table, req_buf[:, :3], work_buf[:, :work.shape[1]],
                                 16, 0.25, out=sentinel.clone())
    assert torch.equal(out[4:9], sentinel[4:9])
    want = _reference(q, k_pool, v_pool, table.cpu(), req.cpu(), 0.25)
    for first, ref in want.items():
        torch.testing.assert_close(out[first:first + ref.shape[0]].double().cpu(), ref.cpu(),
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("every", [True, False])
def test_triton_backend_prefill_with_held_kv_equals_torch_backend(every):
    """The engine's path: TritonAttention.forward (store, then the kernel for requests holding
    KV) against TorchAttention.forward (gather + masked SDPA) on the same pool and metadata."""
    from sglang_kvc.engine.step_io import extend_layout, prefill_layout
    from sglang_kvc.kvcache.kv_cache import KVCache, KVPool
    from sglang_kvc.layers.attention import AttentionMetadata, TorchAttention, TritonAttention

    gen = torch.Generator().manual_seed(2)
    hq, hkv, d = 6, 2, 32
    counts, held = [5, 3, 40], ([2, 6, 70] if every else [0, 6, 70])
    outs = []
    for backend in (TorchAttention, TritonAttention):
        g = torch.Generator().manual_seed(3)
        pool = KVPool(512, 1, hkv, d, torch.float32, torch.device(DEVICE))
        kv = KVCache(pool, max_requests=4, max_len=128)
        rows = [1, 2, 3]
        for r, p in zip(rows, held):
            slots = kv.allocator.alloc(p)
            kv.req_to_token.table[r, :p] = slots.int()
            pool.write(0, slots, *(torch.randn(p, hkv, d, generator=g).to(DEVICE) for _ in range(2)))
        T = sum(counts)
        q, k, v = (torch.randn(T, h, d, generator=g).to(DEVICE) for h in (hq, hkv, hkv))
        out_slots = kv.allocator.alloc(T)
        starts = [0, 5, 8]
        for r, p, st, n in zip(rows, held, starts, counts):
            kv.req_to_token.table[r, p:p + n] = out_slots[st:st + n].int()
        _, pad_index, pad_rows = prefill_layout(counts, held, DEVICE)
        meta = AttentionMetadata(True, out_slots, pad_index=pad_index, pad_rows=pad_rows,
                                 extend=extend_layout(counts, held, rows, DEVICE))
        assert meta.extend.every == every
        attn = backend(kv, hq, d)
        attn.meta = meta
        outs.append(attn.forward(0, q, k, v))
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="FP8 kernels need CUDA")
def test_gpu_fp8_pool_extend_equals_torch_dequantized_read():
    """An FP8 pool: the kernel reads the bytes and scales in-kernel; the torch path dequantizes
    through KVPool.read. Same attention up to bf16 rounding of the dequantized values."""
    from sglang_kvc.engine.step_io import extend_layout
    from sglang_kvc.kvcache.kv_cache import KVCache, KVPool
    from sglang_kvc.layers.attention import AttentionMetadata, TorchAttention, TritonAttention

    g = torch.Generator().manual_seed(4)
    hq, hkv, d, counts, held = 14, 2, 64, [9, 30], [17, 80]
    pool = KVPool(512, 1, hkv, d, torch.float8_e4m3fn, torch.device("cuda"), compute_dtype=torch.bfloat16,
                  k_scale=torch.tensor([0.05]), v_scale=torch.tensor([0.02]))
    kv = KVCache(pool, max_requests=3, max_len=128)
    for r, (p, n) in enumerate(zip(held, counts), start=1):
        slots = kv.allocator.alloc(p + n)
        kv.req_to_token.table[r, :p + n] = slots.int()
        pool.write(0, slots, *(torch.randn(p + n, hkv, d, generator=g).cuda().bfloat16() for _ in range(2)))
    q = torch.randn(sum(counts), hq, d, generator=g).cuda().bfloat16()
    meta = AttentionMetadata(True, torch.zeros(0, dtype=torch.int64, device="cuda"),
                             extend=extend_layout(counts, held, [1, 2], "cuda"))
    outs = []
    for backend in (TorchAttention, TritonAttention):
        attn = backend(kv, hq, d)
        attn.meta = meta
        outs.append(attn.attend_held(0, q, meta.extend, None).float())
    torch.testing.assert_close(outs[1], outs[0], rtol=3e-2, atol=3e-2)
