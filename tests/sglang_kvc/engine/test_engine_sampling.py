"""Sampling controls: seeds, n, stop strings / ids, ignore_eos, min_new_tokens, filters."""

from __future__ import annotations

import pytest
import torch

from sglang_kvc.engine.engine import Engine
from sglang_kvc.engine.sampler import Sampler, SamplingBatch, uniform_from_counter

SAMPLE = {"temperature": 1.0, "max_new_tokens": 20, "ignore_eos": True}


@pytest.fixture(scope="module")
def eng(tiny_models):
    e = Engine(model_path=str(tiny_models["qwen3"]), device="cpu")
    yield e
    e.shutdown()


def test_seeded_sampling_reproducible_across_batches(eng, prompts):
    p = dict(SAMPLE, sampling_seed=7)
    alone = eng.generate(prompt=prompts[0], sampling_params=p)["output_ids"]
    again = eng.generate(prompt=prompts[0], sampling_params=p)["output_ids"]
    # same request inside a batch, at another position, next to unseeded requests
    batch = eng.generate(prompt=[prompts[2], prompts[0], prompts[1]],
                         sampling_params=[SAMPLE, p, SAMPLE])[1]["output_ids"]
    other = eng.generate(prompt=prompts[0], sampling_params=dict(p, sampling_seed=8))["output_ids"]
    assert alone == again == batch
    assert alone != other


def test_n_samples(eng, prompts):
    outs = eng.generate(prompt=prompts[0], sampling_params=dict(SAMPLE, n=4, sampling_seed=1))
    assert len(outs) == 4
    assert len({tuple(o["output_ids"]) for o in outs}) > 1
    assert len({o["meta_info"]["id"] for o in outs}) == 4
    batch = eng.generate(prompt=prompts[:2], sampling_params=dict(SAMPLE, n=3))
    assert len(batch) == 6
    greedy = eng.generate(prompt=prompts[0], sampling_params={"temperature": 0, "n": 2, "max_new_tokens": 5})
    assert greedy[0]["output_ids"] == greedy[1]["output_ids"]


def test_top_k_1_is_greedy(eng, prompts):
    g = eng.generate(prompt=prompts, sampling_params={"temperature": 0.0, "max_new_tokens": 12,
                                                      "ignore_eos": True})
    k1 = eng.generate(prompt=prompts, sampling_params=dict(SAMPLE, top_k=1, max_new_tokens=12))
    assert [o["output_ids"] for o in g] == [o["output_ids"] for o in k1]


def test_stop_token_ids_and_ignore_eos(eng, prompts):
    free = eng.generate(prompt=prompts[1], sampling_params={"temperature": 0, "max_new_tokens": 16,
                                                            "ignore_eos": True})["output_ids"]
    stop_id = free[5]
    first = free.index(stop_id)
    o = eng.generate(prompt=prompts[1], sampling_params={"temperature": 0, "max_new_tokens": 16,
                                                         "stop_token_ids": [stop_id]})
    assert o["output_ids"] == free[:first + 1]
    assert o["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_id}
    # min_new_tokens masks the stop id until reached
    m = eng.generate(prompt=prompts[1], sampling_params={"temperature": 0, "max_new_tokens": 16,
                                                         "stop_token_ids": [stop_id],
                                                         "min_new_tokens": first + 2})
    assert len(m["output_ids"]) >= first + 2
    assert stop_id not in m["output_ids"][:first + 2]
    # EOS: make the model's own greedy token count as EOS by listing it as the eos of the engine
    eos_id = free[0]
    eng.eos_ids.add(eos_id)
    try:
        stopped = eng.generate(prompt=prompts[1], sampling_params={"temperature": 0, "max_new_tokens": 16})
        ignored = eng.generate(prompt=prompts[1], sampling_params={"temperature": 0, "max_new_tokens": 16,
                                                                   "ignore_eos": True})
    finally:
        eng.eos_ids.discard(eos_id)
    assert stopped["output_ids"] == [eos_id]
    assert stopped["meta_info"]["finish_reason"] == {"type": "stop", "matched": eos_id}
    assert ignored["output_ids"] == free


def test_stop_strings_trimmed_unless_no_stop_trim(eng, prompts):
    base = {"temperature": 0, "max_new_tokens": 16, "ignore_eos": True, "skip_special_tokens": False}
    free = eng.generate(prompt=prompts[3], sampling_params=base)
    text = free["text"]
    stop = text[3:6]
    assert len(stop) == 3
    o = eng.generate(prompt=prompts[3], sampling_params=dict(base, stop=[stop, "\x00never"]))
    assert o["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert o["text"] == text[:text.find(stop)]
    assert len(o["output_ids"]) < len(free["output_ids"])
    assert free["output_ids"][:len(o["output_ids"])] == o["output_ids"]
    keep = eng.generate(prompt=prompts[3], sampling_params=dict(base, stop=stop, no_stop_trim=True))
    assert keep["text"].startswith(text[:text.find(stop) + len(stop)])
    assert keep["output_ids"] == o["output_ids"]


def test_max_new_tokens_zero_and_context_cap(eng, prompts):
    o = eng.generate(prompt=prompts[0], sampling_params={"max_new_tokens": 0}, return_logprob=True,
                     logprob_start_len=0)
    assert o["output_ids"] == [] and o["meta_info"]["finish_reason"]["type"] == "length"
    assert len(o["meta_info"]["input_token_logprobs"]) == o["meta_info"]["prompt_tokens"]
    long_prompt = [10 + i % 300 for i in range(eng.max_seq_len - 3)]
    o = eng.generate(input_ids=long_prompt, sampling_params={"temperature": 0, "max_new_tokens": 50,
                                                             "ignore_eos": True})
    assert len(o["output_ids"]) == 3 and o["meta_info"]["finish_reason"]["type"] == "length"


def test_streaming_in_process(eng, prompts):
    chunks = list(eng.generate(prompt=prompts[0], sampling_params={"temperature": 0, "max_new_tokens": 6,
                                                                   "ignore_eos": True}, stream=True))
    assert len(chunks) == 6
    assert [len(c["output_ids"]) for c in chunks] == [1, 2, 3, 4, 5, 6]
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])


