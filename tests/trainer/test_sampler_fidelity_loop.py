"""End-to-end (CPU, tiny model): a run with the prompt kept, an adaptive budget and a dense share
logs the budget each rollout used and moves it, with one of four samples per group dense."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_adaptive_budget_dense_share_and_kept_prompt(tiny_model_factory, tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"add {i % 9 + 1} {i % 5 + 2}\n",
                                        "label": str(i % 9 + i % 5 + 3)}) + "\n" for i in range(16)))
    argv = ["--hf-checkpoint", str(tiny_model_factory("qwen2.5")), "--prompt-data", str(data),
            "--log-dir", str(tmp_path / "logs"), "--num-rollout", "3",
            "--rollout-batch-size", "2", "--n-samples-per-prompt", "4",
            "--rollout-max-response-len", "24", "--lr", "1e-3", "--kl-loss-coef", "0",
            "--rm-type", "math", "--max-tokens-per-gpu", "512", "--seed", "7",
            "--sglang-max-total-tokens", "4096", "--reward-workers", "1",
            "--sglang-compress-algorithm", "snapkv", "--sglang-compress-max-prompt", "4",
            "--sglang-compress-divide-length", "2", "--sglang-compress-max-window", "2",
            "--sglang-compress-keep-prompt", "--n-dense-samples-per-prompt", "1",
            # a random tiny model is far from its sparse self: the budget must rise
            "--adaptive-budget-max", "6", "--adaptive-budget-target", "0.001"]
    proc = subprocess.run([sys.executable, "-m", "trainer.train", *argv], cwd=ROOT, text=True,
                          capture_output=True, timeout=600,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    rows = [json.loads(x) for x in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert [r["rollout/compress_budget"] for r in rows] == [4.0, 5.0, 6.0]
    assert [r["rollout/compress_budget_next"] for r in rows] == [5.0, 6.0, 6.0]
    for r in rows:
        assert r["rollout/dense_sample_fraction"] == 0.25
        assert r["rollout/sampler_low_tail_fraction"] > 0.001
        assert r["train_rollout_logprob_abs_diff_dense"] < 1e-3  # dense samples: numerics only
        assert 0 < r["dense_token_fraction"] < 1
