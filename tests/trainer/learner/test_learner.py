"""The learner door (``learner/learner.py``): whether the engines, which load --hf-checkpoint
themselves, must be sent the learner's weights before the first rollout."""

from __future__ import annotations

import json
import types

import pytest
import torch

from trainer.learner.learner import Learner
from trainer.learner.model_provider import ModelConfig


def _learner(tmp_path, stored: str, held: torch.dtype, load: str | None = None) -> Learner:
    """A learner's first-push decision over an HF checkpoint stored in ``stored`` (no model
    built: the decision reads the configs alone)."""
    (tmp_path / "config.json").write_text(json.dumps({"dtype": stored}))
    learner = object.__new__(Learner)
    learner.cfg = types.SimpleNamespace(model=ModelConfig(str(tmp_path), load=load, dtype=held))
    return learner


def test_a_fresh_run_whose_engines_hold_the_same_weights_pushes_nothing(tmp_path):
    assert _learner(tmp_path, "float32", torch.float32).first_push_reason(0) is None


@pytest.mark.parametrize("start,load", [(3, None), (0, "some/torch_dist")])
def test_a_resumed_run_or_other_weights_are_pushed_without_a_reason_to_tell(tmp_path, start, load):
    assert _learner(tmp_path, "float32", torch.float32, load).first_push_reason(start) == ""


def test_a_checkpoint_the_learner_rounds_is_pushed_with_the_reason(tmp_path):
    why = _learner(tmp_path, "float32", torch.bfloat16).first_push_reason(0)
    assert "float32" in why and "bfloat16" in why
