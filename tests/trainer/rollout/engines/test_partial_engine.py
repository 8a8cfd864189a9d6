"""Partial rollouts on the in-process engine with R-KV: an interrupted compressed request is
continued as a new request (prompt + its tokens), so its eviction state is recomputed, not kept:
the continuation is exactly a fresh compressed request of prompt + head."""

from __future__ import annotations

import pytest
import torch

from checkpoint_tools.tiny_models import make_tiny_model
from sglang_kvc.engine.engine import Engine
from tests.sglang_kvc.hold import hold_after_decode_steps, wait_until
from trainer.rollout.async_rollout import AsyncRollouts, WeightGate
from trainer.rollout.engines.inprocess import EngineRollout
from trainer.rollout.engines.interface import RolloutConfig, SampleRequest
from trainer.rollout.partial import _SEED_STRIDE, ResumableBackend

PROMPTS = [[5, 9, 14, 3], [7, 7, 21, 40, 2, 11]]
RKV = dict(compress_algorithm="rkv", compress_max_prompt=12, compress_divide_length=4,
           compress_max_window=3)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model("qwen2.5", tmp_path_factory.mktemp("m") / "qwen", dtype=torch.float32)


def _push_after_decode_steps(engine, gate: WeightGate, steps: int) -> None:
    """A push (of the same weights) once the engine has decoded `steps` more steps; the engine is
    held there until the push is done, so the requests are in flight whatever the machine's speed."""
    with hold_after_decode_steps(engine, steps):
        wait_until(lambda: engine.scheduler.paused, what="the engine held")
        with gate.update(1):
            pass


def _interrupted_run(engine, inner, prompts, n, cfg):
    gate = WeightGate(0, 1, interrupt=lambda: engine.abort_request(abort_all=True))
    backend = ResumableBackend(inner, gate)
    producer = AsyncRollouts(lambda r: backend.generate(prompts, n, cfg, ignore_eos=True),
                             gate, range(1)).start()
    _push_after_decode_steps(engine, gate, 100)
    gens = producer.get(0)
    producer.close()
    assert gate.interruptions == 1
    return gens


def _fresh(inner, prompt, head, cfg, index):
    """A new request of prompt + head for the tokens left, seeded as a first continuation."""
    seed = (cfg.seed + index + _SEED_STRIDE) % 2**31
    request = SampleRequest.of(prompt + head, cfg, seed, ignore_eos=True,
                               max_new_tokens=cfg.max_response_len - len(head))
    return inner.run([request], cfg)[0]


def test_batched_samples_resume_once_complete_and_compressed_anew(model_dir):
    cfg = RolloutConfig(max_response_len=600, seed=3)
    with Engine(model_path=str(model_dir), device="cpu", **RKV) as engine:
        inner = EngineRollout(engine)
        full = inner.generate(PROMPTS, 2, cfg, ignore_eos=True)  # uninterrupted
        gens = _interrupted_run(engine, inner, PROMPTS, 2, cfg)
    resumed = [k for k, g in enumerate(gens) if g.meta.get("resumed_at")]
    assert resumed, "no request was in flight at the push"
    for g in gens:
        assert len(g.response_ids) == 600 and len(g.logprobs) == 600  # once, complete
    for k in resumed:
        at = gens[k].meta["resumed_at"][0]
        assert 0 < at < 600
        assert gens[k].response_ids[:at] == full[k].response_ids[:at]  # same seed and batch
        assert gens[k].meta["compression"]["num_compressions"] > 0  # the tail compressed anew


def test_resumed_compressed_request_is_a_fresh_request_of_prompt_and_head(model_dir):
    """Alone in the engine, the continuation and the fresh request run the same shapes, so
    they draw the same tokens (in a batch, batch-mates change float sums, which can flip a draw
    near a CDF boundary or an eviction near a score tie: seen once in ~600 tokens). Their
    logprobs agree to float32 rounding, not bit for bit: CI's CPU gave 5e-7 apart where this
    one gives 0 (its kernels pick other reduction orders)."""
    cfg = RolloutConfig(max_response_len=600, seed=3)
    prompt = PROMPTS[1]
    with Engine(model_path=str(model_dir), device="cpu", **RKV) as engine:
        inner = EngineRollout(engine)
        full = inner.generate([prompt], 1, cfg, ignore_eos=True)[0]
        gen = _interrupted_run(engine, inner, [prompt], 1, cfg)[0]
        assert len(gen.meta.get("resumed_at", [])) == 1, "the request was not in flight at the push"
        at = gen.meta["resumed_at"][0]
        head = gen.response_ids[:at]
        assert head == full.response_ids[:at]
        torch.testing.assert_close(torch.tensor(gen.logprobs[:at]), torch.tensor(full.logprobs[:at]),
                                   atol=1e-5, rtol=0)
        fresh = _fresh(inner, prompt, head, cfg, 0)
    assert gen.response_ids[at:] == fresh.response_ids
    torch.testing.assert_close(torch.tensor(gen.logprobs[at:]), torch.tensor(fresh.logprobs),
                               atol=1e-5, rtol=0)
    assert fresh.meta["compression"]["num_compressions"] > 0  # compressed anew
    # not the uninterrupted request's tokens: the continuation draws with its own seed
    assert gen.response_ids[at:] != full.response_ids[at:]
