"""benchmarks.studies.run_scripts: a documented run script launched as a user launches it (tiny model, CPU,
one rank), its metrics read back: every sample whole, and the summary what the metrics say."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def test_summary_skips_the_first_rollout_and_sums_aborted():
    from benchmarks.studies.run_scripts import summarize

    rows = [{"step": i, "time_total": t, "time_rollout": t / 2, "aborted": a, "response_len_mean": 10.0,
             "kv_pool_peak_bytes": 2.0**30 * i} for i, (t, a) in enumerate([(9.0, 1), (3.0, 0), (5.0, 2)], 1)]
    s = summarize(rows)
    assert s["step_s"] == [3.0, 5.0] and s["step_median_s"] == 4.0
    assert s["rollout"] == statistics.median([1.5, 2.5]) and s["aborted"] == 3
    assert s["kv_pool_peak_gib"] == 3.0


def test_lane_gpus_filter_nvidia_smi_indices():
    from benchmarks.studies.run_scripts import CASES, lane_indices

    assert lane_indices("2,3") == [2, 3] and lane_indices(None) is None
    assert dict(CASES["3b-rkv-tp2"].env) == {"NUM_GPUS": "2", "TP": "2"}
    assert dict(CASES["3b-tp1-4gpu"].env) == {"NUM_GPUS": "4", "TP": "1"}


@pytest.mark.launch
@pytest.mark.slow  # long; CI runs launch and not slow (tests/README.md)
def test_run_script_on_a_tiny_model(tmp_path):
    data = tmp_path / "data" / "simplelr_qwen_level3to5"
    data.mkdir(parents=True)
    rows = [{"prompt": f"What is {i} + {i}?", "label": str(2 * i)} for i in range(8)]
    (data / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.studies.run_scripts", "--cases", "1.5b-rkv-1gpu",
         "--shape", "tiny", "--rollouts", "2", "--data-dir", str(tmp_path / "data"), "--out", str(out),
         "--workdir", str(tmp_path / "work"), "--rollout-batch-size", "2", "--n-samples-per-prompt", "2",
         "--global-batch-size", "4", "--rollout-max-response-len", "16", "--max-tokens-per-gpu", "512"],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    case = json.loads((out / "1.5b-rkv-1gpu.json").read_text())
    assert case["exit"] == 0 and case["rollouts"] == 2 and case["aborted"] == 0
    assert case["step_s"] == [case["metrics"][1]["time_total"]]
    assert 0 < case["response_len_mean"] <= 16
    assert "| 1.5b-rkv-1gpu | 0 | 2 |" in proc.stdout
