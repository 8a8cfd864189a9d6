"""Multi-turn samples are exact: the in-process engine's log-probs of every model token equal
HF's over the whole concatenated context (prompt, turns and observations; float32, 1e-5), so
the trainer's dense recompute over that context is the sampler's policy; observation tokens
carry no sampler log-prob and are masked."""

from __future__ import annotations

import pytest
import torch

from checkpoint_tools.tiny_models import make_tiny_model
from sglang_kvc.engine.engine import Engine
from trainer.rollout.engines.inprocess import EngineRollout
from trainer.rollout.engines.interface import RolloutConfig
from trainer.rollout.multiturn.environment import Step
from trainer.rollout.multiturn.loop import MultiTurn
from trainer.rollout.samples.data import Prompt
from trainer.rollout.samples.generate import GenerateContext


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model("qwen2.5", tmp_path_factory.mktemp("m") / "qwen", dtype=torch.float32)


def echo_env(conversation) -> Step:
    """Answers every turn with a numbered observation; ends after the third turn."""
    k = len(conversation.turns)
    return Step(done=True, reward=0.0) if k == 3 else Step(f"result {k} of sample "
                                                            f"{conversation.sample_index}")


def _episodes(model_dir, sessions=True, **engine_kw):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    text = tok.apply_chat_template([{"role": "user", "content": "add 3 4"}], tokenize=False,
                                   add_generation_prompt=True)
    prompt = Prompt(text, tok(text, add_special_tokens=False)["input_ids"], "7", {})
    with Engine(model_path=str(model_dir), device="cpu", **engine_kw) as eng:
        ctx = GenerateContext(EngineRollout(eng), RolloutConfig(max_response_len=96, seed=3), tok,
                              None, context_length=eng.max_seq_len)
        traces = MultiTurn(echo_env, max_turns=3, turn_tokens=10, use_sessions=sessions)(
            ctx, [prompt], 3)
        assert eng.get_server_info()["sessions"]["open"] == 0  # every episode's session closed
        return traces


def _hf_logprobs(model_dir, ids: list[int]) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    return torch.log_softmax(logits[:-1], dim=-1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0]


@pytest.mark.parametrize("sessions", [True, False], ids=["sessions", "reprefill"])
def test_sampler_logprobs_equal_hf_over_the_concatenated_context(model_dir, sessions):
    traces = _episodes(model_dir, sessions)
    assert [t.meta["turns"] for t in traces] == [3, 3, 3]
    for trace in traces:
        (call,) = trace.calls
        mask = torch.tensor(call.loss_mask, dtype=torch.bool)
        assert 0 < int(mask.sum()) < len(mask)  # model turns and observations both there
        hf = _hf_logprobs(model_dir, call.prompt_ids + call.gen.response_ids)[len(call.prompt_ids) - 1:]
        sampler = torch.tensor(call.gen.logprobs)
        assert torch.allclose(sampler[mask], hf[mask], atol=1e-5, rtol=0), \
            float((sampler[mask] - hf[mask]).abs().max())
        assert (sampler[~mask] == 0).all()


def test_sessions_prefill_only_new_tokens_and_sample_what_reprefill_samples(model_dir):
    """The same seeds, the same episodes: a session's turn continues its KV (the context before
    it comes from the engine, not prefilled again) and samples the tokens a re-prefill does."""
    kept, again = _episodes(model_dir, True), _episodes(model_dir, False)
    for k, r in zip(kept, again):
        assert k.calls[0].gen.response_ids == r.calls[0].gen.response_ids
        assert torch.allclose(torch.tensor(k.calls[0].gen.logprobs),
                              torch.tensor(r.calls[0].gen.logprobs), atol=1e-5)
        last = k.calls[0].gen.meta
        context = len(k.calls[0].prompt_ids) + len(k.calls[0].gen.response_ids) - \
            len(_last_turn_ids(k))
        assert last["session_context_len"] == context
        # prefilled: the last observation (and at most the previous turn's last token)
        observation = _runs(k.calls[0].loss_mask)[-2]
        cached = last["cached_tokens_per_turn"][-1]
        assert context - observation - 1 <= cached <= context - observation


def _last_turn_ids(trace) -> list[int]:
    return trace.calls[0].gen.response_ids[-_runs(trace.calls[0].loss_mask)[-1]:]


