"""The layouts benchmark: each layout launched through torchrun as users launch it, on a tiny
model on CPU (gloo): every run completes with whole batches, and the speed-ups are the ratios of
the printed step times to the same call's one-GPU sync run (computed here by hand)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.launch  # torchrun launches, ~1 min on 2 cores


def test_layouts_run_and_compare_to_one_gpu_sync(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_layouts.py"), "--shape", "tiny",
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
