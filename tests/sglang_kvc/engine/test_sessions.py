"""Sessions (engine/sessions.py): a request continues an earlier request of its session from the
KV that request left. Checked against a fresh request whose prompt is the whole concatenated
context (re-prefill every turn) and against HF over that context; the engine's prefill counter
shows only the new tokens are computed; closing a session gives its slots back."""

from __future__ import annotations

import pytest
import torch

from sglang_kvc.engine.engine import Engine

GREEDY = {"temperature": 0.0, "ignore_eos": True}


def tokens(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 200, (n,), generator=g).tolist()


def make_engine(tiny_models, family="qwen2.5", **kw):
    return Engine(model_path=str(tiny_models[family]), device="cpu", dtype="float32", **kw)


def lps(out):
    return [x[0] for x in out["meta_info"]["output_token_logprobs"]]


def run_turns(eng, sid, turns, max_new):
    """Generate the turns of one session: turn i sends turns[i] (the prompt, then the
    observations) and continues the previous turn. Returns the outputs."""
    outs, prev = [], None
    for ids in turns:
        out = eng.generate(input_ids=ids, sampling_params=dict(GREEDY, max_new_tokens=max_new),
                           return_logprob=True, session_params={"id": sid, "rid": prev})
        outs.append(out)
        prev = out["meta_info"]["id"]
    return outs


def context_of(turns, outs, upto):
    """The whole context turn `upto` saw: every earlier turn's tokens and output, then its own."""
    ids = []
    for ids_i, out in zip(turns[:upto], outs[:upto]):
        ids += ids_i + out["output_ids"]
    return ids + turns[upto]


@pytest.mark.parametrize("family,overlap", [("qwen2.5", True), ("llama3", False)])
def test_continuation_equals_reprefill_and_hf(tiny_models, hf_reference, family, overlap):
    turns = [tokens(11, seed=1), tokens(5, seed=2), tokens(7, seed=3)]
    M = 6
    with make_engine(tiny_models, family, disable_overlap_schedule=not overlap) as eng:
        sid = eng.open_session()
        outs = run_turns(eng, sid, turns, M)
        for t in range(1, len(turns)):
            ctx = context_of(turns, outs, t)
            assert outs[t]["meta_info"]["session_context_len"] == len(ctx)
            ref = eng.generate(input_ids=ctx, sampling_params=dict(GREEDY, max_new_tokens=M),
                               return_logprob=True)
            assert outs[t]["output_ids"] == ref["output_ids"]
            assert lps(outs[t]) == pytest.approx(lps(ref), abs=1e-5)
            assert outs[t]["output_ids"] == hf_reference(tiny_models[family], ctx, M)
        eng.close_session(sid)
    # HF log-probs over the whole last context
    model = hf_reference.model(tiny_models[family])
    full = context_of(turns, outs, 2) + outs[2]["output_ids"]
    with torch.no_grad():
        logits = model(torch.tensor([full])).logits[0].float()
    lp = torch.log_softmax(logits, -1)
    start = len(full) - M - 1
    want = [lp[start + k, t].item() for k, t in enumerate(outs[2]["output_ids"])]
    assert lps(outs[2]) == pytest.approx(want, abs=1e-5)


@pytest.mark.parametrize("overlap", [True, False])
def test_only_the_new_tokens_are_prefilled(tiny_models, overlap):
    P, O, M = 40, 6, 5
    with make_engine(tiny_models, disable_overlap_schedule=not overlap) as eng:
        sid = eng.open_session()
        first = eng.generate(input_ids=tokens(P), sampling_params=dict(GREEDY, max_new_tokens=M),
                             session_params={"id": sid})
        before = eng.runner.prefill_tokens
        second = eng.generate(input_ids=tokens(O, seed=5), session_params={
            "id": sid, "rid": first["meta_info"]["id"]},
            sampling_params=dict(GREEDY, max_new_tokens=M))
        computed = eng.runner.prefill_tokens - before
        # the new tokens, plus the last sampled token when no step fed it (max_new_tokens is
        # known ahead, so the engine never decodes past it)
        assert computed == O + 1
        assert second["meta_info"]["cached_tokens"] == P + M - 1
        assert second["meta_info"]["prompt_tokens"] == P + M + O


def test_stop_token_finish_continues_too(tiny_models):
    """A request ended by a stop token (overlap: its step already fed that token) continues
    from the right position."""
    with make_engine(tiny_models) as eng:
        sid = eng.open_session()
        probe = eng.generate(input_ids=tokens(9), sampling_params=dict(GREEDY, max_new_tokens=8))
        stop = probe["output_ids"][3]
        first = eng.generate(input_ids=tokens(9), sampling_params={
            "temperature": 0.0, "max_new_tokens": 8, "stop_token_ids": [stop]},
            session_params={"id": sid})
        assert first["meta_info"]["finish_reason"]["type"] == "stop"
        obs = tokens(4, seed=9)
        second = eng.generate(input_ids=obs, sampling_params=dict(GREEDY, max_new_tokens=6),
                              return_logprob=True,
                              session_params={"id": sid, "rid": first["meta_info"]["id"]})
        ref = eng.generate(input_ids=tokens(9) + first["output_ids"] + obs,
                           sampling_params=dict(GREEDY, max_new_tokens=6), return_logprob=True)
        assert second["output_ids"] == ref["output_ids"]
        assert lps(second) == pytest.approx(lps(ref), abs=1e-5)


