"""benchmarks/engine/multiturn_throughput.py --tiny on the CPU: both modes report every field,
at the same samples and lengths (the same model tokens: every turn decodes its planned length),
multi-turn's episodes have their planned turns and the tool's time (numbers printed, never
timed)."""

from __future__ import annotations

import pytest

from benchmarks.engine.multiturn_throughput import main


@pytest.mark.slow
def test_tiny_run_reports_both_modes(tmp_path):
    out = main(["--tiny", "--json", str(tmp_path / "r.json")])
    assert (tmp_path / "r.json").is_file()
    rows = {r["mode"]: r for r in out["rows"]}
    single, multi = rows["single-turn"], rows["multi-turn"]
    assert single["model_tokens"] == multi["model_tokens"] > 0
    for row in (single, multi):
        assert row["decode_steps"] > 0 and row["tokens_per_s"] > 0
        assert row["decode_s"] + row["outside_decode_s"] == pytest.approx(row["wall_s"])
    assert multi["turns_per_sample"] == out["args"]["turns"] and multi["tool_s"] > 0
    assert multi["first_turn2_start"] > 0 and "barrier_gone" in out["summary"]
    # the split of the time outside decode: every episode's session opened in one engine
    # command, closed in at most one call each (batched), prefill steps counted
    episodes = out["args"]["prompts"] * out["args"]["samples"]
    assert 1 <= multi["close_calls"] <= episodes
    assert multi["commands"] == 1 + multi["close_calls"] and single["commands"] == 0
    assert multi["prefill_steps"] >= single["prefill_steps"] >= 1
    assert multi["wakeups"] >= 1 and multi["turn_gap_max_ms"] >= multi["turn_gap_median_ms"]
