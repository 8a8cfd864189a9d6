"""``python -m trainer.quickstart --model smollm2`` as users run it, on the real model (CPU,
one rollout): the run completes, R-KV bounds every sample's KV at budget + buffer, and the
rewards are those of the gsm8k-style grader on the one-digit arithmetic task (and of the chain
scorer with ``--task chain``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.real_model]
ROOT = Path(__file__).resolve().parents[2]


def test_quickstart_smollm2_one_rollout(smollm2, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "trainer.quickstart", "--model", "smollm2",
                           "--model-dir", str(smollm2), "--num-rollout", "1", "--workdir",
                           str(tmp_path), "--save-debug-rollout-data",
                           str(tmp_path / "rollout{rollout_id}.jsonl")],
                          cwd=ROOT, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "[quickstart] reward mean" in proc.stdout
    (row,) = [json.loads(x) for x in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert row["kv_peak_slots_max"] <= max(row["prompt_len_mean"], 40 + 16) + 1
    assert row["kv_compressions_per_sample"] > 0
    from evaluation.grader import score_gsm8k

    samples = [json.loads(x) for x in (tmp_path / "rollout0.jsonl").read_text().splitlines()]
    assert len(samples) == 32
    assert [s["reward"] for s in samples] == [score_gsm8k(s["response"], s["label"]) for s in samples]
    assert row["reward_mean"] == pytest.approx(sum(s["reward"] for s in samples) / 32)


def test_quickstart_smollm2_chain_one_rollout(smollm2, tmp_path):
    """``--task chain``: the warm-up runs (2 steps here), the trainer takes its fp32 checkpoint,
    and the rewards are the chain scorer's."""
    proc = subprocess.run([sys.executable, "-m", "trainer.quickstart", "--model", "smollm2",
                           "--task", "chain", "--warmup-steps", "2", "--model-dir", str(smollm2),
                           "--num-rollout", "1", "--workdir", str(tmp_path),
                           "--save-debug-rollout-data", str(tmp_path / "rollout{rollout_id}.jsonl")],
                          cwd=ROOT, capture_output=True, text=True, timeout=1800,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "[quickstart] warm-up: 2 supervised steps" in proc.stdout
    (row,) = [json.loads(x) for x in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert row["kv_compressions_per_sample"] > 0
    from evaluation.grader import score_chain

    samples = [json.loads(x) for x in (tmp_path / "rollout0.jsonl").read_text().splitlines()]
    assert len(samples) == 32
    assert [s["reward"] for s in samples] == [score_chain(s["response"], s["label"]) for s in samples]
