"""Prefix sharing in the engine against the same engine with --disable-radix-cache (the
reference: every request computes and holds its whole prompt): same greedy tokens, log-probs and
eviction records, for dense, R-KV (prompt compressed at decode), SnapKV with the prompt kept and
SnapKV compressing the prompt at prefill; n = 1 and 8, one request with n, n requests submitted
together and one after another. After every mix no lock is left and, flushed, the pool is empty.

Bit for bit: the n samples of one request, and n identical prompts in one batch, are prefilled
once and the LM head still runs on one row per sample, so they equal the reference exactly. A
cache hit (one after another) computes only the prompt's tail against the cached slots: same
math, but a CPU GEMM with 1 row takes another kernel than one with 40 (and the reference itself
moves by as much with its batch-mates: a prompt alone vs after a 3-token batch-mate differs by
4.8e-7 in its log-probs on the tiny model), so there the tests bound log-probs by 1e-5 (measured
<= 1e-6); tokens and eviction records are equal. (Exactness of the one-prefill modes also needs
the reference's n copies to be bit-identical to each other, which holds here: the prompt length,
40, keeps every copy on the same GEMM row tiling.)

Mutation checks: dropping the flush from `ModelRunner.load_weights` fails
`test_weight_update_never_reuses_stale_kv`; freeing `row[:kv_len]` in `KVCache.release` fails
the mix tests (a shared slot freed twice: pool over-full / wrong tokens); writing compaction
into `slots[:, :k]` regardless of the shared prefix (no copy-on-write) fails the R-KV and
prompt-compressing SnapKV cases (shared slots freed by one sample: the pool check) and
test_prefix_cache's untouched-shared-slot check."""

from __future__ import annotations

import random

import pytest
import torch

from sglang_kvc.engine.engine import Engine
from sglang_kvc.kvcache.prefix_cache import _descendants

GREEDY = {"temperature": 0.0, "ignore_eos": True, "max_new_tokens": 24}
CONFIGS = {
    "dense": {},
    "rkv": dict(compress_algorithm="rkv", compress_max_prompt=16, compress_divide_length=8,
                compress_max_window=4),
    "snapkv-keep": dict(compress_algorithm="snapkv", compress_max_prompt=8,
                        compress_divide_length=8, compress_max_window=4, compress_keep_prompt=True),
    "snapkv-prompt": dict(compress_algorithm="snapkv", compress_max_prompt=16,
                          compress_divide_length=8, compress_max_window=4, compress_prompt=True),
}


def make(tiny_models, sharing: bool, name="qwen2.5", **kw):
    kw = {"device": "cpu", **kw}
    return Engine(model_path=str(tiny_models[name]), disable_radix_cache=not sharing,
                  random_seed=0, **kw)