@pytest.mark.parametrize("bad,msg", [
    ({"sampling_params": {"max_new_tokens": -1}}, "max_new_tokens"),
    ({"sampling_params": {"max_new_tokens": 1.5}}, "max_new_tokens"),
    ({"sampling_params": {"bogus": 1}}, "unknown sampling"),
    ({"sampling_params": {"top_p": 0}}, "top_p"),
    ({"sampling_params": {"repetition_penalty": 1.2}}, "not supported"),
])
def test_invalid_params_raise(eng, bad, msg):
    with pytest.raises(ValueError, match=msg):
        eng.generate(prompt="hi", **bad)


def _batch(V, temps, top_p=1.0, top_k=None, min_p=0.0, seeds=None, steps=None):
    B = len(temps)
    return SamplingBatch(
        temperatures=torch.tensor(temps, dtype=torch.float32), top_p=torch.full((B,), top_p),
        top_k=torch.full((B,), top_k or V, dtype=torch.int64), min_p=torch.full((B,), min_p),
        seeds=torch.tensor(seeds or [0] * B), steps=torch.tensor(steps or list(range(B))),
        all_greedy=all(t == 0 for t in temps), need_filter=top_p < 1 or top_k is not None or min_p > 0,
        need_logprobs=True, top_logprobs_num=0)


def test_sampler_draws_follow_the_distribution():
    torch.manual_seed(0)
    V, B = 8, 20000
    logits = torch.randn(V).repeat(B, 1)
    out = Sampler()(logits.clone(), _batch(V, [1.0] * B, seeds=[3] * B))
    freq = torch.bincount(out.ids, minlength=V).float() / B
    assert (freq - torch.softmax(logits[0], -1)).abs().max() < 0.015
    # reported logprob is the untruncated log_softmax(logits / T)
    lp = torch.log_softmax(logits[0] / 1.0, -1)
    assert torch.allclose(out.logprobs, lp[out.ids], atol=1e-6)


def test_sampler_filters():
    V = 6
    logits = torch.log(torch.tensor([[0.4, 0.3, 0.15, 0.1, 0.04, 0.01]])).repeat(4000, 1)
    kw = dict(seeds=list(range(4000)), steps=[0] * 4000)
    ids = Sampler()(logits.clone(), _batch(V, [1.0] * 4000, top_k=2, **kw)).ids
    assert set(ids.tolist()) == {0, 1}
    ids = Sampler()(logits.clone(), _batch(V, [1.0] * 4000, top_p=0.8, **kw)).ids
    assert set(ids.tolist()) == {0, 1, 2}
    ids = Sampler()(logits.clone(), _batch(V, [1.0] * 4000, min_p=0.3, **kw)).ids
    assert set(ids.tolist()) == {0, 1, 2}
    out = Sampler()(logits.clone(), _batch(V, [0.5] * 4000, top_k=2, **kw))
    assert torch.allclose(out.logprobs, torch.log_softmax(logits / 0.5, -1).gather(1, out.ids[:, None])[:, 0])


def test_counter_uniforms_are_uniform_and_deterministic():
    u = uniform_from_counter(torch.tensor([5] * 10000), torch.arange(10000))
    assert 0 < u.min() and u.max() < 1 and abs(u.mean().item() - 0.5) < 0.01
    assert torch.equal(u, uniform_from_counter(torch.tensor([5] * 10000), torch.arange(10000)))


def test_unfiltered_row_ignores_a_filtering_batch_mate():
    """A row's draw depends on its own parameters only: the same seed and step give the same
    token whether or not another row of the batch uses top-p (which sorts its distribution)."""
    torch.manual_seed(1)
    V, B = 50, 400
    logits = torch.randn(B, V)
    kw = dict(seeds=list(range(B)), steps=[7] * B)
    alone = Sampler()(logits.clone(), _batch(V, [1.0] * B, **kw)).ids
    mixed = _batch(V, [1.0] * B, top_p=0.5, **kw)
    mixed.filtered = torch.arange(B) % 2 == 1  # odd rows use top-p 0.5, even rows none
    mixed.top_p = torch.where(mixed.filtered, 0.5, 1.0)
    ids = Sampler()(logits.clone(), mixed).ids
    assert torch.equal(ids[0::2], alone[0::2])
    # odd rows really were filtered: their tokens lie in the top-p 0.5 nucleus
    probs = torch.softmax(logits, -1)
    p_sorted, order = probs.sort(-1, descending=True)
    nucleus = (p_sorted.cumsum(-1) - p_sorted) <= 0.5
    for r in range(1, B, 2):
        assert ids[r].item() in set(order[r][nucleus[r]].tolist())