def test_batched_sessions_share_the_prompt_and_close_frees_slots(tiny_models):
    """n samples of one prompt, each in its own session: the prompt is prefilled once and
    shared; between turns the sessions hold their slots; closing them returns the pool."""
    P, M, O = 30, 4, 3
    with make_engine(tiny_models) as eng:
        base = eng.get_server_info()["kv_pool"]["used"]
        sids = [eng.open_session() for _ in range(3)]
        firsts = eng.generate(input_ids=[tokens(P)] * 3, sampling_params=[
            {"temperature": 1.0, "max_new_tokens": M, "ignore_eos": True, "sampling_seed": i}
            for i in range(3)], session_params=[{"id": s} for s in sids])
        info = eng.get_server_info()
        assert info["prefill_tokens"] == P  # one prefill for the three samples
        assert info["sessions"]["parked_requests"] == 3
        held = info["kv_pool"]["used"] - base
        # the shared prompt once, then each sample's own tokens (fed ones: M - 1 of M)
        assert held == P + 3 * (M - 1)
        seconds = eng.generate(input_ids=[tokens(O, seed=i) for i in range(3)],
                               sampling_params=dict(GREEDY, max_new_tokens=M),
                               session_params=[{"id": s, "rid": f["meta_info"]["id"]}
                                               for s, f in zip(sids, firsts)])
        for f, s, i in zip(firsts, seconds, range(3)):
            ref = eng.generate(input_ids=tokens(P) + f["output_ids"] + tokens(O, seed=i),
                               sampling_params=dict(GREEDY, max_new_tokens=M))
            assert s["output_ids"] == ref["output_ids"]
        for sid in sids:
            eng.close_session(sid)
        info = eng.get_server_info()
        assert info["kv_pool"]["used"] == base and info["sessions"]["open"] == 0


def test_sessions_open_and_close_in_one_engine_thread_hop_each(tiny_models):
    """``open_sessions(n)`` / ``close_sessions(ids)``: n sessions at one step boundary (one
    command on the engine thread, not n), closed together, their slots back in the pool; ids
    that are not open come back as such and hold nothing."""
    with make_engine(tiny_models) as eng:
        base, stats = eng.get_server_info()["kv_pool"]["used"], eng.step_stats
        commands = stats.commands
        sids = eng.open_sessions(4)
        assert stats.commands == commands + 1 and len(set(sids)) == 4
        eng.generate(input_ids=[tokens(12, seed=i) for i in range(4)],
                     sampling_params=dict(GREEDY, max_new_tokens=3),
                     session_params=[{"id": s} for s in sids])
        assert eng.get_server_info()["sessions"]["parked_requests"] == 4
        assert eng.close_sessions(sids + ["nope"]) == ["nope"]
        assert stats.commands == commands + 2
        info = eng.get_server_info()
        assert info["kv_pool"]["used"] == base and info["sessions"]["open"] == 0
        with pytest.raises(ValueError, match="non-negative"):
            eng.open_sessions(-1)
        with pytest.raises(ValueError, match="strings"):
            eng.close_sessions([3])


def test_bad_session_input_is_a_clear_error(tiny_models):
    with make_engine(tiny_models) as eng:
        sid = eng.open_session(session_id="mine")
        assert sid == "mine"
        with pytest.raises(ValueError, match="already open"):
            eng.open_session(session_id="mine")
        with pytest.raises(ValueError, match="unknown session id 'nope'"):
            eng.close_session("nope")
        with pytest.raises(ValueError, match="unknown session id"):
            eng.generate(input_ids=[5, 6], session_params={"id": "nope"})
        with pytest.raises(ValueError, match="not a finished request"):
            eng.generate(input_ids=[5, 6], session_params={"id": sid, "rid": "r0"})
        with pytest.raises(ValueError, match="offset"):
            eng.generate(input_ids=[5, 6], session_params={"id": sid, "offset": 3})
        with pytest.raises(ValueError, match="n = 1"):
            eng.generate(input_ids=[5, 6], sampling_params={"n": 2}, session_params={"id": sid})
        first = eng.generate(input_ids=[5, 6], sampling_params=dict(GREEDY, max_new_tokens=2),
                             session_params={"id": sid})
        with pytest.raises(ValueError, match="logprob_start_len"):
            eng.generate(input_ids=[7], return_logprob=True, logprob_start_len=0,
                         session_params={"id": sid, "rid": first["meta_info"]["id"]})
        eng.close_session(sid)
        with pytest.raises(ValueError, match="unknown session id"):
            eng.generate(input_ids=[7], session_params={"id": sid, "rid": first["meta_info"]["id"]})


