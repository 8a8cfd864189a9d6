"""benchmarks/correction_grid.py: a grid of quickstart runs side by side, and its table."""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import correction_grid as grid  # noqa: E402


def _write_run(folder: Path, rows: list[dict]) -> None:
    (folder / "logs").mkdir(parents=True)
    (folder / "logs" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_configs_parse_and_bad_ones_are_named():
    run = grid.parse_config("rkv:128:sparse_rl", 2)
    assert run.flags() == ["--compress-algorithm", "rkv", "--kv-budget", "128", "--mis-preset", "sparse_rl"]
    assert run.name == "rkv-128-sparse_rl-s2" and grid.parse_config("dense", 1).name == "dense-s1"
    with pytest.raises(ValueError, match="ALGORITHM:BUDGET:PRESET"):
        grid.parse_config("rkv:big", 1)
    with pytest.raises(ValueError, match="REPLAY one of"):
        grid.parse_config("rkv:128:disabled:replay", 1)
    replay = grid.parse_config("rkv:128:disabled:train-sparse-policy", 1)
    assert replay.flags()[-1] == "--train-sparse-policy"
    assert replay.name == "rkv-128-disabled-train-sparse-policy-s1"


def test_run_folders_name_their_config(tmp_path):
    configs = ["dense", "rkv:128:sparse_rl", "snapkv:192:decoupled_token_is",
               "rkv:128:disabled:train-sparse-policy", "rkv:96:sparse_rl:sparse-recompute"]
    runs = [grid.parse_config(c, 3) for c in configs]
    for run in runs:
        _write_run(tmp_path / run.name, [{"step": 1}])
    assert sorted(grid.discover(tmp_path), key=lambda r: r.name) == sorted(runs, key=lambda r: r.name)


def test_table_against_hand_computed_values(tmp_path):
    """Two seeds of dense and of one R-KV config: final dense-eval scores as mean ± s.e., the
    compressed run's pool peak over dense's at the same rollout (max over the run) and over dense's
    largest peak."""
    for seed, (d, c) in {1: (0.5, 0.4), 2: (0.7, 0.8)}.items():
        _write_run(tmp_path / f"dense-s{seed}", [
            {"step": 0, "eval/chain/score": 0.1},
            {"step": 1, "reward_mean": 0.3, "kv_pool_peak_used": 1000.0, "response_len_mean": 250},
            {"step": 2, "reward_mean": 0.5, "kv_pool_peak_used": 800.0, "response_len_mean": 260,
             "eval/chain/score": d}])
        _write_run(tmp_path / f"rkv-128-sparse_rl-s{seed}", [
            {"step": 1, "reward_mean": 0.2, "kv_pool_peak_used": 400.0, "k3_kl": 0.1,
             "rejected_fraction": 0.2, "response_len_mean": 240},
            {"step": 2, "reward_mean": 0.4, "kv_pool_peak_used": 360.0 * seed, "k3_kl": 0.3,
             "rejected_fraction": 0.1, "response_len_mean": 250,
             "eval/chain_dense/score": c, "eval/chain/score": 0.3}])
    runs = grid.discover(tmp_path)
    assert sorted(r.name for r in runs) == ["dense-s1", "dense-s2", "rkv-128-sparse_rl-s1",
                                            "rkv-128-sparse_rl-s2"]
    lines = grid.table(grid.collect(runs, tmp_path))
    dense_row = next(x for x in lines if x.startswith("| dense"))
    rkv_row = next(x for x in lines if x.startswith("| rkv:128:sparse_rl"))
    # dense finals 0.5, 0.7: mean 0.6, s.e. sqrt(0.02 / 2) = 0.1
    assert "| 0.600 ± 0.100 |" in dense_row
    # R-KV dense-eval finals 0.4, 0.8: 0.6 ± 0.2; sparse eval 0.3; k3 mean 0.2; pool: seed 1
    # max(400/1000, 360/800) = 0.45, seed 2 max(0.4, 720/800 = 0.9) = 0.9: 0.675 ± 0.225
    cells = [c.strip() for c in rkv_row.strip("|").split("|")]
    assert cells[3] == "0.600 ± 0.200" and cells[5] == "0.300 ± 0.000"
    assert cells[8] == "0.200 ± 0.000" and cells[-2] == "0.68 ± 0.23"
    # provisioned: seed 1 max 400 / dense max 1000 = 0.4, seed 2 720 / 1000 = 0.72: 0.56 ± 0.16
    assert cells[-1] == "0.56 ± 0.16"
    assert math.isnan(grid.pool_fraction(grid.collect(runs, tmp_path)[2], None))


def test_report_cli_writes_metrics_and_plot(tmp_path):
    _write_run(tmp_path / "runs" / "dense-s1", [{"step": 1, "reward_mean": 0.3, "kv_pool_peak_used": 10.0}])
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "correction_grid.py"), "report",
                          str(tmp_path / "runs"), "--out", str(tmp_path / "data"), "--plot",
                          str(tmp_path / "grid.png")], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "data" / "dense-s1.jsonl").is_file() and (tmp_path / "grid.png").stat().st_size > 0
    empty = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "correction_grid.py"), "report",
                            str(tmp_path / "data")], capture_output=True, text=True, cwd=ROOT)
    assert empty.returncode == 2 and "no runs" in empty.stderr


