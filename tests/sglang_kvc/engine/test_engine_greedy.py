"""In-process engine vs HF transformers: greedy tokens and logprobs, every tiny family."""

from __future__ import annotations

import pytest
import torch

from checkpoint_tools.tiny_models import FAMILIES
from sglang_kvc.engine.engine import Engine

N_NEW = 24


@pytest.fixture(scope="module")
def engines(tiny_models):
    made = {}

    def get(name, **kw):
        key = (name, tuple(sorted(kw.items())))
        if key not in made:
            made[key] = Engine(model_path=str(tiny_models[name]), device="cpu", **kw)
        return made[key]

    yield get
    for e in made.values():
        e.shutdown()


@pytest.mark.parametrize("family", sorted(FAMILIES) + ["qwen2.5-sharded"])
def test_greedy_matches_hf_generate(family, engines, tiny_models, hf_reference, prompts):
    eng = engines(family)
    outs = eng.generate(prompt=prompts, sampling_params={
        "temperature": 0.0, "max_new_tokens": N_NEW, "ignore_eos": True})
    assert len(outs) == len(prompts)
    for p, o in zip(prompts, outs):
        ref = hf_reference(tiny_models[family], eng.tokenizer.encode(p), N_NEW)
        assert o["output_ids"] == ref
        assert o["meta_info"]["finish_reason"] == {"type": "length", "length": N_NEW}
        assert o["meta_info"]["completion_tokens"] == N_NEW


def test_default_eos_stops_like_hf(engines, tiny_models, hf_reference, prompts):
    """Without ignore_eos the output is HF's greedy output cut after the first EOS id."""
    eng = engines("qwen2.5")
    ids = [eng.tokenizer.encode(p) for p in prompts]
    outs = eng.generate(input_ids=ids, sampling_params={"temperature": 0.0, "max_new_tokens": N_NEW})
    for i, o in zip(ids, outs):
        ref = hf_reference(tiny_models["qwen2.5"], i, N_NEW)
        cut = next((k + 1 for k, t in enumerate(ref) if t in eng.eos_ids), len(ref))
        assert o["output_ids"] == ref[:cut]


@pytest.mark.parametrize("family,temperature", [("qwen3", 0.7), ("llama3", 1.0), ("qwen2-untied", 0.0)])
def test_logprobs_match_hf_forward(family, temperature, engines, tiny_models, hf_reference, prompts):
    eng = engines(family)
    outs = eng.generate(prompt=prompts, sampling_params={
        "temperature": temperature, "top_p": 0.9, "top_k": 50, "max_new_tokens": 16,
        "ignore_eos": True, "sampling_seed": 1234}, return_logprob=True, logprob_start_len=0,
        top_logprobs_num=3)
    hf = hf_reference.model(tiny_models[family])
    t = temperature if temperature > 0 else 1.0
    for p, o in zip(prompts, outs):
        prompt = eng.tokenizer.encode(p)
        x = torch.tensor([prompt + o["output_ids"]])
        with torch.no_grad():
            lp = torch.log_softmax(hf(x).logits[0].float() / t, dim=-1)
        meta = o["meta_info"]
        got = meta["output_token_logprobs"]
        assert [e[1] for e in got] == o["output_ids"]
        for i, (val, tok, text) in enumerate(got):
            assert text is None
            assert abs(val - lp[len(prompt) - 1 + i, tok].item()) < 1e-4
        # input logprobs: position 0 has none, then each prompt token given its prefix
        inp = meta["input_token_logprobs"]
        assert len(inp) == len(prompt) and inp[0][0] is None
        for j in range(1, len(prompt)):
            assert abs(inp[j][0] - lp[j - 1, prompt[j]].item()) < 1e-4
        # top logprobs are the top of the same distribution
        for i, top in enumerate(meta["output_top_logprobs"]):
            ref_v, ref_i = lp[len(prompt) - 1 + i].topk(3)
            assert [e[1] for e in top] == ref_i.tolist()
            assert max(abs(a[0] - b) for a, b in zip(top, ref_v.tolist())) < 1e-4


def test_logprob_start_len_and_text(engines, prompts):
    eng = engines("qwen2.5")
    o = eng.generate(prompt=prompts[1], sampling_params={"temperature": 0.0, "max_new_tokens": 4},
                     return_logprob=True, logprob_start_len=3, return_text_in_logprobs=True)
    n_prompt = o["meta_info"]["prompt_tokens"]
    assert len(o["meta_info"]["input_token_logprobs"]) == n_prompt - 3
    assert all(isinstance(e[2], str) for e in o["meta_info"]["output_token_logprobs"])


def test_bf16_engine_runs_close_to_hf(tiny_models, hf_reference, prompts):
    """--dtype bfloat16 on CPU: logprobs close to the fp32 HF forward (loose: bf16 rounding)."""
    with Engine(model_path=str(tiny_models["qwen2.5"]), device="cpu", dtype="bfloat16") as eng:
        assert eng.runner.dtype == torch.bfloat16
        o = eng.generate(prompt=prompts[0], sampling_params={"temperature": 0.0, "max_new_tokens": 8,
                                                             "ignore_eos": True}, return_logprob=True)
        prompt = eng.tokenizer.encode(prompts[0])
    hf = hf_reference.model(tiny_models["qwen2.5"])
    with torch.no_grad():
        lp = torch.log_softmax(hf(torch.tensor([prompt + o["output_ids"]])).logits[0], dim=-1)
    for i, (val, tok, _) in enumerate(o["meta_info"]["output_token_logprobs"]):
        assert abs(val - lp[len(prompt) - 1 + i, tok].item()) < 0.1
