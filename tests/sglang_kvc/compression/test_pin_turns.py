"""--compress-pin-turns: a session's request pins its whole turn head (the adopted KV and its
new tokens, e.g. a tool's response), so compression within a turn evicts only that turn's
generated tokens. Checked on the trigger's rules and admission bound (in slots: an adopted
compressed KV has fewer slots than positions), on the flag's checks, and in the engine through
the eviction record (no observation or prompt key is ever evicted, each turn's generated tokens
are), the pool the session holds between turns, and the log-probs of an HF forward masked as
the record says (an independent per-head reference)."""

from __future__ import annotations

import pytest
import torch

from sglang_kvc.compression import CompressionConfig
from sglang_kvc.compression.trigger import Trigger
from sglang_kvc.engine.sampling_params import SamplingParams
from sglang_kvc.engine.sequence import Sequence
from sglang_kvc.server_args import ServerArgs
from tests.sglang_kvc.compression.test_session_compression import (
    B, N, W, full_context, make_engine, masked_logprobs, session_turns, tokens, visible)
from tests.sglang_kvc.compression.test_session_compression import eager_hf  # noqa: F401 (fixture)

PINNED = dict(compress_pin_turns=True)


def continuation(prompt_len: int, adopted_slots: int, computed: int, max_new: int = 100):
    """A session request that adopted `adopted_slots` slots covering `computed` positions."""
    s = Sequence(rid="r", prompt_ids=[5] * prompt_len, params=SamplingParams(max_new_tokens=max_new),
                 seed=0)
    s.kv_len, s.num_computed, s.adopted_kv = adopted_slots, computed, True
    s.turn_head = adopted_slots + prompt_len - computed  # what Sessions.adopt sets
    return s


def test_trigger_pins_the_turn_head_in_slots_and_bound_reserves_it():
    Bt, Nt = 16, 8
    cfg = CompressionConfig(algorithm="rkv", budget=Bt, window=4, divide_length=Nt,
                            keep_prompt=True, pin_turns=True)
    t = Trigger(cfg)
    # 100 positions held in 30 slots (compressed), then 12 new tokens: the head is 42 slots
    s = continuation(prompt_len=112, adopted_slots=30, computed=100)
    assert t.pinned(s) == 42 and t.floor(s) == 42 + Bt
    s.kv_len = 42  # after its prefill: nothing to compress, however long the context
    assert not t.should_compress(s, is_prefill=True)
    assert t.bound(s, 42) == 42 + Bt + Nt  # admission reserves the whole pinned head
    s.kv_len = 42 + Bt + Nt
    assert t.should_compress(s, is_prefill=False)
    # preempted (adopted_kv cleared): recomputed densely, the whole prompt is the head
    s.adopted_kv = False
    assert t.pinned(s) == 112
    # without pin_turns the same request pins its chain's first prompt only
    s.adopted_kv, s.first_prompt_len = True, 20
    chain = Trigger(CompressionConfig(algorithm="rkv", budget=Bt, window=4, divide_length=Nt,
                                      keep_prompt=True))
    assert chain.pinned(s) == 20


def test_flag_needs_keep_prompt_and_reaches_the_config():
    with pytest.raises(ValueError, match="--compress-pin-turns .* --compress-keep-prompt"):
        ServerArgs(model_path="m", compress_algorithm="rkv", compress_pin_turns=True)
    a = ServerArgs(model_path="m", compress_algorithm="rkv", compress_keep_prompt=True,
                   compress_pin_turns=True)
    assert CompressionConfig.from_server_args(a).pin_turns
    assert not CompressionConfig.from_server_args(
        ServerArgs(model_path="m", compress_algorithm="rkv", compress_keep_prompt=True)).pin_turns


def test_trainer_passes_the_flag_through():
    import argparse

    from trainer.rollout.engines.config import add_engine_args

    parser = add_engine_args(argparse.ArgumentParser())
    assert parser.parse_args(["--sglang-compress-pin-turns"]).sglang_compress_pin_turns is True
    assert parser.parse_args([]).sglang_compress_pin_turns is False


