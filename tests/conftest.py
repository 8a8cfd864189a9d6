"""Shared fixtures: tiny random HF checkpoints, built once per test session."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

warnings.filterwarnings("ignore", message=".*Transformer Engine and Apex are not installed.*")

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"


@pytest.fixture(scope="session")
def tiny_model_factory(tmp_path_factory):
    """``factory(family, dtype=torch.float32, **kwargs) -> Path``, cached per argument set."""
    import torch

    from checkpoint_tools.tiny_models import make_tiny_model

    cache: dict = {}

    def factory(family: str, dtype=torch.float32, **kwargs) -> Path:
        key = (family, dtype, tuple(sorted((k, repr(v)) for k, v in kwargs.items())))
        if key not in cache:
            out = tmp_path_factory.mktemp(f"tiny-{family}")
            cache[key] = make_tiny_model(family, out, dtype=dtype, **kwargs)
        return cache[key]

    return factory
