"""Compression across the turns of a session (engine/sessions.py): the budget spans the whole
context, observation tokens are scored and evicted like any other, --compress-keep-prompt keeps
the first prompt only, and each turn's eviction record covers the whole context. Checked
against an HF forward in which every layer and KV head sees exactly the keys the record says
(an independent per-head masked reference), and on the record's own invariants."""

from __future__ import annotations

import pytest
import torch

from sglang_kvc.engine.engine import Engine

B, N, W, T = 10, 5, 3, 0.8


def tokens(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 200, (n,), generator=g).tolist()


def visible(record):
    """[L, Hkv, T, T] bool: query q sees key k."""
    n = record.shape[-1]
    q, k = torch.arange(n)[:, None], torch.arange(n)[None, :]
    return (k <= q) & (q < record[..., None, :].long())


def make_engine(tiny_models, algo, keep_prompt, **kw):
    return Engine(model_path=str(tiny_models["qwen2.5"]), device="cpu", compress_algorithm=algo,
                  compress_max_prompt=B, compress_divide_length=N, compress_max_window=W,
                  compress_keep_prompt=keep_prompt, **kw)


def session_turns(eng, turns, max_new, seed=7):
    """One session: the prompt, then observations, each turn continuing the previous one."""
    sid, prev, outs = eng.open_session(), None, []
    for i, ids in enumerate(turns):
        out = eng.generate(input_ids=ids, return_logprob=True, return_eviction_record=True,
                           session_params={"id": sid, "rid": prev}, sampling_params={
                               "temperature": T, "max_new_tokens": max_new, "ignore_eos": True,
                               "sampling_seed": seed + i})
        outs.append(out)
        prev = out["meta_info"]["id"]
    return sid, outs


def full_context(turns, outs, upto):
    ids = []
    for t in range(upto + 1):
        ids += turns[t] + outs[t]["output_ids"]
    return ids


@pytest.fixture(scope="module")
def eager_hf(tiny_models):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_models["qwen2.5"], dtype=torch.float32,
                                                attn_implementation="eager").eval()


def masked_logprobs(model, ids, record):
    """Log-probs (temperature T) of ids[1:] from an HF forward in which layer l, query head h
    sees key k iff the record says its KV head does: each layer's attention gets its own
    additive mask [1, Hq, n, n]."""
    n = len(ids) - 1
    vis = visible(record[..., :n])[..., :n, :n]
    group = model.config.num_attention_heads // model.config.num_key_value_heads
    layers = model.model.layers
    originals = [layer.self_attn.forward for layer in layers]

    def with_mask(forward, mask):
        return lambda *a, **kw: forward(*a, **dict(kw, attention_mask=mask))

    for layer, forward, v in zip(layers, originals, vis):
        mask = torch.where(v.repeat_interleave(group, 0), 0.0, float("-inf"))[None]
        layer.self_attn.forward = with_mask(forward, mask)
    try:
        with torch.no_grad():
            logits = model(torch.tensor([ids[:-1]])).logits[0].float()
    finally:
        for layer, forward in zip(layers, originals):
            layer.self_attn.forward = forward
    lp = torch.log_softmax(logits / T, -1)
    return lp.gather(1, torch.tensor(ids[1:])[:, None])[:, 0]


CASES = [("rkv", False), ("rkv", True), ("snapkv", False), ("snapkv", True)]


@pytest.mark.parametrize("algo,keep_prompt", CASES)
def test_compressed_turns_match_the_masked_reference(tiny_models, eager_hf, algo, keep_prompt):
    P1, M = 14, 18
    turns = [tokens(P1, seed=1), tokens(12, seed=2), tokens(9, seed=3)]
    with make_engine(tiny_models, algo, keep_prompt) as eng:
        base = eng.get_server_info()["kv_pool"]["used"]
        sid, outs = session_turns(eng, turns, M)
        held = eng.get_server_info()["kv_pool"]["used"] - base
        eng.close_session(sid)
        assert eng.get_server_info()["kv_pool"]["used"] == base
    pinned = P1 if keep_prompt else 0
    # between turns the session holds its compressed KV, within the budget
    assert 0 < held <= pinned + B + N
    prev_rec = None
    for t, out in enumerate(outs):
        meta = out["meta_info"]
        ids = full_context(turns, outs, t)
        ctx = meta["session_context_len"]
        rec = meta["eviction_record"]
        assert ctx == len(ids) - M and rec.shape[-1] == len(ids)
        assert meta["eviction_record_exact"] and meta.get("eviction_record_dense_from") is None
        # the output's log-probs are those of the forward that sees what the record says
        want = masked_logprobs(eager_hf, ids, rec)[ctx - 1:]
        got = torch.tensor([x[0] for x in meta["output_token_logprobs"]])
        assert torch.allclose(got, want, atol=2e-4), (got - want).abs().max()
        # decode queries see the pinned prompt plus at most B + N keys
        vis = visible(rec)
        for q in range(ctx, len(ids) - 1):
            assert (vis[..., q, :].sum(-1) <= pinned + B + N).all()
            assert vis[..., q, q - W + 1:q + 1].all()  # the window is always kept
        if prev_rec is not None:  # what earlier turns evicted stays as recorded
            n = prev_rec.shape[-1]
            gone = prev_rec < n
            assert torch.equal(rec[..., :n][gone], prev_rec[gone])
        prev_rec = rec
    rec = outs[-1]["meta_info"]["eviction_record"]
    total = rec.shape[-1]
    obs = slice(P1 + M, P1 + M + len(turns[1]))  # turn 2's observation
    assert (rec[..., obs] < total).any()  # observations are evicted like any other token
    if keep_prompt:
        assert (rec[..., :P1] == total).all()  # the first prompt is never evicted
    else:
        assert (rec[..., :P1] < total).any()


