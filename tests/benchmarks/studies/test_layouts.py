"""The layouts benchmark: each layout launched through torchrun as users launch it, on a tiny
model on CPU (gloo): every run completes with whole batches, and the speed-ups are the ratios of
the printed step times to the same call's one-GPU sync run (computed here by hand)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

@pytest.mark.launch  # torchrun launches, ~1 min on 2 cores
def test_layouts_run_and_compare_to_one_gpu_sync(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.studies.layouts", "--shape", "tiny",
         "--response-len", "32", "--prompts", "4", "--samples", "2", "--steps", "2",
         "--layouts", "1gpu-sync", "coloc-dp2-sync", "disagg-s1", "--out", str(out),
         "--workdir", str(tmp_path / "work")],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    rows = {r["layout"]: r for r in json.loads((out / "layouts.json").read_text())}
    assert set(rows) == {"1gpu-sync", "coloc-dp2-sync", "disagg-s1"}
    base = rows["1gpu-sync"]
    for r in rows.values():
        assert "error" not in r and r["aborted"] == 0 and len(r["step_s"]) == 2
        assert r["vs_1gpu_median"] == pytest.approx(base["step_median_s"] / r["step_median_s"])
        assert r["vs_1gpu_sum"] == pytest.approx(sum(base["step_s"]) / sum(r["step_s"]))
    assert (rows["coloc-dp2-sync"]["gpus"], rows["disagg-s1"]["gpus"]) == (2, 2)
    assert "| coloc-dp2-sync |" in proc.stdout


def test_weak_scaling_scales_prompts_per_generating_gpu_and_keeps_each_pool(tmp_path):
    from benchmarks.studies.layouts import LAYOUTS, parse_args, run_argv
    from benchmarks.studies.long_rollout import parse_config

    args = parse_args(["--weak-scaling", "--prompts", "8", "--samples", "4", "--response-len", "100",
                       "--dense-fraction", "0.5"])
    def flag(layout, name):
        argv = run_argv(args, parse_config("rkv:64"), LAYOUTS[layout], tmp_path, tmp_path / "o", tmp_path)
        return int(argv[len(argv) - 1 - argv[::-1].index(name) + 1])  # the last one wins
    assert flag("1gpu-sync", "--prompts") == 8 and flag("coloc-dp4-sync", "--prompts") == 32
    assert flag("disagg-2x2-s1-fullgpu", "--prompts") == 16  # 2 engine GPUs generate
    one_gpu_pool = int(0.5 * 8 * 4 * (100 + 64))
    assert flag("coloc-dp4-sync", "--sglang-max-total-tokens") == one_gpu_pool
    assert flag("disagg-2x2-s1-fullgpu", "--sglang-max-total-tokens") == 16 * 4 * 164 // 2


def test_weak_scaling_speedups_count_samples_and_rollout_efficiency():
    from benchmarks.studies.layouts import with_speedups

    one = {"config": "c", "layout": "1gpu-sync", "prompts": 32, "step_s": [10.0, 8.0],
           "step_median_s": 9.0, "rollout_s": 6.0}
    four = {"config": "c", "layout": "coloc-dp4-sync", "prompts": 128, "step_s": [12.0, 12.0],
            "step_median_s": 12.0, "rollout_s": 7.5}
    rows = with_speedups([one, four])
    assert rows[1]["vs_1gpu_median"] == pytest.approx(0.75)
    assert rows[1]["vs_1gpu_samples"] == pytest.approx(4 * 9.0 / 12.0)  # 3x the samples per hour
    assert rows[1]["rollout_weak_efficiency"] == pytest.approx(0.8)
    assert rows[0]["rollout_weak_efficiency"] is None
