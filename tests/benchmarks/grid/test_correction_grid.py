"""benchmarks/grid/correction_grid.py: a grid of quickstart runs side by side, and its table."""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.grid import correction_grid as grid

ROOT = Path(__file__).resolve().parents[3]


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
    out = subprocess.run([sys.executable, "-m", "benchmarks.grid.correction_grid", "report",
                          str(tmp_path / "runs"), "--out", str(tmp_path / "data"), "--plot",
                          str(tmp_path / "grid.png")], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "data" / "dense-s1.jsonl").is_file() and (tmp_path / "grid.png").stat().st_size > 0
    # the copied metrics are a grid of their own (<config>-s<seed>.jsonl): reported the same way
    copied = subprocess.run([sys.executable, "-m", "benchmarks.grid.correction_grid", "report",
                             str(tmp_path / "data")], capture_output=True, text=True, cwd=ROOT)
    assert copied.returncode == 0 and "| dense | 1 |" in copied.stdout, copied.stderr
    (tmp_path / "empty").mkdir()
    empty = subprocess.run([sys.executable, "-m", "benchmarks.grid.correction_grid", "report",
                            str(tmp_path / "empty")], capture_output=True, text=True, cwd=ROOT)
    assert empty.returncode == 2 and "no runs" in empty.stderr


