"""Compression policies, compaction and the query ring against dense references written here.

The references loop over (request, layer, KV head) with plain per-token arithmetic, so they share
no code path with the batched policies. Selection under ties (max pooling repeats values) is
compared as the multiset of reference scores of the kept tokens; without ties, as index sets.
"""

from __future__ import annotations

import math

import pytest
import torch

from sglang_kvc.compression import (CompressionConfig, RKVPolicy, SnapKVPolicy,
                                    StreamingLLMPolicy, make_policy)
from sglang_kvc.compression.query_ring import QueryRing
from sglang_kvc.kvcache.kv_cache import KVCache, KVPool


# ---------------------------------------------------------------- dense references

def ref_importance(K, Qg, w):
    """K [n, D] one KV head; Qg [G, w, D] its query group -> [n - w]."""
    n, d = K.shape
    m = n - w
    best = [-math.inf] * m
    for q_head in Qg:
        acc = [0.0] * m
        for q in q_head:
            logits = [float(q @ K[j]) / math.sqrt(d) for j in range(m)]
            mx = max(logits)
            e = [math.exp(x - mx) for x in logits]
            z = sum(e)
            for j in range(m):
                acc[j] += e[j] / z / w
        best = [max(a, b) for a, b in zip(best, acc)]
    return best


def ref_pool(a, kernel, kind):
    r = kernel // 2
    out = []
    for j in range(len(a)):
        win = a[max(0, j - r):min(len(a), j + r + 1)]
        out.append(max(win) if kind == "max" else sum(win) / kernel)
    return out


def ref_redundancy(K, threshold):
    m = K.shape[0]
    Kn = [K[j] / K[j].norm() for j in range(m)]
    S = [[0.0 if i == j else float(Kn[i] @ Kn[j]) for j in range(m)] for i in range(m)]
    for i in range(m):
        similar = [j for j in range(m) if S[i][j] > threshold]
        if similar:
            S[i][max(similar)] = 0.0
    col = [sum(S[i][j] for i in range(m)) / m for j in range(m)]
    mx = max(col)
    e = [math.exp(c - mx) for c in col]
    return [x / sum(e) for x in e]


def ref_scores(algo, K, Qg, cfg):
    """Score of each non-window token for one (request, layer, KV head)."""
    n = K.shape[0]
    m = n - cfg.window
    if algo == "streamingllm":
        return [math.inf if j < cfg.num_sink else float(j) for j in range(m)]
    imp = ref_pool(ref_importance(K.double(), Qg.double(), cfg.window), cfg.kernel_size, cfg.pooling)
    if algo == "snapkv":
        return imp
    red = ref_redundancy(K[:m].double(), cfg.sim_threshold)
    lam = cfg.mix_lambda
    return [lam * a - (1 - lam) * s for a, s in zip(imp, red)]


def ref_select(algo, keys, queries, keep, cfg):
    """keys [R, L, Hkv, n, D], queries [R, L, Hq, w, D] -> (scores [R][L][H][m], kept sets)."""
    R, L, H, n, _ = keys.shape
    G = queries.shape[2] // H
    scores = [[[ref_scores(algo, keys[r, l, h], queries[r, l, h * G:(h + 1) * G], cfg)
                for h in range(H)] for l in range(L)] for r in range(R)]
    kept = {}
    m = n - cfg.window
    for r in range(R):
        for l in range(L):
            for h in range(H):
                if cfg.mode == "head":
                    s = scores[r][l][h]
                elif cfg.mode == "layer":
                    s = [sum(scores[r][l][hh][j] for hh in range(H)) for j in range(m)]
                else:  # shared: layer 0's head sum decides everywhere
                    s = [sum(scores[r][0][hh][j] for hh in range(H)) for j in range(m)]
                order = sorted(range(m), key=lambda j: -s[j])
                kept[r, l, h] = (sorted(order[:keep - cfg.window]) + list(range(m, n)), s)
    return kept


