"""--compress-keep-prompt: the prompt's KV is never evicted, the budget B and buffer N count
response slots only. Checked on the compressor against a dense copy of the request's K/V taken
before the compaction, on the trigger's rules and admission bound, and in the engine through
the eviction record (exactly, against a StreamingLLM replay; as invariants for R-KV / SnapKV)
and the logprobs of an HF forward masked as the record says."""

from __future__ import annotations

import pytest
import torch

from sglang_kvc.compression import CompressionConfig, make_policy
from sglang_kvc.compression.compressor import Compressor
from sglang_kvc.compression.query_ring import QueryRing
from sglang_kvc.compression.trigger import Trigger
from sglang_kvc.engine.engine import Engine
from sglang_kvc.engine.sampling_params import SamplingParams
from sglang_kvc.engine.sequence import Sequence
from sglang_kvc.kvcache.kv_cache import KVCache, KVPool
from sglang_kvc.server_args import ServerArgs

ALGOS = ["rkv", "snapkv", "streamingllm"]
GREEDY = {"temperature": 0.0, "ignore_eos": True}


def prompt(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 200, (n,), generator=g).tolist()


def make_engine(tiny_models, family="qwen2.5", **kw):
    return Engine(model_path=str(tiny_models[family]), device="cpu", **kw)


# ---------------------------------------------------------------- compressor vs a dense copy

def held_request(kv, P, n):
    s = Sequence(rid="r", prompt_ids=prompt(P), params=SamplingParams(max_new_tokens=100), seed=0)
    s.output_ids = [1] * (n - P)
    kv.attach(s)
    kv.extend([s], [n])
    s.num_computed = n
    return s


def dense_copy(kv, s):
    """[L, H, n, D] K and V of the request's held tokens, in logical order."""
    slots = kv.req_to_token.table[s.row, :s.kv_len].long()
    return (kv.pool.k[:, slots].permute(0, 2, 1, 3).clone(),
            kv.pool.v[:, slots].permute(0, 2, 1, 3).clone())


@pytest.mark.parametrize("algo", ALGOS)
def test_compaction_keeps_the_prompt_and_b_response_tokens(algo):
    L, H, G, D, w, B, N, P = 2, 2, 2, 8, 3, 6, 4, 9
    n = P + B + N
    cfg = CompressionConfig(algorithm=algo, budget=B, window=w, divide_length=N, keep_prompt=True)
    pool = KVPool(128, L, H, D, torch.float32, torch.device("cpu"))
    g = torch.Generator().manual_seed(0)
    pool.k.copy_(torch.randn(pool.shape, generator=g))
    pool.v.copy_(torch.randn(pool.shape, generator=g))
    kv = KVCache(pool, max_requests=4, max_len=64)
    ring = QueryRing(L, 5, w, H * G, D, torch.float32, torch.device("cpu"))
    ring.buf.copy_(torch.randn(ring.buf.shape, generator=g))
    comp = Compressor(cfg, kv, ring, Trigger(cfg))
    s = held_request(kv, P, n)
    K, V = dense_copy(kv, s)
    free = kv.num_free
    assert comp.trigger.should_compress(s, is_prefill=False)
    idx = comp.compress([s])[0]  # [L, H, P + B]
    # the reference: the prompt untouched, the policy's choice among the response keys only
    want = make_policy(cfg.policy_config()).select(K[None, :, :, P:], ring.gather(
        torch.tensor([s.row])), B)[0] + P
    assert s.kv_len == P + B and kv.num_free == free + N
    assert torch.equal(idx[..., :P], torch.arange(P).expand(L, H, P))
    assert torch.equal(idx[..., P:], want)
    K2, V2 = dense_copy(kv, s)
    assert torch.equal(K2[:, :, :P], K[:, :, :P]) and torch.equal(V2[:, :, :P], V[:, :, :P])
    full = idx[..., :, None].expand(L, H, P + B, D)
    assert torch.equal(K2, K.gather(2, full)) and torch.equal(V2, V.gather(2, full))
    assert s.tokens_evicted == N and s.peak_kv == n
    if algo == "streamingllm":  # no response sinks: the prompt holds them; the newest B kept
        assert torch.equal(idx[..., P:], torch.arange(n - B, n).expand(L, H, B))


# ---------------------------------------------------------------- trigger and admission bound

def seq_holding(P, outputs, max_new=100):
    s = Sequence(rid="r", prompt_ids=list(range(100, 100 + P)),
                 params=SamplingParams(max_new_tokens=max_new), seed=0)
    s.output_ids = [1] * outputs
    s.num_computed = s.kv_len = s.num_tokens
    return s


def test_trigger_counts_response_slots_and_bound_includes_the_prompt():
    B, N, P = 16, 8, 40
    t = Trigger(CompressionConfig(algorithm="rkv", budget=B, window=4, divide_length=N,
                                  keep_prompt=True))
    assert t.pinned(seq_holding(P, 0)) == P and t.floor(seq_holding(P, 0)) == P + B
    assert not t.should_compress(seq_holding(P, 0), is_prefill=True)  # a prompt > B stays
    assert not t.should_compress(seq_holding(P, B + N - 1), is_prefill=False)
    assert t.should_compress(seq_holding(P, B + N), is_prefill=False)  # P + B + N held
    assert t.should_compress(seq_holding(P, B + 1), is_prefill=True)  # recomputed after preemption
    s = seq_holding(P, 0)
    assert t.bound(s, P) == P + B + N  # admission reserves the pinned prompt
    assert t.bound(seq_holding(P, 0, max_new=5), P) == P + 5  # never more than dense
    plain = Trigger(CompressionConfig(algorithm="rkv", budget=B, window=4, divide_length=N))
    assert plain.bound(s, P) == max(P + 1, B + N) and plain.pinned(s) == 0


