"""The Megatron policy on the real SmolLM2-135M-Instruct (fp32, CPU, gloo ranks): response
log-probs and entropies against Hugging Face's, at TP=1 and TP=3."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from checkpoint_tools import cpu_megatron

pytestmark = [pytest.mark.slow, pytest.mark.real_model]
POLICY_TESTS = str(Path(__file__).with_name("test_policy_model.py"))
TEMPERATURE = 0.7  # test_policy_model.logprob_task's
# fp32 through 30 layers, Megatron's kernels vs HF's: measured max |diff| ~1e-5
TOL = 2e-4


def _samples(path: Path):
    """Chat prompts and HF's greedy answers (real text, not random tokens)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainer.learner.packing import Sample

    tok = AutoTokenizer.from_pretrained(path)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    samples = []
    for q in ("What is 7 times 8?", "Give one word that rhymes with cat.", "Count from 1 to 5."):
        ids = tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                      tokenize=True, return_dict=True)["input_ids"]
        with torch.no_grad():
            out = hf.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False)[0, len(ids):]
        samples.append(Sample(list(ids), out.tolist()))
    return hf, samples


def _reference(hf, samples):
    logps, ents = [], []
    for s in samples:
        with torch.no_grad():
            rows = (hf(torch.tensor([s.prompt_ids + s.response_ids])).logits[0] / TEMPERATURE
                    ).log_softmax(-1)[len(s.prompt_ids) - 1:-1]
        logps.append(rows.gather(-1, torch.tensor(s.response_ids)[:, None])[:, 0])
        ents.append(-(rows.exp() * rows).sum(-1))
    return logps, ents


@pytest.mark.parametrize("tp", [1, 3])  # 9 query / 3 KV heads: TP 1 or 3
def test_megatron_logprobs_match_hf(smollm2, tmp_path, tp):
    hf, samples = _samples(smollm2)
    want_lp, want_ent = _reference(hf, samples)
    lps, ents = cpu_megatron.run_on_ranks((POLICY_TESTS, "logprob_task"), tp, str(smollm2),
                                          str(tmp_path / "mcore"), tp, samples, 16)[0]
    for got, want in zip(lps, want_lp):
        torch.testing.assert_close(got, want, atol=TOL, rtol=0)
    for got, want in zip(ents, want_ent):
        torch.testing.assert_close(got, want, atol=TOL, rtol=0)
