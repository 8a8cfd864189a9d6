"""Every KV slot has one owner (issue 66): session continuations whose parked KV is gone (a turn
continued twice, or parked KV dropped under memory pressure) recompute their context densely,
with compression, keep-prompt and the prefix cache on, without freeing a slot twice. Checked by
hand-counted `kv_pool.used`, by the ownership check the suite runs after every step
(conftest.py), by an HF forward of a later request that reads the first prompt from the prefix
cache, and by the recomputed turns' tokens (the non-dropped path's, HF's) or log-probs (the
eviction record's replay)."""

from __future__ import annotations

import pytest
import torch

from sglang_kvc.engine.engine import Engine
from tests.sglang_kvc.compression.test_session_compression import T, masked_logprobs

GREEDY = {"temperature": 0.0, "ignore_eos": True}
B, N, W = 10, 5, 3


def tokens(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 200, (n,), generator=g).tolist()


def make_engine(tiny_models, algo, keep_prompt, **kw):
    comp = {} if algo is None else dict(
        compress_algorithm=algo, compress_max_prompt=B, compress_divide_length=N,
        compress_max_window=W, compress_keep_prompt=keep_prompt)
    return Engine(model_path=str(tiny_models["qwen2.5"]), device="cpu", dtype="float32",
                  **comp, **kw)


def pool(eng):
    info = eng.get_server_info()
    return info["kv_pool"], info.get("prefix_cache"), info["sessions"]


def held(eng):
    """What `used` must read: parked requests' own slots plus the cache's locked slots."""
    _, cache, sessions = pool(eng)
    locked = cache["cached_tokens"] - cache["evictable_tokens"] if cache else 0
    return sessions["parked_slots"] + locked


def hf_logprobs(model, ids, out):
    full = ids + out["output_ids"]
    with torch.no_grad():
        lp = torch.log_softmax(model(torch.tensor([full])).logits[0].float(), -1)
    return torch.tensor([lp[len(ids) - 1 + k, t].item() for k, t in enumerate(out["output_ids"])])


def got_logprobs(out):
    return torch.tensor([x[0] for x in out["meta_info"]["output_token_logprobs"]])


def shared_prompt_reads_clean_kv(eng, model, prompt):
    """Fill the room the free list says it has (a double-freed slot is handed out and written
    over), then read `prompt` from the prefix cache densely: HF's log-probs."""
    kv_pool, cache, _ = pool(eng)
    room = kv_pool["free"] - cache["evictable_tokens"] - 1  # leaves the cached prompt alone
    eng.generate(input_ids=tokens(room, seed=9), compress=False,
                 sampling_params=dict(GREEDY, max_new_tokens=1))
    ids = prompt + tokens(10, seed=5)
    out = eng.generate(input_ids=ids, compress=False, return_logprob=True,
                       sampling_params=dict(GREEDY, max_new_tokens=8))
    assert out["meta_info"]["cached_tokens"] == len(prompt)
    err = (got_logprobs(out) - hf_logprobs(model, ids, out)).abs().max().item()
    assert err < 1e-5, err


CASES = [("rkv", True), ("snapkv", True), ("rkv", False), (None, False)]


@pytest.mark.parametrize("algo,keep_prompt", CASES)
def test_a_turn_continued_twice_frees_each_slot_once(tiny_models, hf_reference, algo, keep_prompt):
    P = 40
    prompt = tokens(P, seed=1)
    model = hf_reference.model(tiny_models["qwen2.5"])
    with make_engine(tiny_models, algo, keep_prompt, max_total_tokens=200) as eng:
        sid = eng.open_session()
        first = eng.generate(input_ids=prompt, session_params={"id": sid},
                             sampling_params=dict(GREEDY, max_new_tokens=12))
        branches = []
        for i in range(2):  # the second finds the KV gone: it recomputes the whole context
            branches.append(eng.generate(
                input_ids=tokens(8, seed=10 + i), sampling_params=dict(GREEDY, max_new_tokens=12),
                session_params={"id": sid, "rid": first["meta_info"]["id"]}))
            assert pool(eng)[0]["used"] == held(eng)
        assert branches[1]["meta_info"]["cached_tokens"] >= P  # its first prompt was cached
        eng.close_session(sid)
        assert pool(eng)[0]["used"] == 0  # was -P: the first prompt's slots freed twice
        shared_prompt_reads_clean_kv(eng, model, prompt)
        assert pool(eng)[0]["used"] == 0


