"""benchmarks/engine/prefix_sharing.py --smoke on the CPU: every reported field is there, and the counts that
follow from sharing hold (numbers printed, never timed): without sharing every sample prefills its
prompt, with it each group's prompt is prefilled at most once and the pool peak is lower."""

from __future__ import annotations

from benchmarks.engine.prefix_sharing import main


def test_smoke_run_reports_sharing(tmp_path):
    out = main(["--smoke", "--configs", "dense", "dense+share", "--json", str(tmp_path / "r.json")])
    assert (tmp_path / "r.json").is_file()
    groups, n = out["args"]["groups"], out["args"]["n"]
    rows = {(r["config"], r["prompt_len"], r["n"]): r for r in out["rows"]}
    for P in out["args"]["prompt_lens"]:
        off, on = rows["dense", P, n], rows["dense+share", P, n]
        assert off["prefill_tokens"] == groups * n * P and off["cached_tokens"] == 0
        assert on["prefill_tokens"] <= groups * P
        assert on["pool_peak"] < off["pool_peak"] and on["vs_dense"] < 1 == off["vs_dense"]
        assert on["tokens"] == off["tokens"]  # the same long-tailed lengths
        assert {"held_at_once", "rollout_s", "pool_peak_per_group", "preemptions"} <= set(on)
    assert len([r for r in out["rows"] if r["n"] == 1]) == 2