@pytest.mark.slow
def test_grid_runs_two_configs_side_by_side(tmp_path):
    """The tiny quickstart, dense and R-KV with the correction, one rollout each, two at once."""
    out = subprocess.run([sys.executable, "-m", "benchmarks.grid.correction_grid", "run",
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


def test_variants_name_their_runs_apart(tmp_path):
    """Runs that differ only in flags: ``+NAME`` picks a ``--variant NAME=FLAGS`` set, added last
    to the run's command, and the name parses back from the run folder."""
    run = grid.parse_config("rkv:192:sparse_rl+adaptive+share", 2)
    assert run.variants == ("adaptive", "share") and run.name == "rkv-192-sparse_rl+adaptive+share-s2"
    assert grid.parse_config("dense+keep", 1).name == "dense+keep-s1"
    with pytest.raises(ValueError, match="variant name 'keep-prompt'"):
        grid.parse_config("rkv:192:sparse_rl+keep-prompt", 1)
    variants = grid.parse_variants(["adaptive=--adaptive-budget-max 512",
                                    "share=--n-dense-samples-per-prompt 2"])
    assert variants == {"adaptive": ["--adaptive-budget-max", "512"],
                        "share": ["--n-dense-samples-per-prompt", "2"]}
    for bad in (["adaptive"], ["a-b=--x"], ["a=--x", "a=--y"]):
        with pytest.raises(ValueError, match="NAME=FLAGS"):
            grid.parse_variants(bad)
    args = argparse.Namespace(
        model="smollm2", task="chain", out=tmp_path, num_rollout=60, lr=1e-5, eval_interval=10,
        eval_samples=4, model_dir=None, extra=["--seed-extra"], compressed_flags=["--sglang-compress-prompt"],
        variants=variants)
    cmd = grid.command(run, args, tmp_path / "eval.jsonl")
    assert cmd[-5:] == ["--sglang-compress-prompt", "--adaptive-budget-max", "512",
                        "--n-dense-samples-per-prompt", "2"]
    assert str(tmp_path / run.name) in cmd
    configs = ["dense", "dense+keep", "rkv:192:sparse_rl", "rkv:192:sparse_rl+adaptive",
               "rkv:192:disabled:train-sparse-policy+share", "rkv:256:sparse_rl+adaptive+share"]
    runs = [grid.parse_config(c, 3) for c in configs]
    for r in runs:
        _write_run(tmp_path / r.name, [{"step": 1}])
    assert sorted(grid.discover(tmp_path), key=lambda r: r.name) == sorted(runs, key=lambda r: r.name)
    # the pool reference is the plain dense run, not a dense variant
    assert grid.dense_by_seed(grid.collect(runs, tmp_path))[3].run.config == "dense"


def test_unknown_variant_is_a_cli_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        grid.main(["run", "--out", str(tmp_path), "--configs", "dense", "rkv:192:sparse_rl+adaptive",
                   "--variant", "share=--n-dense-samples-per-prompt 2"])
    assert e.value.code == 2 and "variant(s) adaptive have no --variant" in capsys.readouterr().err


def _pareto_runs(tmp_path: Path) -> list:
    """Two seeds of dense and of two compressed configs: final dense-eval and sparse-eval
    greedy scores, pool peaks against dense's."""
    finals = {"dense": [(0.6, 0.6, 1000.0), (0.4, 0.4, 1000.0)],
              "rkv-128-sparse_rl": [(0.3, 0.1, 300.0), (0.5, 0.3, 500.0)],
              "rkv-192-sparse_rl+adaptive": [(0.2, 0.2, 600.0), (0.2, 0.2, 600.0)]}
    for config, seeds in finals.items():
        for seed, (dense_eval, sparse_eval, peak) in enumerate(seeds, 1):
            last = {"step": 2, "kv_pool_peak_used": peak, "eval/chain/score": sparse_eval}
            if config != "dense":
                last["eval/chain_dense/score"] = dense_eval
            _write_run(tmp_path / f"{config}-s{seed}", [{"step": 1, "kv_pool_peak_used": peak / 2}, last])
    return grid.collect(grid.discover(tmp_path), tmp_path)


def test_pareto_points_and_front_on_synthetic_runs(tmp_path):
    points = {p["config"]: p for p in grid.pareto_points(_pareto_runs(tmp_path))}
    dense, r128 = points["dense"], points["rkv:128:sparse_rl"]
    adaptive = points["rkv:192:sparse_rl+adaptive"]
    # dense: its own eval both ways, 0.6 and 0.4: 0.5 ± sqrt(0.02 / 2) = 0.1; pool 1.0 ± 0
    assert dense["pool"] == 1.0 and dense["dense"] == pytest.approx(0.5)
    assert dense["dense_se"] == pytest.approx(0.1)
    assert dense["sparse"] == pytest.approx(0.5) and dense["seeds"] == 2
    # R-KV 128: pools 0.3 and 0.5: 0.4 ± 0.1; dense eval 0.3, 0.5: 0.4 ± 0.1; sparse 0.1, 0.3: 0.2 ± 0.1
    assert (r128["pool"], r128["pool_se"]) == (pytest.approx(0.4), pytest.approx(0.1))
    assert (r128["dense"], r128["sparse"], r128["sparse_se"]) == (pytest.approx(0.4), pytest.approx(0.2),
                                                                  pytest.approx(0.1))
    assert adaptive["pool"] == pytest.approx(0.6) and adaptive["pool_se"] == 0.0
    # adaptive (pool 0.6, accuracy 0.2) is beaten by R-KV 128 on dense eval (0.4 at 0.4), tied on
    # sparse eval (0.2 at 0.4 < 0.6): beaten there too; dense is on both fronts
    assert [p["config"] for p in grid.pareto_front(list(points.values()), "dense")] == \
        ["rkv:128:sparse_rl", "dense"]
    assert [p["config"] for p in grid.pareto_front(list(points.values()), "sparse")] == \
        ["rkv:128:sparse_rl", "dense"]
    grid.plot_pareto(_pareto_runs(tmp_path / "again"), tmp_path / "pareto.png")
    assert (tmp_path / "pareto.png").stat().st_size > 0


def test_report_cli_writes_the_pareto_plot(tmp_path):
    _pareto_runs(tmp_path / "runs")
    out = subprocess.run([sys.executable, "-m", "benchmarks.grid.correction_grid", "report",
                          str(tmp_path / "runs"), "--pareto", str(tmp_path / "p" / "pareto.png")],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "p" / "pareto.png").stat().st_size > 0
    assert "| rkv:192:sparse_rl+adaptive | 2 |" in out.stdout
