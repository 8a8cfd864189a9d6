"""The paired report of the issue-51 grid on synthetic exported JSONLs (``<config>-s<seed>.jsonl``),
against hand-computed intervals."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.grid import correction_grid as grid
from benchmarks.grid import paired

ROOT = Path(__file__).resolve().parents[3]

DENSE_FINAL = [0.50, 0.60, 0.55, 0.45, 0.40]
DENSE_START = [0.30, 0.40, 0.35, 0.30, 0.25]  # gains 0.20 0.20 0.20 0.15 0.15
DIFF = [0.0, -0.02, 0.01, -0.03, 0.04]  # R-KV 128 evaluated dense, minus dense
DEPLOYED_GAP = [0.10, 0.12, 0.08, 0.10, 0.10]  # dense minus R-KV 128 deployed compressed
POOL = [400.0, 420.0, 380.0, 400.0, 400.0]  # against dense's 1000 in every seed


def _jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _prompts(mean: float) -> list[float]:
    return [mean - 0.1, mean + 0.1, mean - 0.05, mean + 0.05]  # four prompts whose mean is ``mean``


def write_grid(folder: Path, task: str = "chain100") -> None:
    folder.mkdir(parents=True)
    for s in range(5):
        d, c, dep = DENSE_FINAL[s], DENSE_FINAL[s] + DIFF[s], DENSE_FINAL[s] - DEPLOYED_GAP[s]
        _jsonl(folder / f"dense-s{s + 1}.jsonl", [
            {"step": 0, f"eval/{task}/score": DENSE_START[s], f"eval_prompts/{task}": _prompts(DENSE_START[s])},
            {"step": 1, "kv_pool_peak_used": 1000.0, "reward_mean": 0.2},
            {"step": 2, "kv_pool_peak_used": 900.0, f"eval/{task}/score": d, f"eval_prompts/{task}": _prompts(d)}])
        _jsonl(folder / f"rkv-128-sparse_rl-s{s + 1}.jsonl", [
            {"step": 1, "kv_pool_peak_used": POOL[s]},
            {"step": 2, "kv_pool_peak_used": POOL[s] - 50, f"eval/{task}_dense/score": c,
             f"eval_prompts/{task}_dense": _prompts(c), f"eval/{task}/score": dep,
             f"eval_prompts/{task}": _prompts(dep)}])


def test_paired_table_by_hand(tmp_path):
    """Hand-computed (t(0.975, 4) = 2.7764):
    dense gain: mean 0.18, s = sqrt(0.003 / 4) = 0.027386, half-width 2.7764 x 0.012247 = 0.0340;
    R-KV 128 - dense (evaluated dense): mean 0.000, same s: [-0.034, +0.034], misses -0.03 by 0.4 pts;
    by prompt: the seed's difference on each of its 4 prompts, 20 values of population s.d.
    sqrt(0.0006): bootstrap half-width ~1.96 x 0.024495 / sqrt(20) = 0.0107;
    deployed - dense: mean -0.100, s = sqrt(0.0008 / 4): [-0.118, -0.082], misses -0.10 by 1.8 pts;
    pool 0.40, same s: [0.38, 0.42]. Accuracies: R-KV 128 evaluated dense 0.50, 0.58, 0.56, 0.42, 0.44:
    s = sqrt(0.02 / 4), [0.412, 0.588]; deployed 0.40, 0.48, 0.47, 0.35, 0.30: s = sqrt(0.0238 / 4),
    [0.304, 0.496]; dense 0.50, 0.60, 0.55, 0.45, 0.40: s = sqrt(0.025 / 4), [0.402, 0.598]."""
    write_grid(tmp_path / "g")
    results = grid.collect(grid.discover(tmp_path / "g"), tmp_path / "g")
    lines = paired.paired_table(results, "chain100")
    assert lines[0].startswith("Dense gain over its start (final - step 0, greedy, by seed): "
                               "+0.180 [+0.146, +0.214] (n=5)")
    assert lines[0].endswith("met on the mean, not the lower bound")
    row = next(line for line in lines if line.startswith("| rkv:128:sparse_rl |")).split(" | ")
    assert row[1:6] == ["5", "0.40 [0.38, 0.42]", f"{max(POOL) / 1000:.2f}", "-", "0.500 [0.412, 0.588]"]
    assert row[6] == "+0.000 [-0.034, +0.034]" and row[8] == "fail by 0.4 pts"
    assert row[9] == "0.400 [0.304, 0.496]" and row[10] == "-0.100 [-0.118, -0.082]"
    assert row[11] == "fail by 1.8 pts |"
    boot = paired.compare([r for r in results if r.run.algorithm == "rkv"],
                               grid.dense_by_seed(results), "chain100", True)["boot"]
    assert boot.n == 20 and boot.mean == pytest.approx(0.0, abs=1e-12)
    assert boot.high == pytest.approx(1.96 * math.sqrt(0.0006 / 20), rel=0.15)
    assert boot.low == pytest.approx(-1.96 * math.sqrt(0.0006 / 20), rel=0.15)
    dense_row = next(line for line in lines if line.startswith("| dense |"))
    assert "0.500 [0.402, 0.598] | (reference)" in dense_row and "1.00 [1.00, 1.00]" in dense_row


def test_a_config_within_the_margin_passes(tmp_path):
    """Shifting every difference up by 0.01: [-0.024, +0.044], inside -0.03: pass."""
    global DIFF
    saved, DIFF = DIFF, [d + 0.01 for d in DIFF]
    try:
        write_grid(tmp_path / "g")
    finally:
        DIFF = saved
    results = grid.collect(grid.discover(tmp_path / "g"), tmp_path / "g")
    row = next(line for line in paired.paired_table(results, "chain100")
               if line.startswith("| rkv:128:sparse_rl |")).split(" | ")
    assert row[6] == "+0.010 [-0.024, +0.044]" and row[8] == "pass"


def test_prefix_sharing_is_the_second_pool_reference(tmp_path):
    write_grid(tmp_path / "g")
    for s in range(1, 6):  # dense with prefix sharing holds 800 at its peak
        _jsonl(tmp_path / "g" / f"dense+prefix-s{s}.jsonl",
               [{"step": 1, "kv_pool_peak_used": 800.0}, {"step": 2, "eval/chain100/score": 0.5}])
    results = grid.collect(grid.discover(tmp_path / "g"), tmp_path / "g")
    row = next(line for line in paired.paired_table(results, "chain100")
               if line.startswith("| rkv:128:sparse_rl |")).split(" | ")
    # 400, 420, 380, 400, 400 over 800: 0.500 with s = sqrt(0.00125 / 4): [0.478, 0.522]
    # the largest seed's ratio (mean 0.40): 420 of 1000
    assert row[2:5] == ["0.40 [0.38, 0.42]", "0.42", "0.50 [0.48, 0.52]"]


def test_report_cli_on_the_jsonl_folder(tmp_path):
    write_grid(tmp_path / "g")
    out = subprocess.run([sys.executable, "-m", "benchmarks.grid.correction_grid", "report",
                          str(tmp_path / "g"), "--task", "chain100", "--pareto", str(tmp_path / "p.png")],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "| rkv:128:sparse_rl | 5 | 0.40 [0.38, 0.42] |" in out.stdout
    assert (tmp_path / "p.png").stat().st_size > 0
    missing = subprocess.run([sys.executable, "-m", "benchmarks.grid.correction_grid", "report",
                              str(tmp_path / "nowhere")], capture_output=True, text=True, cwd=ROOT)
    assert missing.returncode == 2 and "no such folder" in missing.stderr