def _runs(mask: list[int]) -> list[int]:
    """Lengths of the mask's runs: turn, observation, turn, ..."""
    runs = [1]
    for a, b in zip(mask, mask[1:]):
        runs[-1:] = [runs[-1] + 1] if a == b else [runs[-1], 1]
    return runs


def early_env(conversation) -> Step:
    """Sample 0 ends after its first turn; the others after their third."""
    k = len(conversation.turns)
    if k == 3 or conversation.sample_index == 0:
        return Step(done=True, reward=0.0)
    return Step(f"result {k}")


def test_a_finished_episode_frees_its_session_at_once(model_dir):
    """Sample 0's session is closed when its episode ends, while the others' are still open
    (they go on to a third turn)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    prompt = Prompt("q", tok("add 3 4", add_special_tokens=False)["input_ids"], "7", {})
    with Engine(model_path=str(model_dir), device="cpu") as eng:
        backend = EngineRollout(eng)
        closes, close = [], backend.close_sessions

        def counted(session_ids):  # which sessions, and how many were open when they closed
            closes.append((list(session_ids), eng.get_server_info()["sessions"]["open"]))
            close(session_ids)

        backend.close_sessions = counted
        opens, open_sessions = [], backend.open_sessions
        backend.open_sessions = lambda n: opens.extend(open_sessions(n)) or opens  # sample order
        ctx = GenerateContext(backend, RolloutConfig(max_response_len=96, seed=3), tok, None,
                              context_length=eng.max_seq_len)
        traces = MultiTurn(early_env, max_turns=3, turn_tokens=6)(ctx, [prompt], 3)
        after = eng.get_server_info()["sessions"]
    assert [t.meta["turns"] for t in traces] == [1, 3, 3]
    assert closes[0] == ([opens[0]], 3)  # sample 0's alone, first, while all 3 are open
    assert sorted(s for ids, _ in closes for s in ids) == sorted(opens)  # each closed once
    assert after["open"] == 0 and after["parked_slots"] == 0


@pytest.mark.launch
@pytest.mark.parametrize("servers", [1, 2])
def test_http_servers_run_the_same_sessions(model_dir, wait_healthy, servers):
    """Through ``/open_session`` and ``/generate`` with ``session_params``, on one server or
    two: the episodes the in-process engine samples, token for token, and with two every
    episode's turns stay on the server that holds its session, so a later turn prefills only its
    observation (the history comes from the session)."""
    import subprocess
    import sys

    import requests
    from transformers import AutoTokenizer

    from checkpoint_tools import cpu_megatron
    from trainer.rollout.engines.servers import HTTPRollout

    ports = [cpu_megatron.free_port() for _ in range(servers)]
    procs = [subprocess.Popen([sys.executable, "-m", "sglang_kvc.launch_server", "--model-path",
                               str(model_dir), "--port", str(port), "--device", "cpu"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for port in ports]
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    try:
        for url, proc in zip(urls, procs):
            wait_healthy(url, proc)
        tok = AutoTokenizer.from_pretrained(model_dir)
        text = tok.apply_chat_template([{"role": "user", "content": "add 3 4"}], tokenize=False,
                                       add_generation_prompt=True)
        prompt = Prompt(text, tok(text, add_special_tokens=False)["input_ids"], "7", {})
        ctx = GenerateContext(HTTPRollout(urls), RolloutConfig(max_response_len=96, seed=3), tok,
                              None, context_length=1024)
        http = MultiTurn(echo_env, max_turns=3, turn_tokens=10)(ctx, [prompt], 3)
        infos = [requests.get(url + "/get_server_info", timeout=10).json() for url in urls]
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=60)
    local = _episodes(model_dir)
    assert all(info["sessions"]["open"] == 0 for info in infos)
    for h, k in zip(http, local):
        assert h.calls[0].gen.response_ids == k.calls[0].gen.response_ids
        meta = h.calls[0].gen.meta
        assert meta["session_context_len"] == k.calls[0].gen.meta["session_context_len"]
        context, observation = meta["session_context_len"], _runs(h.calls[0].loss_mask)[-2]
        assert meta["cached_tokens_per_turn"][-1] >= context - observation - 1
