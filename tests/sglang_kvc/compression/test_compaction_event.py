"""One compaction event (issue 68): the batched gather / chunking must keep exactly what scoring
each request's keys on their own keeps, and move exactly those K/V entries.

Reference: every (request, layer, KV head)'s keys read entry by entry from the pool with Python
loops, scored by the policy, and the moved K/V compared with the pre-compaction pool."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from sglang_kvc.compression import CompressionConfig, make_policy
from sglang_kvc.compression.compressor import Compressor
from sglang_kvc.compression.query_ring import QueryRing
from sglang_kvc.compression.trigger import Trigger
from sglang_kvc.kvcache.kv_cache import KVCache, KVPool

R, L, HKV, HQ, D = 5, 3, 2, 4, 16
B, N = 24, 8  # budget, divide length: requests hold 32 slots


@dataclasses.dataclass(eq=False)
class Seq:
    row: int | None = None
    kv_len: int = 0
    prefix_len: int = 0
    peak_kv: int = 0
    num_compressions: int = 0
    tokens_evicted: int = 0
    num_computed: int = 0
    prompt_ids: list = dataclasses.field(default_factory=lambda: [0] * 6)
    output_ids: list = dataclasses.field(default_factory=lambda: [0])
    first_prompt_len: int | None = None
    compress_budget: int | None = None
    compress_stopped: bool = False
    eviction: object = None


def _engine(algo: str, keep_prompt: bool, chunk_elems: int = 1 << 28, seed: int = 0):
    cfg = CompressionConfig(algorithm=algo, budget=B, divide_length=N, window=4, keep_prompt=keep_prompt)
    n = cfg.capacity + (6 if keep_prompt else 0)
    pool = KVPool(R * n + 1, L, HKV, D, torch.float32, torch.device("cpu"))
    kv = KVCache(pool, R, n)
    ring = QueryRing(L, R + 1, cfg.window, HQ, D, torch.float32, torch.device("cpu"))
    g = torch.Generator().manual_seed(seed)
    for buf in (pool.k, pool.v, ring.buf):
        buf.copy_(torch.randn(buf.shape, generator=g))
    half = pool.k.shape[1] // 2  # similar key pairs: R-KV's redundancy threshold is crossed
    pool.k[:, 1:half] += 2 * pool.k[:, half + 1:2 * half]
    seqs = [Seq() for _ in range(R)]
    for s in seqs:
        kv.attach(s)
    kv.allocator.free_slots = kv.allocator.free_slots[torch.randperm(kv.capacity, generator=g)]
    kv.extend(seqs, [n] * R)
    for s in seqs:
        s.num_computed = n
    return Compressor(cfg, kv, ring, Trigger(cfg), chunk_elems=chunk_elems), kv, seqs, n


def _reference(comp: Compressor, kv: KVCache, seqs: list, n: int):
    """Kept positions [R, L, Hkv, P + B] of row[:n] scored request by request from
    entry-by-entry keys, and the K/V each request's row must then hold."""
    pinned = comp.trigger.pinned(seqs[0])
    policy = make_policy(comp.cfg.policy_config())
    out, moved = [], []
    for s in seqs:
        row = kv.req_to_token.table[s.row, :n].tolist()
        keys = torch.stack([torch.stack([torch.stack([kv.pool.k[l, slot, h] for slot in row[pinned:]])
                                         for h in range(HKV)]) for l in range(L)])
        queries = comp.ring.buf[:, s.row].permute(0, 2, 1, 3)[None]
        idx = policy.select(keys[None], queries, B)[0]
        idx = torch.cat([torch.arange(pinned).expand(L, HKV, pinned), idx + pinned], -1)
        out.append(idx)
        moved.append([[(kv.pool.k[l, torch.tensor(row)[idx[l, h]], h].clone(),
                        kv.pool.v[l, torch.tensor(row)[idx[l, h]], h].clone())
                       for h in range(HKV)] for l in range(L)])
    return torch.stack(out), moved


def _held(kv: KVCache, s, l: int, h: int):
    row = kv.req_to_token.table[s.row, :s.kv_len].long()
    return kv.pool.k[l, row, h], kv.pool.v[l, row, h]


@pytest.mark.parametrize("algo", ["rkv", "snapkv", "streamingllm"])
@pytest.mark.parametrize("keep_prompt", [False, True])
def test_event_keeps_and_moves_what_per_request_scoring_keeps(algo, keep_prompt):
    comp, kv, seqs, n = _engine(algo, keep_prompt)
    want, moved = _reference(comp, kv, seqs, n)
    free_before = kv.allocator.num_free
    got = comp.compress(seqs)
    assert torch.equal(got, want)
    pinned = comp.trigger.pinned(seqs[0])
    for i, s in enumerate(seqs):
        assert s.kv_len == pinned + B
        for l in range(L):
            for h in range(HKV):
                k, v = _held(kv, s, l, h)
                assert torch.equal(k, moved[i][l][h][0]) and torch.equal(v, moved[i][l][h][1])
    assert kv.allocator.num_free == free_before + R * (n - pinned - B)