def prompt(n=40, seed=0):
    return torch.randint(3, 200, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def assert_clean(eng) -> None:
    """No lock left, every slot free or evictable; flushed, the pool is empty."""
    def check():
        kv = eng.kv
        assert not eng.scheduler.running and not eng.scheduler.waiting
        nodes = list(_descendants(kv.prefix.root)) if kv.prefix is not None else []
        assert all(n.lock_ref == 0 for n in nodes), "a lock outlived its request"
        assert kv.num_free == kv.capacity
        cached = sum(n.slots.numel() for n in nodes)
        assert kv.allocator.num_free + cached == kv.capacity  # no slot leaked or freed twice
        kv.flush()
        assert kv.allocator.num_free == kv.capacity
        slots = torch.cat([kv.allocator.free_slots])
        assert slots.unique().numel() == kv.capacity  # each slot on the free list once
    eng.loop.call(check)


def run_modes(eng, n: int) -> dict:
    """Outputs of: one request with n; n requests in one call; n requests one after another."""
    p, lp = prompt(), dict(return_logprob=True)
    rec = {"return_eviction_record": True} if eng.compressor is not None else {}
    out = {"n": eng.generate(input_ids=p, sampling_params=dict(GREEDY, n=n), **lp, **rec)}
    assert_clean(eng)
    out["together"] = eng.generate(input_ids=[p] * n, sampling_params=GREEDY, **lp, **rec)
    assert_clean(eng)
    out["sequential"] = [eng.generate(input_ids=p, sampling_params=GREEDY, **lp, **rec)
                         for _ in range(n)]
    assert_clean(eng)
    return {k: v if isinstance(v, list) else [v] for k, v in out.items()}


def assert_same(got: list, want: list, exact: bool = False) -> None:
    for g, w in zip(got, want, strict=True):
        assert g["output_ids"] == w["output_ids"]
        a = [x[0] for x in g["meta_info"]["output_token_logprobs"]]
        b = [x[0] for x in w["meta_info"]["output_token_logprobs"]]
        assert a == b if exact else max(abs(x - y) for x, y in zip(a, b)) < 1e-5
        if "eviction_record" in w["meta_info"]:
            assert torch.equal(g["meta_info"]["eviction_record"], w["meta_info"]["eviction_record"])


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("n", [1, 8])
def test_sharing_matches_no_sharing(tiny_models, config, n):
    kw = CONFIGS[config]
    with make(tiny_models, False, **kw) as ref:
        want = run_modes(ref, n)
    with make(tiny_models, True, **kw) as eng:
        got = run_modes(eng, n)
        stats = eng.get_server_info()["prefix_cache"]
    for mode in want:
        assert_same(got[mode], want[mode], exact=mode != "sequential")
    P = len(prompt())
    if n > 1:  # the followers of one request and of one batch took the whole prompt
        assert [o["meta_info"]["cached_tokens"] for o in got["n"]] == [0] + [P] * (n - 1)
        assert [o["meta_info"]["cached_tokens"] for o in got["together"]] == [0] + [P] * (n - 1)
    tail = 4 if config != "dense" else 1  # a query-scoring policy computes its last w tokens
    assert all(o["meta_info"]["cached_tokens"] == P - tail for o in got["sequential"][1:])
    assert (stats["hit_tokens"] > 0) == (n > 1)
    if config != "dense":
        assert all(o["meta_info"]["compression"]["num_compressions"] > 0 for o in got["n"])


def test_weight_update_never_reuses_stale_kv(tiny_models):
    """A prompt cached before a weight update is recomputed after it: outputs equal a fresh
    engine on the new weights, and nothing is reported cached."""
    p = prompt()
    with make(tiny_models, True, name="qwen2.5-seed1") as fresh:
        want = fresh.generate(input_ids=p, sampling_params=GREEDY, return_logprob=True)
    with make(tiny_models, True) as eng:
        eng.generate(input_ids=p, sampling_params=GREEDY)
        assert eng.get_server_info()["prefix_cache"]["cached_tokens"] == len(p)
        eng.update_weights_from_disk(str(tiny_models["qwen2.5-seed1"]))
        got = eng.generate(input_ids=p, sampling_params=GREEDY, return_logprob=True)
        assert got["meta_info"]["cached_tokens"] == 0
        assert_same([got], [want])
        assert_clean(eng)


def test_flush_cache_empties_the_tree_only_when_idle(tiny_models):
    with make(tiny_models, True) as eng:
        eng.generate(input_ids=prompt(), sampling_params=GREEDY)
        assert eng.get_server_info()["prefix_cache"]["cached_tokens"] == 40
        assert eng.flush_cache()
        info = eng.get_server_info()
        assert info["prefix_cache"]["cached_tokens"] == 0
        assert eng.kv.allocator.num_free == eng.kv.capacity


def test_queue_bound_counts_a_shared_prompt_once(tiny_models):
    """--max-queued-tokens: 8 samples of a 40-token prompt with 24 new tokens each need
    40 + 8 * 24 = 232 tokens with sharing, 8 * 64 = 512 without; the bound is 300. After the
    request the count is back to 0 (each sample gave back its own share)."""
    body = {"input_ids": prompt(), "sampling_params": dict(GREEDY, n=8)}
    with make(tiny_models, False, max_queued_tokens=300) as ref:
        with pytest.raises(ValueError, match="max-queued-tokens"):
            ref.submit_generate(body)
    with make(tiny_models, True, max_queued_tokens=300) as eng:
        assert len([f.result() for f in eng.submit_generate(body)]) == 8
        assert eng.admission.tokens == 0 and eng.admission.samples == 0


def test_preemption_abort_and_retract_release_shared_slots(tiny_models):
    """A pool too small for 8 samples of a 40-token prompt at once (preemptions), an abort of a
    group mid-run, and a retract: outputs equal the reference's and no slot is lost."""
    p = prompt()
    params = dict(GREEDY, n=8, max_new_tokens=40)
    with make(tiny_models, False) as ref:
        want = ref.generate(input_ids=p, sampling_params=params, return_logprob=True)
    with make(tiny_models, True, max_total_tokens=300) as eng:
        got = eng.generate(input_ids=p, sampling_params=params, return_logprob=True)
        assert eng.get_server_info()["num_preemptions"] > 0
        assert_same(got, want)
        assert_clean(eng)
        futs = eng.submit_generate({"input_ids": p, "rid": "g", "sampling_params":
                                    dict(GREEDY, n=8, max_new_tokens=200)})
        while eng.get_server_info()["kv_pool"]["used"] < 60:
            pass
        eng.abort_request("g")
        assert all(f.result()["meta_info"]["finish_reason"]["type"] == "abort" for f in futs)
        assert_clean(eng)
        futs = eng.submit_generate({"input_ids": p, "sampling_params": params, "return_logprob": True})
        eng.pause_generation(mode="retract")
        eng.continue_generation()
        assert_same([f.result() for f in futs], want)
        assert_clean(eng)


@pytest.mark.parametrize("seed", range(6))
def test_random_mixes_keep_tokens_and_pool(tiny_models, seed):
    """Random requests over shared heads (a few prompts, prefixes of each other, n in 1..4,
    other lengths), some aborted, in a pool small enough to evict and preempt: every finished
    sample equals the reference's, and nothing leaks."""
    rng = random.Random(seed)
    heads = [prompt(rng.randint(8, 30), seed=rng.randint(0, 9)) for _ in range(3)]
    bodies = []
    for i in range(rng.randint(3, 6)):
        ids = rng.choice(heads)[:rng.randint(4, 30)] + prompt(rng.randint(0, 6), seed=100 + i)
        bodies.append({"input_ids": ids, "rid": f"r{i}", "sampling_params": dict(
            GREEDY, n=rng.randint(1, 4), max_new_tokens=rng.randint(1, 20))})
    kw = CONFIGS[rng.choice(list(CONFIGS))]
    with make(tiny_models, False, **kw) as ref:
        want = [[f.result() for f in ref.submit_generate(b)] for b in bodies]
    with make(tiny_models, True, max_total_tokens=160, **kw) as eng:
        futs = [eng.submit_generate(b) for b in bodies]
        aborted = rng.choice(bodies)["rid"] if rng.random() < 0.5 else None
        if aborted:
            eng.abort_request(aborted)
        for b, fs, ws in zip(bodies, futs, want):
            for f, w in zip(fs, ws, strict=True):
                g = f.result()
                if g["meta_info"]["finish_reason"]["type"] != "abort":
                    assert g["output_ids"] == w["output_ids"], (b["rid"], kw)
        assert_clean(eng)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("config", ["dense", "rkv", "snapkv-keep"])
def test_cuda_sharing_matches_no_sharing(tiny_models, config):
    """CUDA, fp32: the Triton backend's prefill with cached prefixes (gather + masked SDPA) and
    CUDA-graph decode over shared slots give the tokens of --disable-radix-cache."""
    outs = {}
    for sharing in (False, True):
        with make(tiny_models, sharing, device="cuda", dtype="float32", **CONFIGS[config]) as eng:
            outs[sharing] = run_modes(eng, 8)
    for mode in outs[False]:
        assert_same(outs[True][mode], outs[False][mode])


@pytest.mark.parametrize("config", ["dense", "rkv", "snapkv-keep"])
def test_sharing_on_an_fp8_pool(tiny_models, config):
    """FP8 KV with prefix sharing: a request's n samples and one batch's copies share the leader's
    FP8 slots and logits, so they equal --disable-radix-cache bit for bit. A later request that
    hits the cache attends to the prefix as stored (FP8-rounded), where a full prefill attends to
    its own unrounded K/V (as SGLang's prefill does): its log-probs differ within FP8's error
    (test_fp8_engine's bound for e4m3, 0.25), not bit for bit. Mutation: reading the cached
    prefix's raw bytes in `TorchAttention.extend` (pool.k instead of pool.read) fails the bound."""
    kw = dict(CONFIGS[config], kv_cache_dtype="fp8_e4m3")
    with make(tiny_models, False, **kw) as ref:
        want = run_modes(ref, 8)
    with make(tiny_models, True, **kw) as eng:
        got = run_modes(eng, 8)
    for mode in ("n", "together"):
        assert_same(got[mode], want[mode], exact=True)
    for g, w in zip(got["sequential"], want["sequential"], strict=True):
        a = [x[0] for x in g["meta_info"]["output_token_logprobs"]]
        b = [x[0] for x in w["meta_info"]["output_token_logprobs"]]
        n = min(len(a), len(b))
        assert max(abs(x - y) for x, y in zip(a[:n], b[:n])) < 0.25
