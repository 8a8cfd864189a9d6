"""bench_sampler_budget on a tiny model: dense holds prompt + response KV slots per sample, a
small R-KV budget holds fewer (but at least the prompt: no compression at prefill), and the
rewards are the gsm8k scorer's on the returned JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_sweep_on_a_tiny_model(tiny_model_factory, tmp_path):
    out = tmp_path / "sweep.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_sampler_budget.py"),
                           "--model-dir", str(tiny_model_factory("llama3")), "--budgets", "0", "8",
                           "--window", "2", "--divide-length", "2", "--prompts", "3", "--samples", "2",
                           "--max-new-tokens", "24", "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    dense, rkv = json.loads(out.read_text())
    assert dense["peak_kv_slots"] == dense["dense_peak_kv_slots"] and dense["samples"] == 6
    assert rkv["peak_kv_slots"] < rkv["dense_peak_kv_slots"]
    assert all(0.0 <= r["reward"] <= 1.0 for r in (dense, rkv))
    assert "budget     8: reward" in proc.stdout
