"""Random Hugging Face checkpoints of real models' shapes (no hub needed): the one
``build_checkpoint`` every benchmark builds its model with.

A shape is a family of ``checkpoint_tools.tiny_models`` and the config values that make it that
model's size: ``tiny``, ``smollm2-135m`` here, and the Qwen2.5 sizes of ``tiny_models.SHAPES``.
The checkpoint holds the tiny tokenizer too (the trainer reads it; the engine benchmarks feed
token ids and skip it).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

SMOLLM2_135M = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                    num_attention_heads=9, num_key_value_heads=3, vocab_size=49152,
                    max_position_embeddings=8192, rope_theta=100000.0, rms_norm_eps=1e-5,
                    tie_word_embeddings=True, rope_scaling=None)
# family of checkpoint_tools.tiny_models, and the config values that give the shape
SHAPES = {"tiny": ("qwen2.5", {}), "smollm2-135m": ("llama3", SMOLLM2_135M)}


def shape_spec(shape: str) -> tuple[str, dict]:
    from checkpoint_tools.tiny_models import SHAPES as TINY_SHAPES

    if shape in SHAPES:
        return SHAPES[shape]
    return "qwen2.5", TINY_SHAPES[shape]


def build_checkpoint(shape: str, out: Path, seed: int = 0, dtype: torch.dtype | None = None) -> Path:
    """A random HF checkpoint of ``shape`` in ``out`` (``dtype``: by default bf16 on a GPU, fp32
    on a CPU, the trainer's dtype; the engine benchmarks ask for bf16)."""
    from checkpoint_tools.tiny_models import make_tiny_model

    family, overrides = shape_spec(shape)
    dtype = dtype or (torch.bfloat16 if torch.cuda.is_available() else torch.float32)
    return make_tiny_model(family, out, dtype=dtype, seed=seed, overrides=overrides)


def param_count(checkpoint: Path) -> int:
    """Parameters saved in ``checkpoint`` (a tied embedding once, as ``model.parameters()``)."""
    from safetensors import safe_open

    total = 0
    for path in sorted(Path(checkpoint).glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            total += sum(math.prod(f.get_slice(name).get_shape()) for name in f.keys())
    return total
