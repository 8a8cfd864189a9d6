"""Issue 66 item 2's lane: ``studies/multiturn_lane_summary.py`` turns the pieces' JSON into
summary.md (hand made inputs; a piece without JSON shows its log's end), and
``studies/multiturn_lane.sh`` runs end to end on a CPU with the tiny model (``SMOKE=1``, launch)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.studies import multiturn_lane_summary as summary

ROOT = Path(__file__).resolve().parents[3]


def step_row(mode: str, setting: str, **kw) -> dict:
    return {"mode": mode, "cudnn_sdp": setting, "tokens_per_s": 1000.0, **kw}


def test_summary_reads_each_piece(tmp_path):
    (tmp_path / "prefill_sdpa.json").write_text(json.dumps([
        {"cudnn": True, "call": "causal", "backend": "CUDNN_ATTENTION", "first_ms": 40.0,
         "repeat_ms": 0.1, "first_total_ms": 960.0}]))
    (tmp_path / "continuation.log").write_text("starting\nTraceback\nValueError: boom\n")
    medians = {f"continuation_{k}_median": 1.0 for k in (
        "rows", "tokens", "wall_ms", "launch_ms", "prev_wait_ms", "take_ms", "schedule_ms", "finish_ms",
        "other_ms", "thread_cpu_ms", "own_wait_ms")}
    (tmp_path / "multiturn.json").write_text(json.dumps({
        "rows": [step_row("single-turn", "off"),
                 step_row("multi-turn", "off", continuation_steps=38, continuation_wall_s=5.1,
                          **{**medians, "continuation_wall_ms_median": 134.0})],
        "summary": {"off": {"multi_over_single_tokens_per_s": 0.11, "barrier_gone": True}},
        "profiles": {"off": {"tables": {"continuation": {
            "steps": 2, "wall_ms": 200.0, "kernel_ms": 3.0,
            "top_ops": [["cudaStreamSynchronize", 150.0]], "top_kernels": []}}},
            "on": {"error": "RuntimeError('no CUPTI')"}}}))
    text = summary.write(tmp_path).read_text()
    assert "| True | causal | CUDNN_ATTENTION | 40.000 | 0.100 | 960.000 |" in text
    assert "continuation: no JSON" in text and "ValueError: boom" in text
    assert "multi/single tokens/s **0.11**" in text
    assert "38 continuation prefill steps (5.10 s)" in text and "134.0 ms: launch 1.0" in text
    assert "cudaStreamSynchronize 75%" in text  # 150 of the profiled steps' 200 ms
    assert "profile cudnn_sdp on (mt_profile/cudnn_on/): RuntimeError('no CUPTI')" in text


def test_summary_cli_names_a_missing_folder(tmp_path):
    with pytest.raises(SystemExit):
        summary.main([str(tmp_path / "nope")])


@pytest.mark.launch  # the lane through its shell script on a CPU, the tiny model: ~2 min
def test_lane_smoke(tmp_path):
    env = {**os.environ, "SMOKE": "1", "PYTHON": sys.executable, "PYTHONWARNINGS": "ignore"}
    out = tmp_path / "lane"
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "studies" / "multiturn_lane.sh"),
                           str(out)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    multi = json.loads((out / "multiturn.json").read_text())
    assert [r["cudnn_sdp"] for r in multi["rows"]] == ["off", "off", "on", "on"]
    assert set(multi["summary"]) == {"off", "on"}
    for setting in ("off", "on"):
        assert (out / "mt_profile" / f"cudnn_{setting}" / "prefill_ops.txt").is_file()
        assert "error" not in multi["profiles"][setting]
    cont = json.loads((out / "continuation.json").read_text())
    assert [(r["cudnn_sdp"], r["context"]) for r in cont["rows"]] == [
        ("off", 32), ("off", 64), ("on", 32), ("on", 64)]
    text = (out / "summary.md").read_text()
    assert "no JSON" not in text and "continuation prefill steps" in text