@pytest.mark.parametrize("algo", ["rkv", "streamingllm"])
def test_chunked_event_keeps_the_same_as_one_chunk(algo):
    """after_step splits a round into memory-sized chunks; the split changes nothing kept."""
    whole, kv1, seqs1, n = _engine(algo, True)
    per_req = whole.chunk_elems // whole.chunk_requests(n - whole.trigger.pinned(seqs1[0]))
    chunked, kv2, seqs2, _ = _engine(algo, True, chunk_elems=2 * per_req)
    calls = []
    compress = chunked.compress
    chunked.compress = lambda group: calls.append(len(group)) or compress(group)
    whole.after_step(seqs1, is_prefill=False)
    chunked.after_step(seqs2, is_prefill=False)
    assert calls == [2, 2, 1]
    for a, b in zip(seqs1, seqs2):
        assert a.kv_len == b.kv_len == 6 + B
        for l in range(L):
            for h in range(HKV):
                assert all(torch.equal(x, y) for x, y in zip(_held(kv1, a, l, h), _held(kv2, b, l, h)))


def test_rkv_chunks_count_the_similarity_matrix_only_where_it_is_built():
    """The Triton pass (CUDA, power-of-two head dim) keeps no m x m matrix: counting one cut a
    256-request round of the 0.5B model into 24 chunks."""
    policy = make_policy(CompressionConfig(algorithm="rkv"))
    assert policy.scratch_elems(632, 64, torch.device("cpu")) == 632 * 632
    assert policy.scratch_elems(632, 48, torch.device("cuda")) == 632 * 632  # torch fallback
    assert policy.scratch_elems(632, 64, torch.device("cuda")) == 0


def test_a_round_of_the_05b_model_splits_into_8_chunks_on_cuda_not_24():
    """The chunk sizing the H200 profile hit: 256 requests holding 640 evictable slots, 24
    layers, 2 KV heads, 14 query heads, head dim 64 (sizes only: no CUDA needed)."""
    cfg = CompressionConfig(algorithm="rkv", budget=512, divide_length=128)
    pool = SimpleNamespace(shape=(24, 1, 2, 64), device=torch.device("cpu"))
    ring = SimpleNamespace(buf=torch.empty(24, 0, 8, 14, 64))
    comp = Compressor(cfg, SimpleNamespace(pool=pool), ring, Trigger(cfg))
    chunks = lambda device: -(-256 // comp.chunk_requests(640, torch.device(device)))
    assert (chunks("cuda"), chunks("cpu")) == (8, 26)  # cpu: the torch path's m x m matrix


def test_pool_keys_read_the_scoring_layout():
    comp, kv, seqs, n = _engine("rkv", False)
    slots = kv.req_to_token.table[[s.row for s in seqs], :n].long()
    keys = kv.pool.keys(slots)
    assert keys.is_contiguous() and keys.shape == (R, L, HKV, n, D)
    assert torch.equal(keys, kv.pool.k[:, slots].permute(1, 0, 3, 2, 4))


def _importance_before_issue_68(keys, queries):
    """window_importance as it was written before the copies were cut (bit-for-bit target)."""
    *lead, hkv, m, d = keys.shape
    hq, w = queries.shape[-3], queries.shape[-2]
    q = queries.float().reshape(*lead, hkv, (hq // hkv) * w, d)
    logits = q @ keys.float().transpose(-1, -2) * d ** -0.5
    probs = logits.softmax(dim=-1).reshape(*lead, hkv, hq // hkv, w, m)
    return probs.mean(dim=-2).amax(dim=-2)


@pytest.mark.parametrize("d", [16, 24])  # power-of-two and not: the scale is applied as before
def test_window_importance_is_bit_identical_to_before(d):
    from sglang_kvc.compression.scoring import window_importance

    g = torch.Generator().manual_seed(d)
    pool_keys = torch.randn(L, R, 40, HKV, d, generator=g).bfloat16()
    keys = pool_keys.permute(1, 0, 3, 2, 4)[..., :32, :]  # the old gather's strided view
    ring = torch.randn(L, R, 4, HQ, d, generator=g).bfloat16()
    queries = ring.permute(1, 0, 3, 2, 4)  # QueryRing.gather's view
    want = _importance_before_issue_68(keys, queries)
    assert torch.equal(window_importance(keys.contiguous(), queries), want)
    assert torch.equal(window_importance(keys, queries), want)
