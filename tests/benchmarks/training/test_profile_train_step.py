"""benchmarks/training/profile_train_step.py end to end on a CPU with the tiny shape: both paths and every
number reported (performance printed, never asserted: presence and sign only), and the run
path's own perf/ metrics for each phase it ran."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.launch
def test_profile_train_step_tiny_on_cpu(tmp_path):
    out = tmp_path / "p.json"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.training.profile_train_step", "--shape", "tiny",
         "--seq-len", "48", "--seqs-per-step", "8", "--max-tokens-per-gpu", "128", "256",
         "--steps", "1", "--warmup", "1", "--top", "3", "--peak-tflops", "1", "--json", str(out)],
        cwd=ROOT, text=True, capture_output=True, timeout=300,
        env={**__import__("os").environ, "PYTHONWARNINGS": "ignore"})
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    result = json.loads(out.read_text())
    assert [b["max_tokens_per_gpu"] for b in result["budgets"]] == [128, 256]
    for b in result["budgets"]:
        assert b["bench"]["tokens_per_s"]["median"] > 0 and b["bench"]["mfu"]["median"] > 0
        for phase in ("reference", "old_logp", "update"):  # the recipe's KL keeps the recompute
            assert b["run"][f"perf/{phase}_tokens_per_s"] > 0 and b["run"][f"perf/{phase}_mfu"] > 0
        assert b["run_vs_bench"] > 0 and b["breakdown"]["micro_batches_per_pass"] >= 1
    assert "run update / bench train step" in proc.stdout and "top by self_cpu" in proc.stdout
