"""`logit_bias` (OpenAI's, SGLang's): added to the logits before sampling, per request, and the
reported log-probs are those of the biased distribution, checked against Hugging Face's logits
plus the bias. Mutation checks: not applying the bias in Sampler fails every test; applying it
to every row (bias_rows ignored) fails test_bias_is_per_request."""

from __future__ import annotations

import pytest
import torch

from sglang_kvc.engine.engine import Engine

GREEDY = {"temperature": 0.0, "max_new_tokens": 6, "ignore_eos": True}


@pytest.fixture(scope="module")
def eng(tiny_models):
    e = Engine(model_path=str(tiny_models["qwen2.5"]), device="cpu", dtype="float32")
    yield e
    e.shutdown()


@pytest.fixture(scope="module")
def ids(eng, prompts):
    return eng.tokenizer.encode(prompts[1])


def _hf_next_logits(hf_reference, tiny_models, ids):
    model = hf_reference.model(tiny_models["qwen2.5"])
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0, -1].float()


def test_a_large_bias_forces_the_token(eng, ids):
    out = eng.generate(input_ids=ids, sampling_params=dict(GREEDY, logit_bias={"7": 100}))
    assert out["output_ids"] == [7] * 6


def test_biased_argmax_and_logprob_match_hf(eng, ids, hf_reference, tiny_models):
    logits = _hf_next_logits(hf_reference, tiny_models, ids)
    best = logits.argmax().item()
    bias = {str(best): -100.0, "3": 2.5}
    out = eng.generate(input_ids=ids, return_logprob=True,
                       sampling_params={"temperature": 1.0, "top_k": 1, "max_new_tokens": 1,
                                        "logit_bias": bias})
    biased = logits.clone()
    biased[best] -= 100.0
    biased[3] += 2.5
    expected = biased.argmax().item()
    assert expected != best and out["output_ids"] == [expected]
    lp = torch.log_softmax(biased, dim=-1)[expected].item()
    assert out["meta_info"]["output_token_logprobs"][0][0] == pytest.approx(lp, abs=1e-4)


def test_bias_is_per_request(eng, ids):
    plain = eng.generate(input_ids=ids, sampling_params=GREEDY)["output_ids"]
    batch = eng.generate(input_ids=[ids, ids],
                         sampling_params=[dict(GREEDY, logit_bias={"7": 100}), GREEDY])
    assert batch[0]["output_ids"] == [7] * 6 and batch[1]["output_ids"] == plain
    assert eng.generate(input_ids=ids, sampling_params=dict(GREEDY, logit_bias={}))["output_ids"] == plain


@pytest.mark.parametrize("bias,message", [
    ({"x": 1}, "logit_bias: 'x': 1 is not a token id and a number"),
    ({"5": "big"}, "is not a token id and a number"),
    ({"999999": 1.0}, "logit_bias token id(s) [999999] out of vocabulary"),
])
def test_bad_bias_is_refused(eng, ids, bias, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[").replace("]", r"\]")):
        eng.generate(input_ids=ids, sampling_params=dict(GREEDY, logit_bias=bias))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_bias_next_to_graphed_requests_on_cuda(tiny_models, ids):
    """With CUDA graphs on (bf16), a biased request runs its batch eagerly; its unbiased
    batch-mates decode as they do alone (graphed), the biased one is forced."""
    with Engine(model_path=str(tiny_models["qwen2.5"]), device="cuda", dtype="bfloat16",
                cuda_graph=True) as eng:
        plain = eng.generate(input_ids=[ids] * 3, sampling_params=GREEDY)
        mixed = eng.generate(input_ids=[ids] * 3, sampling_params=[
            GREEDY, dict(GREEDY, logit_bias={"7": 100}), GREEDY])
        again = eng.generate(input_ids=[ids] * 3, sampling_params=GREEDY)
    assert mixed[1]["output_ids"] == [7] * 6
    assert mixed[0]["output_ids"] == plain[0]["output_ids"] == again[0]["output_ids"]
    assert mixed[2]["output_ids"] == plain[2]["output_ids"]
