"""A rollout config with ``compress=False`` asks a compressing engine for dense KV: its samples
equal a dense engine's (the trainer's dense evaluation runs on the rollout engine)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from checkpoint_tools.tiny_models import make_tiny_model
from sglang_kvc.engine.engine import Engine
from trainer.rollout.engines.inprocess import EngineRollout
from trainer.rollout.engines.interface import RolloutConfig


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model("qwen2.5", tmp_path_factory.mktemp("m") / "qwen", dtype=torch.float32)


def _run(model_dir, cfg, **engine_kw):
    prompts = [[5, 9, 14, 3], [7, 7, 21, 40, 2, 11]]
    with Engine(model_path=str(model_dir), device="cpu", **engine_kw) as eng:
        return EngineRollout(eng).generate(prompts, 2, cfg)


def test_dense_requests_on_a_compressing_engine(model_dir):
    cfg = RolloutConfig(max_response_len=40, seed=3)
    rkv = dict(compress_algorithm="rkv", compress_max_prompt=12, compress_divide_length=4,
               compress_max_window=3)
    dense = _run(model_dir, cfg)
    asked_dense = _run(model_dir, dataclasses.replace(cfg, compress=False), **rkv)
    sparse = _run(model_dir, cfg, **rkv)
    for d, a in zip(dense, asked_dense):
        assert a.response_ids == d.response_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, d.logprobs)) < 1e-5
        assert a.meta["compression"]["num_compressions"] == 0
    assert all(s.meta["compression"]["num_compressions"] > 0 for s in sparse)
    assert [s.response_ids for s in sparse] != [d.response_ids for d in dense]
