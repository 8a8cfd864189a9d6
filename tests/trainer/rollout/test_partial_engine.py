"""Partial rollouts on the in-process engine with R-KV: an interrupted compressed request is
continued as a new request (prompt + its tokens), so its eviction state is recomputed, not kept:
the continuation is exactly a fresh compressed request of prompt + head."""

from __future__ import annotations

import dataclasses
import time

import pytest
import torch

from checkpoint_tools.tiny_models import make_tiny_model
from sglang_kvc.engine.engine import Engine
from trainer.rollout.async_rollout import AsyncRollouts, WeightGate
from trainer.rollout.backends import EngineRollout, RolloutConfig
from trainer.rollout.partial import ResumableBackend, _seed

PROMPTS = [[5, 9, 14, 3], [7, 7, 21, 40, 2, 11]]
RKV = dict(compress_algorithm="rkv", compress_max_prompt=12, compress_divide_length=4,
           compress_max_window=3)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model("qwen2.5", tmp_path_factory.mktemp("m") / "qwen", dtype=torch.float32)


def test_resumed_compressed_request_is_a_fresh_request_of_prompt_and_head(model_dir):
    cfg = RolloutConfig(max_response_len=600, seed=3)
    with Engine(model_path=str(model_dir), device="cpu", **RKV) as engine:
        inner = EngineRollout(engine)
        full = inner.generate(PROMPTS, 2, cfg, ignore_eos=True)  # uninterrupted
        gate = WeightGate(0, 1, interrupt=lambda: engine.abort_request(abort_all=True))
        backend = ResumableBackend(inner, gate)
        producer = AsyncRollouts(lambda r: backend.generate(PROMPTS, 2, cfg, ignore_eos=True),
                                 gate, range(1)).start()
        time.sleep(0.3)
        with gate.update(1):  # a push (of the same weights): interrupts the requests in flight
            pass
        gens = producer.get(0)
        producer.close()
        assert gate.interruptions == 1
        resumed = [k for k, g in enumerate(gens) if g.meta.get("resumed_at")]
        assert resumed, "no request was in flight at the push"
        for k, g in enumerate(gens):
            assert len(g.response_ids) == 600 and len(g.logprobs) == 600  # once, complete
        for k in resumed:
            at = gens[k].meta["resumed_at"][0]
            head = gens[k].response_ids[:at]
            assert head == full[k].response_ids[:at]  # same seed, same weights: same tokens
            fresh = inner.generate([PROMPTS[k // 2] + head], 1,
                                   dataclasses.replace(cfg, seed=_seed(cfg, k, 1),
                                                       max_response_len=600 - at),
                                   ignore_eos=True)[0]
            assert gens[k].response_ids[at:] == fresh.response_ids
            # batch-mates change the float sums, not the draws
            assert max(abs(a - b) for a, b in zip(gens[k].logprobs[at:], fresh.logprobs)) < 1e-4
            assert fresh.meta["compression"]["num_compressions"] > 0  # compressed anew