@pytest.mark.parametrize("keep_prompt", [False, True])
def test_group_prompt_stays_shared_across_turns(tiny_models, keep_prompt):
    """Two samples of one prompt, each in its own session: the prompt is prefilled once, and
    after a second turn the sessions' KV is what a lone session holds twice, minus the shared
    prompt (kept: still shared; not kept: each copied its part on compaction)."""
    P, M = 20, 12
    prompt = tokens(P, seed=4)
    with make_engine(tiny_models, "rkv", keep_prompt) as eng:
        base = eng.get_server_info()["kv_pool"]["used"]
        sids = [eng.open_session() for _ in range(2)]
        firsts = eng.generate(input_ids=[prompt, prompt], session_params=[{"id": s} for s in sids],
                              sampling_params=[{"temperature": T, "max_new_tokens": M,
                                                "ignore_eos": True, "sampling_seed": i}
                                               for i in range(2)])
        assert eng.get_server_info()["prefill_tokens"] == P
        eng.generate(input_ids=[tokens(6, seed=5)] * 2,
                     session_params=[{"id": s, "rid": f["meta_info"]["id"]}
                                     for s, f in zip(sids, firsts)],
                     sampling_params={"temperature": 0.0, "max_new_tokens": M, "ignore_eos": True})
        used = eng.get_server_info()["kv_pool"]["used"] - base
        own = [s.kv_len - s.prefix_len for sess in eng.sessions._sessions.values()
               for t in sess.turns.values() for s in [t.seq] if s.row is not None]
        assert len(own) == 2
        shared = P if keep_prompt else 0
        assert used == shared + sum(own)
        for sid in sids:
            eng.close_session(sid)
        assert eng.get_server_info()["kv_pool"]["used"] == base


def test_dropped_kv_recomputes_densely_and_says_from_where(tiny_models, eager_hf):
    """The parked compressed KV is gone (the pool was released between turns): the next turn
    prefills its whole context densely and its record gives dense_from (the query that samples
    its first token); its log-probs are those of a forward that sees every key before
    dense_from and this turn's evictions after."""
    P1, M = 14, 18
    turns = [tokens(P1, seed=1), tokens(12, seed=2)]
    with make_engine(tiny_models, "rkv", False) as eng:
        sid = eng.open_session()
        first = eng.generate(input_ids=turns[0], return_eviction_record=True,
                             session_params={"id": sid}, sampling_params={
                                 "temperature": T, "max_new_tokens": M, "ignore_eos": True,
                                 "sampling_seed": 1})
        eng.release_memory(["kv_cache"])
        eng.resume_memory(["kv_cache"])
        second = eng.generate(input_ids=turns[1], return_logprob=True, return_eviction_record=True,
                              session_params={"id": sid, "rid": first["meta_info"]["id"]},
                              sampling_params={"temperature": T, "max_new_tokens": M,
                                               "ignore_eos": True, "sampling_seed": 2})
        eng.close_session(sid)
    meta = second["meta_info"]
    ctx, rec = meta["session_context_len"], meta["eviction_record"]
    assert meta["eviction_record_dense_from"] == ctx - 1 and meta["cached_tokens"] == 0
    # compressed again after the recompute: one number per key cannot say both evictions
    # (eviction_record.py), so the record is not exact; a key turn 1 evicted is marked by that
    # eviction or by one of this turn's
    assert meta["eviction_record_exact"] is False
    first_rec = first["meta_info"]["eviction_record"]
    gone = first_rec < first_rec.shape[-1]
    again = rec[..., :first_rec.shape[-1]][gone]
    assert gone.any() and ((again == first_rec[gone]) | (again > ctx - 1)).all()
    dense_then = torch.where(rec <= ctx - 1, rec.shape[-1], rec.long())
    ids = full_context(turns, [first, second], 1)
    want = masked_logprobs(eager_hf, ids, dense_then)[ctx - 1:]
    got = torch.tensor([x[0] for x in meta["output_token_logprobs"]])
    assert torch.allclose(got, want, atol=2e-4), (got - want).abs().max()
