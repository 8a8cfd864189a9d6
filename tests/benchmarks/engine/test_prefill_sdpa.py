"""benchmarks.engine.prefill_sdpa's CPU smoke command: both settings (cuDNN attention on, off)
and both calls (causal, masked) come out, over distinct step shapes. Timings are only checked
to be there."""

from __future__ import annotations

import json

from benchmarks.engine.prefill_sdpa import step_shapes


def test_step_shapes_are_distinct_and_continue_held_kv():
    shapes = step_shapes(12, seed=0)
    assert len(set(shapes)) == 12
    assert all(lk > lq for _, lq, lk in shapes)  # every row holds KV before its new tokens


def test_cpu_smoke_reports_both_settings_and_calls(tmp_path, run_benchmark):
    out = tmp_path / "sdpa.json"
    run_benchmark("engine.prefill_sdpa", "--device", "cpu", "--shapes", "2", "--json", str(out),
                  timeout=120)
    rows = json.loads(out.read_text())
    calls = ["causal", "masked", "masked_expanded"]
    assert [(r["cudnn"], r["call"]) for r in rows] == [(c, name) for c in (True, False) for name in calls]
    assert all(r["first_ms"] > 0 and r["first_total_ms"] >= r["first_ms"] for r in rows)
