"""benchmarks/engine/multiturn_throughput.py --tiny on the CPU: both modes report every field,
at the same samples and lengths (the same model tokens: every turn decodes its planned length),
multi-turn's episodes have their planned turns and the tool's time (numbers printed, never
timed); ``--cudnn-sdp off,on`` gives each setting its rows and summary, ``--profile`` its tables;
a bad ``--cudnn-sdp`` is a CLI error naming the flag."""

from __future__ import annotations

import pytest

from benchmarks.engine.multiturn_throughput import main, parse_args


@pytest.mark.parametrize("value", ["maybe", "off,off", "", "on,,off"])
def test_a_bad_cudnn_setting_names_the_flag(value, capsys):
    with pytest.raises(SystemExit):
        parse_args(["--tiny", "--cudnn-sdp", value])
    assert "--cudnn-sdp" in capsys.readouterr().err


def test_cudnn_settings_run_in_the_order_given():
    assert parse_args(["--tiny", "--cudnn-sdp", "on, off"]).settings == ["on", "off"]
    assert parse_args(["--tiny"]).settings == ["off"]  # the engine's default


@pytest.mark.slow
def test_tiny_run_reports_both_modes(tmp_path):
    out = main(["--tiny", "--json", str(tmp_path / "r.json"), "--cudnn-sdp", "off,on",
                "--profile", str(tmp_path / "prof")])
    assert (tmp_path / "r.json").is_file()
    assert [(r["mode"], r["cudnn_sdp"]) for r in out["rows"]] == [
        ("single-turn", "off"), ("multi-turn", "off"), ("single-turn", "on"), ("multi-turn", "on")]
    assert set(out["summary"]) == {"off", "on"}
    for setting in ("off", "on"):
        folder = tmp_path / "prof" / f"cudnn_{setting}"
        assert all((folder / f).is_file() for f in ("kernels.txt", "cpu_ops.txt",
                                                    "prefill_ops.txt", "prefill_steps.json"))
        assert out["profiles"][setting]["tables"]["continuation"]["steps"] >= 1
    rows = {r["mode"]: r for r in out["rows"] if r["cudnn_sdp"] == "off"}
    single, multi = rows["single-turn"], rows["multi-turn"]
    assert single["model_tokens"] == multi["model_tokens"] > 0
    for row in (single, multi):
        assert row["decode_steps"] > 0 and row["tokens_per_s"] > 0
        assert row["decode_s"] + row["outside_decode_s"] == pytest.approx(row["wall_s"])
    assert multi["turns_per_sample"] == out["args"]["turns"] and multi["tool_s"] > 0
    assert multi["first_turn2_start"] > 0 and "barrier_gone" in out["summary"]["off"]
    # the split of the time outside decode: every episode's session opened in one engine
    # command, closed in at most one call each (batched), prefill steps counted
    episodes = out["args"]["prompts"] * out["args"]["samples"]
    assert 1 <= multi["close_calls"] <= episodes
    assert multi["commands"] == 1 + multi["close_calls"] and single["commands"] == 0
    assert multi["prefill_steps"] >= single["prefill_steps"] >= 1
    assert multi["wakeups"] >= 1 and multi["turn_gap_max_ms"] >= multi["turn_gap_median_ms"]
    # every prefill step recorded: the turn 2s continue sessions, single-turn's one is fresh
    log = multi["prefill_step_log"]
    assert len(log) == multi["prefill_steps"] and multi["continuation_steps"] >= 1
    assert sum(s["continuations"] for s in log) == episodes  # each episode's turn 2 once
    assert single["continuation_steps"] == 0 and single["fresh_steps"] == single["prefill_steps"]