@pytest.mark.parametrize("algo", ["rkv", "snapkv"])
def test_turns_keep_their_observations_and_match_the_masked_reference(tiny_models, eager_hf,
                                                                      algo):
    P1, M = 14, 18
    turns = [tokens(P1, seed=1), tokens(12, seed=2), tokens(9, seed=3)]
    held = []
    with make_engine(tiny_models, algo, True, **PINNED) as eng:
        base = eng.get_server_info()["kv_pool"]["used"]
        assert eng.get_server_info()["compression"]["pin_turns"] is True
        sid, prev, outs = eng.open_session(), None, []
        for i, ids in enumerate(turns):  # session_turns, with the pool read after each turn
            out = _turn(eng, sid, prev, i, ids, M)
            outs.append(out)
            prev = out["meta_info"]["id"]
            held.append(eng.get_server_info()["kv_pool"]["used"] - base)
        eng.close_session(sid)
        assert eng.get_server_info()["kv_pool"]["used"] == base
    # between turns the session keeps all it held plus the observation, and <= B + N of the
    # turn's generated tokens (the turn's last sampled token is fed with the observation)
    assert P1 < held[0] <= P1 + B + N
    for t in (1, 2):
        assert held[t - 1] + len(turns[t]) < held[t] <= held[t - 1] + len(turns[t]) + 1 + B + N
    total = outs[-1]["meta_info"]["eviction_record"].shape[-1]
    for t, out in enumerate(outs):
        meta = out["meta_info"]
        ids = full_context(turns, outs, t)
        ctx, rec = meta["session_context_len"], meta["eviction_record"]
        assert meta["eviction_record_exact"] and meta["compression"]["num_compressions"] > 0
        want = masked_logprobs(eager_hf, ids, rec)[ctx - 1:]
        got = torch.tensor([x[0] for x in meta["output_token_logprobs"]])
        assert torch.allclose(got, want, atol=2e-4), (got - want).abs().max()
        # a key of the turn's prompt was evicted by an earlier turn (before its first query) or
        # not at all: the turn's compactions score its own outputs only
        head = rec[..., :ctx].long()
        assert ((head == rec.shape[-1]) | (head < ctx)).all()
        vis = visible(rec)
        for q in range(ctx, len(ids) - 1):  # every decode query sees the whole turn prompt's
            # surviving keys (those earlier turns kept) and at most B + N of its own outputs
            assert (vis[..., q, :ctx] == vis[..., ctx - 1, :ctx]).all()
            assert (vis[..., q, ctx:].sum(-1) <= B + N).all()
            assert vis[..., q, q - W + 1:q + 1].all()
    rec = outs[-1]["meta_info"]["eviction_record"]
    never = torch.zeros(total, dtype=torch.bool)
    never[:P1] = True  # the first prompt
    for t in (1, 2):  # each turn's new tokens: the observations
        c = outs[t]["meta_info"]["session_context_len"]
        never[c - len(turns[t]):c] = True
    assert (rec[..., never] == total).all()  # no observation key is ever evicted
    for t in range(3):  # each turn's generated tokens are (all but the newest)
        c = outs[t]["meta_info"]["session_context_len"]
        assert (rec[..., c:c + M - W] < total).any()


def _turn(eng, sid, prev, i, ids, max_new, seed=7):
    return eng.generate(input_ids=ids, return_logprob=True, return_eviction_record=True,
                        session_params={"id": sid, "rid": prev}, sampling_params={
                            "temperature": 0.8, "max_new_tokens": max_new, "ignore_eos": True,
                            "sampling_seed": seed + i})


def test_default_chain_mode_evicts_observations(tiny_models):
    """The contrast: the same turns without the flag evict observation keys (what the flag is for)."""
    P1, M = 14, 18
    turns = [tokens(P1, seed=1), tokens(12, seed=2), tokens(9, seed=3)]
    with make_engine(tiny_models, "rkv", True) as eng:
        sid, outs = session_turns(eng, turns, M)
        eng.close_session(sid)
    rec = outs[-1]["meta_info"]["eviction_record"]
    c = outs[1]["meta_info"]["session_context_len"]
    assert (rec[..., c - len(turns[1]):c] < rec.shape[-1]).any()