def test_parked_kv_is_dropped_when_nothing_else_fits(tiny_models):
    """A pool too small for a parked session and a new request: the parked KV goes (the new
    request runs), and the session's next request prefills its whole context, same tokens."""
    P, M, O = 30, 5, 4
    with make_engine(tiny_models, max_total_tokens=60) as eng:
        sid = eng.open_session()
        first = eng.generate(input_ids=tokens(P), session_params={"id": sid},
                             sampling_params=dict(GREEDY, max_new_tokens=M))
        assert eng.get_server_info()["kv_pool"]["used"] == P + M - 1  # its prompt is cached
        other = eng.generate(input_ids=tokens(45, seed=8), sampling_params=dict(GREEDY, max_new_tokens=3))
        assert other["meta_info"]["finish_reason"]["type"] == "length"
        assert eng.get_server_info()["sessions"]["parked_requests"] == 0
        before = eng.runner.prefill_tokens
        second = eng.generate(input_ids=tokens(O, seed=6), return_logprob=True,
                              sampling_params=dict(GREEDY, max_new_tokens=M),
                              session_params={"id": sid, "rid": first["meta_info"]["id"]})
        assert eng.runner.prefill_tokens - before == P + M + O  # the whole context again
        eng.flush_cache()
        ref = eng.generate(input_ids=tokens(P) + first["output_ids"] + tokens(O, seed=6),
                           return_logprob=True, sampling_params=dict(GREEDY, max_new_tokens=M))
        assert second["output_ids"] == ref["output_ids"]
        assert lps(second) == pytest.approx(lps(ref), abs=1e-5)


def test_a_branch_reprefills_and_the_release_of_the_pool_drops_parked_kv(tiny_models):
    """Continuing one request twice: the first continuation takes its KV, the second (a
    branch) prefills its whole context. Releasing the KV pool drops parked KV; the sessions
    stay usable."""
    with make_engine(tiny_models) as eng:
        sid = eng.open_session()
        first = eng.generate(input_ids=tokens(12), session_params={"id": sid},
                             sampling_params=dict(GREEDY, max_new_tokens=4))
        cont = {"id": sid, "rid": first["meta_info"]["id"]}
        outs = []
        for seed in (1, 2):
            before = eng.runner.prefill_tokens
            outs.append(eng.generate(input_ids=tokens(3, seed=seed), session_params=cont,
                                     sampling_params=dict(GREEDY, max_new_tokens=4)))
            outs[-1]["computed"] = eng.runner.prefill_tokens - before
        # the branch computes its whole context but the first prompt, found in the prefix cache
        assert [o["computed"] for o in outs] == [4, 4 + 3]
        assert [o["meta_info"]["cached_tokens"] for o in outs] == [12 + 3, 12]
        for o, seed in zip(outs, (1, 2)):
            ref = eng.generate(input_ids=tokens(12) + first["output_ids"] + tokens(3, seed=seed),
                               sampling_params=dict(GREEDY, max_new_tokens=4))
            assert o["output_ids"] == ref["output_ids"]
        eng.release_memory(["kv_cache"])
        eng.resume_memory(["kv_cache"])
        assert eng.get_server_info()["kv_pool"]["used"] == 0
        last = eng.generate(input_ids=[9], session_params={"id": sid, "rid": outs[0]["meta_info"]["id"]},
                            sampling_params=dict(GREEDY, max_new_tokens=2))
        assert last["meta_info"]["cached_tokens"] == 0 and len(last["output_ids"]) == 2
        eng.close_session(sid)


def test_admission_counts_a_continuation_without_its_context(tiny_models):
    """--max-queued-tokens counts a continuation's new tokens and output, not the context its
    session already holds: 25 + 10 fits a 40-token queue, and so does the next turn's 4 + 10
    (its whole context plus output, 49, would not)."""
    with make_engine(tiny_models, max_queued_tokens=40) as eng:
        sid = eng.open_session()
        first = eng.generate(input_ids=tokens(25), session_params={"id": sid},
                             sampling_params=dict(GREEDY, max_new_tokens=10))
        second = eng.generate(input_ids=tokens(4, seed=3), sampling_params=dict(GREEDY, max_new_tokens=10),
                              session_params={"id": sid, "rid": first["meta_info"]["id"]})
        assert second["meta_info"]["prompt_tokens"] == 39 and len(second["output_ids"]) == 10
        with pytest.raises(ValueError, match="max-queued-tokens"):
            eng.generate(input_ids=tokens(39), sampling_params=dict(GREEDY, max_new_tokens=10))


def test_a_decode_step_short_of_slots_drops_parked_kv_before_preempting(tiny_models):
    """Parked KV is given up like cached KV: a running request that outgrows the pool takes the
    parked session's slots instead of being preempted."""
    with make_engine(tiny_models, max_total_tokens=60) as eng:
        sid = eng.open_session()
        eng.generate(input_ids=tokens(30), session_params={"id": sid},
                     sampling_params=dict(GREEDY, max_new_tokens=5))
        out = eng.generate(input_ids=tokens(10, seed=4), sampling_params=dict(GREEDY, max_new_tokens=40))
        assert out["meta_info"]["num_preemptions"] == 0 and len(out["output_ids"]) == 40
        assert eng.get_server_info()["sessions"]["parked_requests"] == 0
        eng.close_session(sid)
