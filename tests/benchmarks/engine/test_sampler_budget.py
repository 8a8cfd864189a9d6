"""benchmarks.engine.sampler_budget on a tiny model: dense holds prompt + response KV slots per sample, a
small R-KV budget holds fewer (but at least the prompt: no compression at prefill), and the
rewards are the gsm8k scorer's on the returned JSON; ``--task chain`` pairs the running-sum rows
with their scorer and reports lengths, truncation and GRPO signal."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.launch
def test_sweep_on_a_tiny_model(tiny_model_factory, tmp_path):
    out = tmp_path / "sweep.json"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.engine.sampler_budget",
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


def _bench():
    from benchmarks.engine import sampler_budget

    return sampler_budget


def test_tasks_pair_rows_with_their_scorer():
    bench = _bench()
    a = argparse.Namespace(task="chain", prompts=5, seed=1, chain_steps=6, chain_max_number=9,
                           chain_max_start=50, chain_pattern="random")
    rows, score = bench.task_rows(a)
    assert len(rows) == 5 and [score(r["solution"], r["label"]) for r in rows] == [1.0] * 5
    rows, score = bench.task_rows(argparse.Namespace(task="arith", prompts=5, seed=1))
    assert len(rows) == 5 and [score(f"#### {r['label']}", r["label"]) for r in rows] == [1.0] * 5


def test_chain_sweep_on_a_tiny_model(tiny_model_factory, tmp_path):
    out = tmp_path / "sweep.json"
    assert _bench().main(["--model-dir", str(tiny_model_factory("qwen2.5")), "--task", "chain",
                          "--chain-steps", "3", "--budgets", "0", "32", "--prompts", "2", "--samples", "2",
                          "--max-new-tokens", "24", "--json", str(out)]) == 0
    dense, rkv = json.loads(out.read_text())
    for r in (dense, rkv):
        assert r["samples"] == 4 and 0 <= r["reward"] <= 1 and 0 <= r["truncated"] <= 1
        assert 0 <= r["groups_with_signal"] <= 1 and r["response_len_p10"] <= r["response_len_median"] <= 24
    assert rkv["budget"] == 32 and rkv["peak_kv_slots"] <= dense["dense_peak_kv_slots"]


def test_compress_prompt_reaches_the_engine_only_when_compressing(tiny_model_factory):
    bench = _bench()
    a = argparse.Namespace(model_dir=str(tiny_model_factory("llama3")), prompts=2, samples=2,
                           algorithm="rkv", divide_length=2, window=2, compress_prompt=True)
    assert bench.engine_args(a, 8, 4096).compress_prompt is True
    assert bench.engine_args(a, 0, 4096).compress_algorithm in (None, "none")  # dense: nothing
    a.compress_prompt = False
    assert bench.engine_args(a, 8, 4096).compress_prompt is False
