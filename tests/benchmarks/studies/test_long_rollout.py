"""The long-rollout benchmark: its length plug-in (seeded, long-tailed, bucketed) and one tiny
end-to-end run on a CPU through the real loop (numbers are printed, never asserted: only that
every reported field is there and consistent)."""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.common.long_tail import LongTailLengths, bucket_levels, long_tail_length, round_down

ROOT = Path(__file__).resolve().parents[3]


def test_lengths_are_seeded_long_tailed_and_on_levels():
    a, b = LongTailLengths(cap=4096, seed=3), LongTailLengths(cap=4096, seed=3)
    la = a.lengths(2000)
    assert la == b.lengths(2000)  # same seed, same rollout: same lengths
    assert la != LongTailLengths(cap=4096, seed=4).lengths(2000)
    assert set(la) <= set(a.levels) and min(la) >= 64 and max(la) == 4096
    # log-normal around median_frac * cap: the median lands near 1024 (bucketing rounds down,
    # by at most one level ratio), and the mean sits well above the median (a right tail)
    ratio = a.levels[1] / a.levels[0]
    assert 1024 / ratio <= statistics.median(la) <= 1024 * 1.1
    assert statistics.mean(la) > statistics.median(la)
    # P(z > ln(4) / 0.8) for a standard normal: the share clipped at the cap
    at_cap = 0.5 * math.erfc(math.log(4) / 0.8 / math.sqrt(2))
    assert abs(sum(x == 4096 for x in la) / len(la) - at_cap) < 0.02


def test_each_rollout_draws_anew_and_warm_up_is_scaled():
    p = LongTailLengths(cap=1024, warmup_scale=0.25, seed=1)
    first = p.lengths(50)
    unscaled = [round_down(long_tail_length(i, 1, 1024, 0.25, 0.8, 64), p.levels) for i in range(50)]
    assert first == [max(1, int(0.25 * x)) for x in unscaled]
    p.rollouts = 1
    assert p.lengths(50) != unscaled and max(p.lengths(500)) <= 1024


def test_levels_and_rounding():
    levels = bucket_levels(1000, 10, 3)
    assert levels == [10, 100, 1000]
    assert [round_down(x, levels) for x in (5, 10, 99, 100, 999, 1000)] == [10, 10, 10, 100, 100, 1000]


@pytest.mark.launch
def test_bench_long_rollout_tiny_on_cpu(tmp_path):
    out = tmp_path / "long.json"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.studies.long_rollout", "--shape", "tiny",
         "--response-len", "48", "--configs", "dense", "rkv:16:8", "--prompts", "2", "--samples", "4",
         "--steps", "1", "--max-tokens-per-gpu", "2048", "--workdir", str(tmp_path / "w"),
         "--json", str(out), "--plot", str(tmp_path / "steps.png")],
        cwd=ROOT, text=True, capture_output=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    result = json.loads(out.read_text())
    dense, rkv = result["rows"]
    assert (dense["config"], rkv["config"]) == ("dense", "rkv:16:8")
    for r in (dense, rkv):
        for key in ("step_s", "rollout_s", "recompute_s", "update_s", "rollout_tokens_per_s",
                    "pool_slots", "pool_peak_slots", "pool_gib"):
            assert r[key] > 0, (r["config"], key)
        assert r["pool_peak_slots"] <= r["pool_slots"] and 0 <= r["tail_fraction"] < 1
        assert r["preemptions"] >= 0
    # the pool: a quarter of 8 samples x (48 + 64) tokens
    assert dense["pool_slots"] == int(0.25 * 8 * (48 + 64))
    assert rkv["step_speedup"] == dense["step_s"] / rkv["step_s"]
    assert (tmp_path / "steps.png").stat().st_size > 0


def test_plot_rows_pair_each_run_with_dense_in_its_pool(tmp_path):
    from benchmarks.plots.long_rollout import load_rows

    def summary(step, rollout, peak_slots, peak_bytes, capacity):
        med = {"total_s": step, "rollout_s": rollout, "recompute_s": 1.0, "update_s": 2.0,
               "sync_s": 0.1, "kv_pool_peak_used": peak_slots, "kv_pool_peak_bytes": peak_bytes,
               "kv_pool_capacity": capacity}
        return {"response_len": 4096, "summary": {k: {"min": v, "median": v, "max": v}
                                                  for k, v in med.items()}}

    gib = 2**30
    runs = {"dense_4096.json": summary(40.0, 30.0, 1000, 1000 * 12 * 2**20, 1024),  # 12 GiB pool
            "rkv_512_4096.json": summary(20.0, 10.0, 500, 500 * 12 * 2**20, 1024),
            "dense_4096_small.json": summary(80.0, 60.0, 100, 100 * 12 * 2**20, 256),  # 3 GiB
            "snapkv_512_4096_small.json": summary(40.0, 15.0, 100, 100 * 12 * 2**20, 256)}
    for name, body in runs.items():
        (tmp_path / name).write_text(json.dumps(body))
    rows = {(r["config"], round(r["pool_gib"])): r for r in load_rows(tmp_path)}
    assert rows[("rkv:512", 12)]["step_speedup"] == 2.0 and rows[("rkv:512", 12)]["rollout_speedup"] == 3.0
    assert rows[("snapkv:512", 3)]["step_speedup"] == 2.0 and rows[("snapkv:512", 3)]["rollout_speedup"] == 4.0
    assert rows[("dense", 3)]["pool_gib"] == 256 * 12 * 2**20 / gib


def test_a_stale_config_runs_one_step_off_policy_in_an_engine_process():
    """``+s1``: the trainer flags of one step off-policy, its own run name, and not the dense
    reference the speed-ups are against."""
    from argparse import Namespace

    from benchmarks.studies.long_rollout import (config_argv, is_dense_reference, parse_config,
                                                 run_name)

    args = Namespace(prompts=2, samples=4, steps=1, seed=0, max_tokens_per_gpu=2048,
                     dense_fraction=0.5, median_frac=0.5, sigma=0.6, warmup_scale=0.125, extra=[])
    cfg = parse_config("rkv:512+s1")
    assert cfg == {"name": "rkv:512+s1", "compress": "rkv", "budget": 512, "divide": 128,
                   "stale": True}
    argv = config_argv(args, cfg, 64, Path("hf"), Path("o.json"), Path("w"))
    assert argv[argv.index("--max-staleness") + 1] == "1" and "--rollout-engine-process" in argv
    plain = config_argv(args, parse_config("rkv:512"), 64, Path("hf"), Path("o.json"), Path("w"))
    assert "--max-staleness" not in plain and "--rollout-engine-process" not in plain
    assert run_name(cfg, 4096) == "rkv_512_s1_4096"
    assert run_name(parse_config("dense@fp8_e4m3+s1"), 8192) == "dense@fp8_e4m3_s1_8192"
    assert [is_dense_reference(parse_config(c)) for c in ("dense", "dense+s1", "dense@fp8_e4m3")] \
        == [True, False, False]