def test_server_flag_and_its_conflict_with_prompt_compression():
    with pytest.raises(ValueError, match="--compress-keep-prompt"):
        ServerArgs(model_path="m", compress_algorithm="rkv", compress_keep_prompt=True,
                   compress_prompt=True)
    a = ServerArgs(model_path="m", compress_algorithm="snapkv", compress_keep_prompt=True)
    assert CompressionConfig.from_server_args(a).keep_prompt
    assert not CompressionConfig.from_server_args(
        ServerArgs(model_path="m", compress_algorithm="snapkv")).keep_prompt


# ---------------------------------------------------------------- the engine

def streaming_keep_prompt_evict_at(P, total, B, N):
    """Independent reference: the prompt held forever, the newest B response tokens after
    each compaction (at P + B + N held), replayed token by token."""
    evict = [total] * total
    response = []
    for i in range(P, total - 1):  # the query at i feeds token i; compression after its step
        response.append(i)
        if len(response) >= B + N:
            for k in response[:-B]:
                evict[k] = i + 1
            response = response[-B:]
    return evict


def visible(record):
    T = record.shape[-1]
    q, k = torch.arange(T)[:, None], torch.arange(T)[None, :]
    return (k <= q) & (q < record[..., None, :].long())


@pytest.mark.parametrize("family,P", [("qwen2.5", 25), ("llama3", 9)])
def test_streamingllm_record_and_logprobs_keep_the_prompt(tiny_models, hf_reference, family, P):
    B, N, M, T = 8, 5, 30, 0.8
    with make_engine(tiny_models, family, compress_algorithm="streamingllm",
                     compress_max_prompt=B, compress_divide_length=N, compress_max_window=2,
                     compress_num_sink=4, compress_keep_prompt=True) as eng:
        out = eng.generate(input_ids=prompt(P, seed=2), sampling_params={
            "temperature": T, "max_new_tokens": M, "ignore_eos": True, "sampling_seed": 3},
            return_logprob=True, return_eviction_record=True)
        assert eng.get_server_info()["compression"]["keep_prompt"] is True
    meta = out["meta_info"]
    rec = meta["eviction_record"]
    want = torch.tensor(streaming_keep_prompt_evict_at(P, P + M, B, N), dtype=rec.dtype)
    assert torch.equal(rec, want.expand_as(rec))
    assert (rec[..., :P] == P + M).all() and meta["compression"]["num_compressions"] >= 3
    assert meta["compression"]["peak_kv_slots"] == P + B + N
    # π_sparse is the forward that sees the prompt and the newest response tokens
    full = prompt(P, seed=2) + out["output_ids"]
    mask = visible(rec)[0, 0, :-1, :-1]
    model = hf_reference.model(tiny_models[family])
    am = torch.where(mask, 0.0, float("-inf"))[None, None]
    with torch.no_grad():
        logits = model(torch.tensor([full[:-1]]), attention_mask=am).logits[0].float()
    lp = torch.log_softmax(logits / T, -1)
    ref = [lp[P - 1 + k, t].item() for k, t in enumerate(out["output_ids"])]
    assert [x[0] for x in meta["output_token_logprobs"]] == pytest.approx(ref, abs=2e-4)


@pytest.mark.parametrize("algo", ALGOS)
def test_prompt_never_evicted_and_response_budget_honoured(tiny_models, algo):
    """Every decode query sees the whole prompt, and at most B + N response keys before it
    (exactly B after each compaction); the pool holds what the requests hold; no request is
    preempted on a pool too small for all four bounds at once (a bound without the prompt
    would admit all four and preempt)."""
    B, N, w, M = 8, 4, 3, 40
    lengths = [30, 6, 45, 12]
    bound = sum(P + B + N for P in lengths)
    problems = []

    def check(eng, batch):
        used = eng.kv.capacity - eng.kv.num_free
        if used != sum(s.kv_len for s in eng.scheduler.running):
            problems.append(("pool", used))
        for s in batch.seqs:
            if s.kv_len > len(s.prompt_ids) + B + N:
                problems.append((s.rid, s.kv_len, P))

    with make_engine(tiny_models, compress_algorithm=algo, compress_max_prompt=B,
                     compress_divide_length=N, compress_max_window=w, compress_keep_prompt=True,
                     max_total_tokens=bound - 11) as eng:
        after_step = eng.runner.after_step

        def watched(batch):
            after_step(batch)
            check(eng, batch)

        eng.runner.after_step = watched
        outs = eng.generate(input_ids=[prompt(P, seed=i) for i, P in enumerate(lengths)],
                            sampling_params=dict(GREEDY, max_new_tokens=M),
                            return_eviction_record=True)
        assert eng.scheduler.num_preemptions == 0 and not problems, problems[:5]
    for out, P in zip(outs, lengths):
        meta = out["meta_info"]
        rec, c = meta["eviction_record"], meta["compression"]
        assert (rec[..., :P] == P + M).all()  # no prompt key is ever evicted
        vis = visible(rec)
        for q in range(P, P + M - 1):  # every decode query: the prompt, <= B + N response keys
            assert vis[..., q, :P].all()
            held = vis[..., q, P:q].sum(-1)
            assert (held <= B + N).all() and vis[..., q, q - w:q + 1].all()
        # outputs 1..M-1 are fed; compaction at B + N response tokens, then every N
        assert c["num_compressions"] == (M - 1 - B - N) // N + 1 and c["peak_kv_slots"] == P + B + N
        assert c["tokens_evicted"] == c["num_compressions"] * N
