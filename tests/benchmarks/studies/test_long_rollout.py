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


def _row(config: str, step: float, rollout: float, cap: int = 4096) -> dict:
    return {"config": config, "response_len": cap, "step_s": step, "rollout_s": rollout}


def test_speed_ups_compare_on_policy_and_off_policy_like_for_like():
    """Every row against on-policy dense; a ``+s1`` row's step also against ``dense+s1``, and no
    rollout ratio for it (its rollout column is a wait). Hand-computed: 20 / 8 and 16 / 8."""
    from benchmarks.studies.long_rollout import add_ratios

    rows = add_ratios([_row("dense", 20.0, 14.0), _row("rkv:512", 14.0, 7.0),
                       _row("dense+s1", 16.0, 0.1), _row("rkv:512+s1", 8.0, 0.02),
                       _row("dense", 40.0, 30.0, cap=8192), _row("rkv:512+s1", 25.0, 0.1, cap=8192)])
    dense, rkv, dense_s1, rkv_s1, dense8, rkv8 = rows
    assert "step_speedup" not in dense and rkv["step_speedup"] == 20.0 / 14.0
    assert rkv["rollout_speedup"] == 2.0 and "step_speedup_vs_s1" not in rkv
    assert dense_s1["step_speedup"] == 20.0 / 16.0 and "step_speedup_vs_s1" not in dense_s1
    assert rkv_s1["step_speedup"] == 2.5 and rkv_s1["step_speedup_vs_s1"] == 2.0
    assert "rollout_speedup" not in rkv_s1
    # 8k has no dense+s1 row: the on-policy ratio alone, against 8k's own dense
    assert rkv8["step_speedup"] == 40.0 / 25.0 and "step_speedup_vs_s1" not in rkv8


def test_a_stale_config_gets_at_least_stale_steps(tmp_path):
    from argparse import Namespace

    from benchmarks.studies.long_rollout import config_argv, config_steps, parse_config

    args = Namespace(prompts=2, samples=4, steps=2, stale_steps=4, seed=0, max_tokens_per_gpu=0,
                     dense_fraction=0.25, median_frac=0.5, sigma=0.6, warmup_scale=0.125, extra=[])
    assert [config_steps(args, parse_config(c)) for c in ("dense", "dense+s1", "rkv:512+s1")] == [2, 4, 4]
    args.steps = 6
    assert config_steps(args, parse_config("rkv:512+s1")) == 6
    argv = config_argv(args, parse_config("dense+s1"), 64, Path("hf"), Path("o.json"), Path("w"))
    assert argv[argv.index("--steps") + 1] == "6"


def test_a_cut_config_keeps_the_steps_it_timed(tmp_path):
    """rl_step's JSON rewritten every step: a run cut after two timed steps gives its row (the
    steady state of what it made) with the error; one cut before any gives the error alone."""
    from benchmarks.studies.long_rollout import config_row, parse_config, read_result

    steps = [{"total_s": 12.0}, {"total_s": 9.0}]
    steady = {"total_s": {"min": 9.0, "median": 9.0, "max": 9.0},
              "rollout_s": {"min": 1.0, "median": 1.0, "max": 1.0}}
    out = tmp_path / "r.json"
    out.write_text(json.dumps({"partial": True, "steps": steps, "steady": steady, "summary": {}}))
    r = config_row(parse_config("rkv:512+s1"), 4096, read_result(out, 124))
    assert (r["step_s"], r["steps_s"], r["error"]) == (9.0, [12.0, 9.0], "exit 124 after 2 timed step(s)")
    # the JSON copied as it was (the lane's salvage) says it was cut
    assert config_row(parse_config("dense"), 4096, json.loads(out.read_text()))["error"] \
        == "cut after 2 timed step(s)"
    assert read_result(tmp_path / "none.json", 143) == {"error": "exit 143"}
    assert config_row(parse_config("dense"), 4096, {"error": "exit 143"}) == \
        {"config": "dense", "response_len": 4096, "error": "exit 143"}


def test_sigterm_stops_the_running_config_and_the_loop():
    """``timeout``'s SIGTERM: the config's process is ended (its JSON so far stays) and the loop
    stops after recording it; a real child process, ended well before its own 60 s."""
    import threading
    import time

    from benchmarks.studies.long_rollout import Children

    children, codes = Children(), []
    worker = threading.Thread(target=lambda: codes.append(
        children.run([sys.executable, "-c", "import time; time.sleep(60)"])))
    start = time.monotonic()
    worker.start()
    while children.proc is None:
        time.sleep(0.01)
    children.on_term(15, None)
    worker.join(30)
    assert codes == [-15] and children.cut and children.proc is None
    assert time.monotonic() - start < 30
