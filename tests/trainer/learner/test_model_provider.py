"""Whether the trainer must push its weights before the first rollout: the engines load
``--hf-checkpoint`` themselves, which serves the trainer's weights only when the trainer holds
them without rounding (on a GPU an fp32 warm-up trained in bf16 lost half its reward)."""

import json

import pytest
import torch

from trainer.learner.model_provider import ModelConfig, rounds_checkpoint


def _checkpoint(tmp_path, **config):
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


@pytest.mark.parametrize("key", ["dtype", "torch_dtype"])  # transformers 5 / 4 spelling
def test_fp32_checkpoint_held_in_bf16_is_rounded(tmp_path, key):
    cfg = ModelConfig(_checkpoint(tmp_path, **{key: "float32"}), dtype=torch.bfloat16)
    assert "float32" in rounds_checkpoint(cfg) and "bfloat16" in rounds_checkpoint(cfg)


@pytest.mark.parametrize("stored,held", [("bfloat16", torch.float32), ("float32", torch.float32),
                                         ("bfloat16", torch.bfloat16)])
def test_checkpoint_held_exactly_needs_no_push(tmp_path, stored, held):
    assert rounds_checkpoint(ModelConfig(_checkpoint(tmp_path, dtype=stored), dtype=held)) is None


def test_fp16_and_bf16_round_each_other(tmp_path):
    cfg = ModelConfig(_checkpoint(tmp_path, dtype="float16"), dtype=torch.bfloat16)
    assert rounds_checkpoint(cfg) is not None


def test_a_torch_dist_load_is_pushed_anyway_and_a_missing_dtype_is_no_reason(tmp_path):
    fp32 = _checkpoint(tmp_path, dtype="float32")
    assert rounds_checkpoint(ModelConfig(fp32, load="somewhere", dtype=torch.bfloat16)) is None
    (tmp_path / "config.json").write_text("{}")
    assert rounds_checkpoint(ModelConfig(str(tmp_path), dtype=torch.bfloat16)) is None
