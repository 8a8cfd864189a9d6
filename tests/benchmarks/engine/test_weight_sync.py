"""benchmarks/engine/weight_sync.py end to end on a CPU with the tiny shape: every mode pushes,
is read back bit for bit, and reports its spread (timings are printed, never asserted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_bench_weight_sync_tiny_on_cpu(tmp_path):
    out = tmp_path / "sync.json"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.engine.weight_sync",
                           "--shape", "tiny", "--pushes", "2", "--workdir", str(tmp_path / "w"),
                           "--json", str(out)], cwd=ROOT, text=True, capture_output=True,
                          timeout=300, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    result = json.loads(out.read_text())
    assert json.loads(proc.stdout.splitlines()[-1]) == result
    assert set(result["modes"]) == {"auto", "tensor", "ipc", "distributed", "disk"}
    assert result["bytes"] > 0 and result["device"] == "cpu"
    for mode, row in result["modes"].items():
        assert row["verified"] and len(row["pushes_s"]) == 2, mode
        assert 0 < row["min_s"] <= row["median_s"] <= row["max_s"], mode
        # auto is the trainer's own choice (--weight-sync auto): on a CPU it settles on one of the others
        assert row["mode_used"] == mode if mode != "auto" else row["mode_used"] in result["modes"], mode
        assert row["phases_s"], mode
        # the phases are parts of the push: they sum to no more than it
        assert sum(row["phases_s"].values()) <= max(row["pushes_s"]), mode
    assert {"export", "flatten", "group", "transfer"} <= set(result["modes"]["distributed"]["phases_s"])
    assert {"export_and_write", "load"} <= set(result["modes"]["disk"]["phases_s"])
    assert result["modes"]["ipc"]["transport"] == "shared memory"
    assert result["modes"]["auto"]["transport"].startswith("auto: ")


def test_bench_weight_sync_refuses_unknown_mode():
    proc = subprocess.run([sys.executable, "-m", "benchmarks.engine.weight_sync",
                           "--modes", "ipc,carrier-pigeon"], cwd=ROOT, text=True,
                          capture_output=True, timeout=120)
    assert proc.returncode == 2 and "unknown mode(s) ['carrier-pigeon']" in proc.stderr