@pytest.mark.slow
def test_grid_runs_two_configs_side_by_side(tmp_path):
    """The tiny quickstart, dense and R-KV with the correction, one rollout each, two at once."""
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "correction_grid.py"), "run",
                          "--out", str(tmp_path), "--model", "tiny", "--task", "arith",
                          "--configs", "dense", "rkv:20:sparse_rl", "--seeds", "0",
                          "--num-rollout", "1", "--eval-interval", "1", "--eval-prompts", "4",
                          "--eval-samples", "2", "--poll", "5", "--parallel", "2"],
                         capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "| dense |" in out.stdout and "| rkv:20:sparse_rl |" in out.stdout
    rows = grid.read_rows(tmp_path / "rkv-20-sparse_rl-s0")
    assert rows[0]["step"] == 0 and "eval/arith_dense/score" in rows[0]
    assert "eval/arith_t1_dense/pass@2" in rows[-1] and "k3_kl" in rows[-1]


def test_compressed_flags_reach_the_compressed_runs_only(tmp_path):
    args = argparse.Namespace(
        model="smollm2", task="chain", out=tmp_path, num_rollout=60, lr=1e-5, eval_interval=10,
        eval_samples=4, model_dir=None, extra=["--sglang-max-total-tokens", "81920"],
        compressed_flags=["--sglang-max-total-tokens", "20480", "--sglang-compress-prompt"])
    dense = grid.command(grid.parse_config("dense", 1), args, tmp_path / "eval.jsonl")
    rkv = grid.command(grid.parse_config("rkv:128:sparse_rl", 1), args, tmp_path / "eval.jsonl")
    assert "--sglang-compress-prompt" not in dense and dense[-2:] == ["--sglang-max-total-tokens", "81920"]
    # argparse keeps a repeated flag's last value: the compressed runs' pool is the smaller one
    assert rkv[-3:] == ["--sglang-max-total-tokens", "20480", "--sglang-compress-prompt"]
    from trainer.arguments import build_parser

    # the trainer's flags as the quickstart passes them on: the last value of a repeated flag wins
    tail = build_parser().parse_args(["--hf-checkpoint", "m", "--prompt-data", "d"] + dense[-2:] + rkv[-3:])
    assert tail.sglang_max_total_tokens == 20480 and tail.sglang_compress_prompt


def test_bad_compressed_flags_are_a_cli_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        grid.main(["run", "--out", str(tmp_path), "--compressed-flags='--sglang-compress-prompt"])
    assert e.value.code == 2 and "--compressed-flags: No closing quotation" in capsys.readouterr().err
