"""Dense share and the adaptive budget on the request side: which samples of a group are asked
dense (and the engine reports them uncompressed), the per-request budget reaching the engine,
and a resumed (partial) sample keeping its dense flag."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from checkpoint_tools.tiny_models import make_tiny_model
from sglang_kvc.engine.engine import Engine
from trainer.algorithms.adaptive_budget import AdaptiveBudgetConfig, BudgetController
from trainer.rollout.engines.inprocess import EngineRollout
from trainer.rollout.engines.interface import Generation, RolloutConfig, batch_body, sample_requests
from trainer.rollout.samples.fidelity import apply_budget, budget_used, dense_rows
from trainer.rollout.partial import continuation

RKV = dict(compress_algorithm="rkv", compress_max_prompt=12, compress_divide_length=4,
           compress_max_window=3)
PROMPTS = [[5, 9, 14, 3], [7, 7, 21, 40, 2, 11]]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model("qwen2.5", tmp_path_factory.mktemp("m") / "qwen", dtype=torch.float32)


def test_first_m_of_each_group_are_asked_dense():
    cfg = RolloutConfig(seed=0, dense_per_group=1)
    reqs = sample_requests(PROMPTS, 3, cfg)
    assert [r.compress for r in reqs] == [False, True, True, False, True, True]
    assert batch_body(reqs, cfg)["compress"] == [False, True, True, False, True, True]
    assert "compress" not in batch_body(sample_requests(PROMPTS, 3, RolloutConfig()), cfg)
    dense_eval = dataclasses.replace(cfg, compress=False)
    assert batch_body(reqs, dense_eval)["compress"] == [False] * 6
    gen = Generation([1, 2], [0.0, 0.0], "", "abort", None, {})
    assert continuation(reqs[0], gen, 1).compress is False  # a resumed dense sample stays dense


def test_budget_goes_with_every_request():
    ctl = BudgetController(AdaptiveBudgetConfig(min_budget=12, max_budget=40))
    ctl.observe(0.5)  # a bad rollout: 12 -> 15
    cfg = apply_budget(ctl, RolloutConfig())
    assert batch_body(sample_requests(PROMPTS, 1, cfg), cfg)["compress_budget"] == 15
    assert apply_budget(BudgetController(None), cfg) is cfg
    assert "compress_budget" not in batch_body(sample_requests(PROMPTS, 1, RolloutConfig()),
                                               RolloutConfig())


def test_engine_reports_the_dense_share_and_the_budget(model_dir):
    cfg = RolloutConfig(max_response_len=40, seed=3, dense_per_group=1, compress_budget=16)
    with Engine(model_path=str(model_dir), device="cpu", **RKV) as eng:
        gens = EngineRollout(eng).generate(PROMPTS, 3, cfg)
    with Engine(model_path=str(model_dir), device="cpu") as eng:
        dense = EngineRollout(eng).generate(PROMPTS, 3, RolloutConfig(max_response_len=40, seed=3))
    assert dense_rows(gens).tolist() == [True, False, False, True, False, False]
    for k, (g, d) in enumerate(zip(gens, dense)):
        c = g.meta["compression"]
        if k % 3 == 0:  # the dense sample is the dense engine's sample, uncompressed
            assert c["dense"] and c["num_compressions"] == 0 and c["budget"] is None
            assert g.response_ids == d.response_ids
        else:
            assert not c["dense"] and c["budget"] == 16 and c["num_compressions"] > 0
            assert c["peak_kv_slots"] <= max(len(PROMPTS[k // 3]) + 1, 16 + 4)
    assert budget_used(gens) == {"rollout/compress_budget": 16.0}
    assert dense_rows(dense) is None