@pytest.mark.parametrize("algo,keep_prompt", [("rkv", True), (None, False)])
def test_parked_kv_dropped_under_pressure_frees_each_slot_once(tiny_models, hf_reference, algo,
                                                                keep_prompt):
    """A small pool: another session's long request drops the parked KV; the continuation then
    recomputes its context, and `used` stays what the parked sessions and the cache hold."""
    P, C = 40, 160
    prompt = tokens(P, seed=1)
    model = hf_reference.model(tiny_models["qwen2.5"])
    with make_engine(tiny_models, algo, keep_prompt, max_total_tokens=C) as eng:
        a, b = eng.open_session(), eng.open_session()
        first = eng.generate(input_ids=prompt, session_params={"id": a},
                             sampling_params=dict(GREEDY, max_new_tokens=12))
        assert pool(eng)[2]["parked_requests"] == 1
        eng.generate(input_ids=tokens(C - 30, seed=3), session_params={"id": b},
                     sampling_params=dict(GREEDY, max_new_tokens=4))
        assert pool(eng)[0]["used"] == held(eng)
        second = eng.generate(input_ids=tokens(8, seed=4), sampling_params=dict(
            GREEDY, max_new_tokens=12), session_params={"id": a, "rid": first["meta_info"]["id"]})
        assert second["meta_info"]["cached_tokens"] < len(prompt) + 12 + 8  # recomputed
        assert pool(eng)[0]["used"] == held(eng)
        eng.close_session(a)
        eng.close_session(b)
        assert pool(eng)[0]["used"] == 0
        shared_prompt_reads_clean_kv(eng, model, prompt)


def test_a_recomputed_dense_continuation_yields_the_same_tokens(tiny_models, hf_reference):
    """docs/engine.md: a continuation whose KV is gone prefills its context again, "the same
    tokens": the branch that adopted the KV, the branch that recomputed it, a continuation
    after its KV was dropped under pressure, and HF all give one greedy answer."""
    P, C, M = 30, 160, 10
    prompt, obs = tokens(P, seed=1), tokens(7, seed=2)
    path = tiny_models["qwen2.5"]
    with make_engine(tiny_models, None, False, max_total_tokens=C) as eng:
        sid, other = eng.open_session(), eng.open_session()
        first = eng.generate(input_ids=prompt, session_params={"id": sid},
                             sampling_params=dict(GREEDY, max_new_tokens=M))
        cont = {"id": sid, "rid": first["meta_info"]["id"]}
        outs = [eng.generate(input_ids=obs, session_params=cont, return_logprob=True,
                             sampling_params=dict(GREEDY, max_new_tokens=M)) for _ in range(2)]
        parked = outs[0]["meta_info"]["id"]
        eng.generate(input_ids=tokens(C - 20, seed=3), session_params={"id": other},
                     sampling_params=dict(GREEDY, max_new_tokens=2))  # drops the parked KV
        assert pool(eng)[2]["parked_requests"] == 1  # the other session's request alone
        again = [eng.generate(input_ids=obs, session_params={"id": sid, "rid": parked},
                              sampling_params=dict(GREEDY, max_new_tokens=M))]
        eng.close_session(sid)
        eng.close_session(other)
    ctx = prompt + first["output_ids"] + obs
    want = hf_reference(path, ctx, M)
    assert outs[0]["output_ids"] == outs[1]["output_ids"] == want
    err = (got_logprobs(outs[1]) - got_logprobs(outs[0])).abs().max().item()
    assert err < 1e-5, err
    assert again[0]["output_ids"] == hf_reference(path, ctx + want + obs, M)


@pytest.mark.parametrize("algo", ["rkv", "snapkv"])
def test_a_recomputed_compressed_branch_matches_its_record(tiny_models, algo):
    """Keep-prompt, prefix cache on: the second branch of a compressed turn recomputes its
    context densely (its first prompt from the cache), then compresses again; its log-probs
    are those of the forward that sees every key before `eviction_record_dense_from` and this
    turn's evictions after (the record's replay)."""
    from transformers import AutoModelForCausalLM

    eager = AutoModelForCausalLM.from_pretrained(tiny_models["qwen2.5"], dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    P, M = 14, 18
    prompt, obs = tokens(P, seed=1), tokens(12, seed=2)
    params = {"temperature": T, "max_new_tokens": M, "ignore_eos": True}
    with make_engine(tiny_models, algo, True) as eng:
        sid = eng.open_session()
        first = eng.generate(input_ids=prompt, session_params={"id": sid}, return_eviction_record=True,
                             sampling_params=dict(params, sampling_seed=1))
        cont = {"id": sid, "rid": first["meta_info"]["id"]}
        outs = [eng.generate(input_ids=obs, session_params=cont, return_logprob=True,
                             return_eviction_record=True,
                             sampling_params=dict(params, sampling_seed=2)) for _ in range(2)]
        eng.close_session(sid)
        assert pool(eng)[0]["used"] == 0
    meta = outs[1]["meta_info"]
    ctx, rec = meta["session_context_len"], meta["eviction_record"]
    assert meta["eviction_record_dense_from"] == ctx - 1 and meta["cached_tokens"] >= P
    assert outs[0]["meta_info"].get("eviction_record_dense_from") is None
    dense_then = torch.where(rec <= ctx - 1, rec.shape[-1], rec.long())
    ids = prompt + first["output_ids"] + obs + outs[1]["output_ids"]
    want = masked_logprobs(eager, ids, dense_then)[ctx - 1:]
    err = (got_logprobs(outs[1]) - want).abs().max().item()
    assert err < 2e-4, err