def random_case(R=2, L=3, H=2, G=3, n=40, D=16, w=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    keys = torch.randn(R, L, H, n, D, generator=g)
    # A few near-duplicate keys so the redundancy threshold matters.
    keys[..., 10:14, :] = keys[..., 5:6, :] + 0.3 * torch.randn(R, L, H, 4, D, generator=g)
    queries = torch.randn(R, L, H * G, w, D, generator=g)
    return keys, queries


CASES = [
    ("rkv", dict()),
    ("rkv", dict(pooling="avg", kernel_size=5, mix_lambda=0.3)),
    ("rkv", dict(selection="layer")),
    ("rkv", dict(shared_selection=True)),
    ("snapkv", dict()),
    ("snapkv", dict(pooling="avg", kernel_size=3)),
    ("snapkv", dict(selection="layer", pooling="avg")),
    ("streamingllm", dict()),
    ("streamingllm", dict(num_sink=0)),
]


@pytest.mark.parametrize("algo,kw", CASES)
@pytest.mark.parametrize("G", [1, 3])
def test_policy_matches_dense_reference(algo, kw, G):
    w, keep = 4, 20
    cfg = CompressionConfig(algorithm=algo, budget=keep, window=w, **kw)
    keys, queries = random_case(G=G, w=w)
    idx = make_policy(cfg).select(keys, queries, keep)
    R, L, H, n, _ = keys.shape
    assert idx.shape == (R, L, H, keep)
    ref = ref_select(algo, keys, queries, keep, cfg)
    exact = kw.get("pooling") == "avg" or algo in ("streamingllm", "snapkv")
    for (r, l, h), (ref_kept, s) in ref.items():
        got = idx[r, l, h].tolist()
        assert got == sorted(set(got)) and got[-w:] == list(range(n - w, n))
        # The kept scores are the reference's top scores (robust to float rounding) ...
        got_s = sorted(s[j] for j in got[:-w])
        ref_s = sorted(s[j] for j in ref_kept[:-w])
        assert got_s == pytest.approx(ref_s, rel=1e-5, abs=1e-9), (r, l, h)
        if exact:  # ... and max-pooling ties go to the earlier position, as in the reference
            assert got == ref_kept, (r, l, h)
    if cfg.mode != "head":  # one set per layer (or per request)
        assert (idx == idx[:, :, :1]).all()
    if cfg.mode == "shared":
        assert (idx == idx[:, :1]).all()


def test_policy_classes_and_per_head_sets_differ():
    cfg = CompressionConfig(algorithm="rkv", budget=20, window=4)
    assert isinstance(make_policy(cfg), RKVPolicy)
    assert isinstance(make_policy(CompressionConfig(algorithm="snapkv")), SnapKVPolicy)
    assert not StreamingLLMPolicy(CompressionConfig(algorithm="streamingllm")).needs_queries
    keys, queries = random_case(G=2)
    idx = make_policy(cfg).select(keys, queries, 20)
    # Per-head selection really keeps different tokens in different layers and heads.
    assert not (idx == idx[:, :, :1]).all() and not (idx == idx[:, :1]).all()


def test_redundancy_spares_newest_duplicate():
    """Three identical keys: the newest copy of a repeated token scores least redundant."""
    g = torch.Generator().manual_seed(1)
    K = torch.randn(12, 8, generator=g)
    K[3] = K[7] = K[9] = K[2]
    cfg = CompressionConfig(algorithm="rkv", budget=6, window=2, mix_lambda=0.0)
    s = RKVPolicy(cfg).score(K[None, None, None], torch.randn(1, 1, 1, 2, 8))[0, 0, 0]
    dup = [2, 3, 7, 9]
    assert int(torch.stack([s[j] for j in dup]).argmax()) == 3  # position 9: newest copy
    assert s[9] > max(s[j] for j in (2, 3, 7))


# ---------------------------------------------------------------- compaction and the ring

def test_compact_moves_kept_entries_per_layer_and_head_and_frees_tail():
    L, H, D, n, keep = 3, 2, 4, 12, 5
    pool = KVPool(64, L, H, D, torch.float32, torch.device("cpu"))
    pool.k.copy_(torch.randn(pool.shape))
    pool.v.copy_(torch.randn(pool.shape))
    kv = KVCache(pool, max_requests=4, max_len=32)

    class S:
        pass

    seqs = [S(), S()]
    for s in seqs:
        kv.attach(s)
    kv.extend(seqs, [n, n])
    free_before = kv.num_free
    rows = [s.row for s in seqs]
    slots = kv.req_to_token.table[rows, :n].long()
    before_k = pool.k[:, slots].clone()  # [L, R, n, H, D]
    before_v = pool.v[:, slots].clone()
    g = torch.Generator().manual_seed(0)
    idx = torch.stack([torch.stack([torch.stack([torch.randperm(n, generator=g)[:keep].sort().values
                                                 for _ in range(H)]) for _ in range(L)])
                       for _ in range(2)])  # [R, L, H, keep]
    kv.compact(seqs, slots, idx)
    assert [s.kv_len for s in seqs] == [keep, keep]
    assert kv.num_free == free_before + 2 * (n - keep)
    for r, s in enumerate(seqs):
        new = kv.req_to_token.table[s.row, :keep].long()
        assert new.tolist() == slots[r, :keep].tolist()  # the request's first slots
        for l in range(L):
            for h in range(H):
                for j in range(keep):
                    src = int(idx[r, l, h, j])
                    assert torch.equal(pool.k[l, new[j], h], before_k[l, r, src, h])
                    assert torch.equal(pool.v[l, new[j], h], before_v[l, r, src, h])
    freed = set(kv.allocator.free_slots[-2 * (n - keep):].tolist())
    assert freed == set(slots[:, keep:].flatten().tolist())


def test_query_ring_holds_last_window():
    ring = QueryRing(num_layers=2, num_rows=3, window=4, num_heads=2, head_dim=3,
                     dtype=torch.float32, device=torch.device("cpu"))
    qs = torch.randn(11, 2, 3)
    for p in range(11):  # one token at a time into row 2, layer 1
        ring.record(1, qs[p:p + 1], torch.tensor([2]), torch.tensor([p]))
    got = ring.gather(torch.tensor([2]))[0, 1]  # [Hq, w, D]
    want = {tuple(qs[p].flatten().tolist()) for p in range(7, 11)}
    assert {tuple(got[:, i].flatten().tolist()) for i in range(4)} == want
    assert ring.gather(torch.tensor([2]))[0, 0].abs().sum() == 0  # other layer untouched
