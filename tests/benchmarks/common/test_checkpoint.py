"""common/checkpoint.py: the one random checkpoint builder, against what the engine benchmarks
compute from their own configs (engine/throughput.py's SHAPES: prompt ids below the vocabulary,
the roofline's weights and KV bytes) and against the model Hugging Face loads back."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks.common.checkpoint import build_checkpoint, param_count, shape_spec
from benchmarks.engine.throughput import SHAPES as ENGINE_SHAPES
from checkpoint_tools.tiny_models import FAMILIES

ARCH = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads", "vocab_size", "tie_word_embeddings", "max_position_embeddings")


def test_tiny_checkpoint_is_the_engine_tiny_shape_and_its_count(tmp_path):
    from transformers import AutoModelForCausalLM

    path = build_checkpoint("tiny", tmp_path / "tiny", seed=3, dtype=torch.bfloat16)
    saved = json.loads((path / "config.json").read_text())
    engine = ENGINE_SHAPES["tiny"]().to_dict()
    assert {k: saved[k] for k in ARCH} == {k: engine[k] for k in ARCH}
    assert saved["dtype"] == "bfloat16"
    model = AutoModelForCausalLM.from_pretrained(path)
    assert param_count(path) == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("shape", ["qwen2.5-0.5b", "smollm2-135m"])
def test_engine_shapes_describe_the_built_checkpoint(shape):
    """The built config is the family's values with the shape's overrides (make_tiny_model), so
    the large shapes are compared without building 0.5B random weights."""
    family, overrides = shape_spec(shape)
    built = dict(FAMILIES[family].config, **overrides)
    engine = ENGINE_SHAPES[shape]().to_dict()
    assert {k: built[k] for k in ARCH} == {k: engine[k] for k in ARCH}
