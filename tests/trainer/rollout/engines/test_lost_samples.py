"""No sample is lost in silence: a sample that an engine's step failure ended is re-issued once
(the same seed: the same sample), and one that fails again fails the rollout with an error
naming the engine and its first error, on every rank (none is left waiting in the gather)."""

from __future__ import annotations

import os

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from checkpoint_tools.tiny_models import make_tiny_model
from sglang_kvc.engine.engine import Engine
from trainer.rollout.engines.inprocess import EngineRollout
from trainer.rollout.engines.interface import RolloutConfig, RolloutError

PROMPTS = [[5, 9, 14, 3], [7, 7, 21, 40, 2, 11], [3, 1, 4, 1, 5]]
CFG = RolloutConfig(max_response_len=12, seed=11)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model("qwen2.5", tmp_path_factory.mktemp("m") / "qwen", dtype=torch.float32)


def _failing_launches(engine, failures: int | None):
    """The engine's step launch raises ``failures`` times (None: always), as rank 1's Triton
    launch did on the wrong device."""
    launch, count = engine.runner.launch, [0]

    def broken(batch):
        count[0] += 1
        if failures is None or count[0] <= failures:
            raise ValueError("Pointer argument (at 0) cannot be accessed from Triton")
        return launch(batch)

    engine.runner.launch = broken
    return count


def test_transient_step_failure_reissues_the_same_samples(model_dir):
    with Engine(model_path=str(model_dir), device="cpu") as engine:
        clean = EngineRollout(engine).generate(PROMPTS, 2, CFG)
        count = _failing_launches(engine, failures=1)
        again = EngineRollout(engine).generate(PROMPTS, 2, CFG)
    assert count[0] > 1  # the first launch failed, the re-issue ran
    assert all(g.finish_reason != "abort" for g in again)
    assert [g.response_ids for g in again] == [g.response_ids for g in clean]
    for g, ref in zip(again, clean):
        assert g.logprobs == pytest.approx(ref.logprobs, abs=1e-5)


def test_persistent_step_failure_fails_naming_engine_and_error(model_dir):
    with Engine(model_path=str(model_dir), device="cpu") as engine:
        _failing_launches(engine, failures=None)
        with pytest.raises(RolloutError, match=r"rollout engine on cpu: 6 of 6 samples failed "
                                               r"twice; first error: engine error: Pointer arg"):
            EngineRollout(engine).generate(PROMPTS, 2, CFG)


def test_one_ranks_failing_engine_fails_every_rank(model_dir, tmp_path):
    """Two gloo ranks, an engine each; rank 1's fails every step: both ranks raise the same
    error naming engine 1, neither trains on half a batch nor hangs in the gather."""
    from checkpoint_tools.cpu_megatron import free_port

    script = Path(__file__).with_name("lost_samples_rank.py")
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                    "--master-port", str(free_port()), str(script), str(model_dir), str(tmp_path)],
                   check=True, timeout=600, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    errors = [(tmp_path / f"rank{r}.txt").read_text() for r in range(2)]
    assert errors[0] == errors[1]
    assert errors[0].startswith("rollout failed on engine 1: RolloutError: rollout engine on cpu:")
    assert "engine 0" not in errors[0] and "Pointer argument" in errors[0]
