"""benchmarks/studies/inference_frontier.py: checkpoints evaluated greedily, dense and compressed at
each budget, their accuracy against the KV pool peak."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.studies import inference_frontier as frontier

ROOT = Path(__file__).resolve().parents[3]

DIVIDE = 4  # the tiny model's --sglang-compress-divide-length (trainer.quickstart.COMPRESS_SHAPE)


def _run(tmp_path: Path, *flags: str, timeout: int = 300) -> tuple[dict, str]:
    proc = subprocess.run([sys.executable, "-m", "benchmarks.studies.inference_frontier", "--out", str(tmp_path), "--model", "tiny", *flags],
                          capture_output=True, text=True, cwd=ROOT, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((tmp_path / "frontier.json").read_text()), proc.stdout


def test_tiny_frontier_rows_and_pool_bounds(tmp_path):
    """A random tiny model, 8 prompts, R-KV and SnapKV at two budgets, prompt kept and compressed:
    9 rows; dense is its own reference; a compressed pass holds at most B + N slots a sample
    (plus its prompt when kept), summed over the batch."""
    data, out = _run(tmp_path, "--budgets", "24", "32", "--prompts", "8")
    rows = data["rows"]
    assert len(rows) == 9 and len([x for x in out.splitlines() if x.startswith("| tiny |")]) == 9
    assert out.count("[frontier +") == 9 and "keeps 90% of dense" in out
    dense = rows[0]
    assert (dense["algorithm"], dense["budget"], dense["pool_fraction"]) == ("dense", None, 1.0)
    n, prompt_tokens = dense["prompts"], dense["prompt_tokens"]
    assert n == 8 and dense["preemptions"] == 0
    assert {(r["algorithm"], r["budget"], r["prompt"]) for r in rows[1:]} == {
        (a, b, m) for a in ("rkv", "snapkv") for b in (24, 32) for m in ("keep", "compress")}
    for r in rows[1:]:
        # the prompts (19 tokens) fit under B + N, so the budget is what binds
        assert r["prompt_tokens_max"] + 1 <= r["budget"] + DIVIDE
        by_hand = n * (r["budget"] + DIVIDE) + (prompt_tokens if r["prompt"] == "keep" else 0)
        assert r["pool_peak"] <= by_hand and r["pool_peak"] <= r["pool_bound"], r
        assert r["pool_fraction"] <= 1.0 + 0.01 and r["preemptions"] == 0
        assert r["pool_fraction"] == pytest.approx(r["pool_peak"] / dense["pool_peak"])
    assert (tmp_path / "frontier.png").stat().st_size > 0
    assert data["meta"]["checkpoints"] == {"tiny": str(tmp_path / "tiny-model")}


def _row(checkpoint, algorithm, budget, prompt, accuracy, pool, dense_accuracy=0.5):
    return {"checkpoint": checkpoint, "algorithm": algorithm, "budget": budget, "prompt": prompt,
            "accuracy": accuracy, "se": 0.05, "of_dense": accuracy / dense_accuracy,
            "pool_fraction": pool, "pool_peak": int(pool * 1000), "response_len": 300.0}


def test_summary_names_the_smallest_budget_a_policy_lives_under():
    rows = [_row("dense", "dense", None, None, 0.5, 1.0),
            # 96 keeps 92% but 128 does not: the line lives from 192 on, not from 96
            _row("dense", "rkv", 96, "keep", 0.46, 0.4), _row("dense", "rkv", 128, "keep", 0.40, 0.45),
            _row("dense", "rkv", 192, "keep", 0.47, 0.5), _row("dense", "rkv", 256, "keep", 0.49, 0.6),
            _row("dense", "snapkv", 96, "compress", 0.1, 0.3),
            _row("dense", "snapkv", 128, "compress", 0.2, 0.35)]
    lines = frontier.summary(rows, 0.9, {"dense": 0.51})
    assert lines[0] == ("dense: dense 0.500 ± 0.050, pool peak 1000 slots; its training run's own "
                        "eval said 0.510")
    assert lines[1] == ("dense rkv, prompt kept: keeps 90% of dense at budget >= 192 (94% of dense, "
                        "pool 0.50 of dense's)")
    assert lines[2] == "dense snapkv, prompt compressed: keeps 90% of dense at no budget up to 128"
    table = frontier.table(rows)
    assert table[2] == "| dense | dense | - | - | 0.500 ± 0.050 | 100% | 1.00 | 300.0 |"
    assert table[3] == "| dense | rkv | 96 | kept | 0.460 ± 0.050 | 92% | 0.40 | 300.0 |"
    nan_dense = dict(rows[1], of_dense=math.nan)  # dense scored 0: no share, never lives
    assert frontier.smallest_living_budget([nan_dense], 0.9) is None


def test_bad_checkpoints_are_cli_errors(tmp_path, capsys):
    for argv, message in ((["--out", str(tmp_path), "warmup"], "expected NAME=DIR"),
                          (["--out", str(tmp_path), f"w={tmp_path}"], "an HF checkpoint"),
                          (["--out", str(tmp_path)], "name checkpoints"),
                          (["--out", str(tmp_path), "--model", "tiny", "--task", "chain"], "--task is for"),
                          (["--out", str(tmp_path), "--model", "tiny", "--budgets", "4", "24"],
                           "larger than the observation window (4)")):
        with pytest.raises(SystemExit) as e:
            frontier.parse_args(argv)
        assert e.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.slow
def test_train_dense_then_its_frontier(tmp_path):
    """--train-dense on the tiny model: the grid's dense run (warm-up, one rollout), its last
    trainer checkpoint exported to HF, then both checkpoints measured."""
    data, out = _run(tmp_path, "--train-dense", "1", "--budgets", "24", "--algorithms", "rkv",
                     "--prompt-modes", "keep", "--prompts", "4", "--poll", "5", timeout=900)
    meta = data["meta"]
    assert list(meta["checkpoints"]) == ["dense", "warmup"]
    hf = Path(meta["checkpoints"]["dense"])
    assert hf == tmp_path / "train" / "dense-s1" / "hf" and (hf / "tokenizer.json").is_file()
    assert Path(meta["checkpoints"]["warmup"]) == tmp_path / "train" / "dense-s1" / "model"
    assert set(meta["training_evals"]) == {"warmup", "dense"}
    assert [(r["checkpoint"], r["algorithm"]) for r in data["rows"]] == [
        ("dense", "dense"), ("dense", "rkv"), ("warmup", "dense"), ("warmup", "rkv")]
    assert "its training run's own eval said" in out and "| dense | dense | - | - |" in out
