"""The engine on a real pretrained model (SmolLM2-135M-Instruct, fp32 on the CPU) against Hugging
Face: greedy decoding is HF's argmax teacher-forced on the same prefix, and every compression
algorithm's sampler drifts measurably from the dense policy where dense does not."""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.slow, pytest.mark.real_model]

QUESTIONS = ["What is 12 + 30?", "Name three primary colors.", "Solve for x: 2x + 3 = 11.",
             "Write a haiku about the sea."]


@pytest.fixture(scope="module")
def real(smollm2):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2)
    hf = AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32).eval()
    ids = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                   tokenize=True, return_dict=True)["input_ids"] for q in QUESTIONS]
    return smollm2, hf, ids


def _engine(path, **kw):
    from sglang_kvc.engine.engine import Engine

    return Engine(model_path=str(path), device="cpu", dtype="float32", max_total_tokens=8192, **kw)


def _hf_logprobs(hf, prompt: list[int], response: list[int]) -> torch.Tensor:
    """[len(response), vocab] fp64 log-softmax of HF's logits at each response position."""
    with torch.no_grad():
        logits = hf(torch.tensor([prompt + response])).logits[0, len(prompt) - 1:-1]
    return logits.double().log_softmax(-1)


def _generate(engine, ids, **params) -> list[dict]:
    return engine.generate(input_ids=ids, sampling_params=params, return_logprob=True)


def test_greedy_tokens_are_hf_argmax(real):
    path, hf, ids = real
    engine = _engine(path)
    try:
        outs = _generate(engine, ids, max_new_tokens=48, temperature=0)
    finally:
        engine.shutdown()
    for prompt, out in zip(ids, outs):
        response = out["output_ids"]
        assert len(response) >= 8
        ls = _hf_logprobs(hf, prompt, response)
        chosen = ls.gather(1, torch.tensor(response)[:, None])[:, 0]
        gap = ls.max(-1).values - chosen
        assert float(gap.max()) < 1e-4, (out["text"], gap)  # argmax, near-ties excused
        engine_lp = torch.tensor([lp for lp, _, _ in out["meta_info"]["output_token_logprobs"]],
                                 dtype=torch.float64)
        torch.testing.assert_close(engine_lp, chosen, atol=1e-4, rtol=0)


def _mean_k3(hf, ids, outs) -> float:
    """Mean over tokens of k3(π_sampler, π_dense) = r - 1 - log r, r = π_dense / π_sampler."""
    values = []
    for prompt, out in zip(ids, outs):
        response = out["output_ids"]
        sampler = torch.tensor([lp for lp, _, _ in out["meta_info"]["output_token_logprobs"]],
                               dtype=torch.float64)
        dense = _hf_logprobs(hf, prompt, response).gather(1, torch.tensor(response)[:, None])[:, 0]
        log_ratio = dense - sampler
        values.append(log_ratio.exp() - 1 - log_ratio)
    return float(torch.cat(values).mean())


def test_compressed_samplers_drift_from_the_dense_policy(real):
    path, hf, ids = real
    params = dict(max_new_tokens=96, temperature=1.0, sampling_seed=3)
    mismatch = {}
    for algo in ("none", "rkv", "snapkv", "streamingllm"):
        kw = {} if algo == "none" else dict(compress_algorithm=algo, compress_max_prompt=32,
                                            compress_max_window=4, compress_divide_length=8)
        engine = _engine(path, **kw)
        try:
            outs = _generate(engine, ids, **params)
        finally:
            engine.shutdown()
        if algo != "none":
            assert all(o["meta_info"]["compression"]["num_compressions"] > 0 for o in outs)
        mismatch[algo] = _mean_k3(hf, ids, outs)
    print("sampler-vs-dense k3:", mismatch)
    assert mismatch["none"] < 1e-6
    for algo in ("rkv", "snapkv", "streamingllm"):
        assert mismatch[algo] > 1e-3 and mismatch[algo] > 100 * mismatch["none"], mismatch
