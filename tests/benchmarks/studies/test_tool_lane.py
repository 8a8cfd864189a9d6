"""Issue 66's tool lane: ``studies/tool_lane_summary.py`` turns the runs' metrics into the tables
(hand made rows, hand computed means, ratios, per-seed gains and their t-interval),
``studies/tool_lane.py`` expands ``CONFIG@SEEDS`` and refuses bad flags in one line, and
``studies/tool_lane.sh`` runs end to end on a CPU with the tiny model (``SMOKE=1``, launch)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.studies import tool_lane_summary as summary

ROOT = Path(__file__).resolve().parents[3]


def rollout(step, reward, peak, turns=2.0):
    return {"step": step, "reward_mean": reward, "rollout/turns_per_sample": turns,
            "rollout/tool_calls_per_sample": 1.5, "rollout/tool_error_fraction": 0.1,
            "kv_pool_peak_used": peak, "rollout_tokens_per_s": 1000.0 * step}


def write_run(folder: Path, rows: list[dict]) -> Path:
    (folder / "logs").mkdir(parents=True)
    (folder / "logs" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def test_summary_table(tmp_path):
    dense = write_run(tmp_path / "dense-s1", [{"step": 0, "eval/lookup-tool/score": 0.25},
                                              rollout(1, 0.2, 8000), rollout(2, 0.4, 10000),
                                              {"step": 2, "eval/lookup-tool/score": 0.5}])
    dense2 = write_run(tmp_path / "dense-s2", [{"step": 0, "eval/lookup-tool/score": 0.375},
                                               rollout(1, 0.3, 6000), rollout(2, 0.3, 6000),
                                               {"step": 2, "eval/lookup-tool/score": 0.5}])
    rkv = write_run(tmp_path / "rkv-64-sparse_rl-s1", [
        {"step": 0, "eval/lookup-tool/score": 0.125, "eval/lookup-tool_dense/score": 0.25},
        rollout(1, 0.1, 4000, turns=3.0), rollout(2, 0.3, 5000, turns=3.0),
        {"step": 2, "eval/lookup-tool/score": 0.375, "eval/lookup-tool_dense/score": 0.5}])
    lane = {"seeds": [1, 2], "setup_s": 60, "lane_s": 450, "smoke": False, "lr": 2e-5, "prompts": 32,
            "exits": {"dense-s1": 0, "dense-s2": 0, "rkv-64-sparse_rl-s1": None},
            "commands": {"dense-s1": "python -m trainer.train ...", "dense-s2": "python -m trainer.train ...",
                         "rkv-64-sparse_rl-s1": "python -m trainer.train ..."}}
    out = tmp_path / "out"
    out.mkdir()
    summary.write_results(out, {"dense-s1": dense, "dense-s2": dense2, "rkv-64-sparse_rl-s1": rkv}, lane)
    text = (out / "summary.md").read_text()
    # first/last window of one rollout each (2 rollouts); means over rollouts; peak the largest;
    # pool / dense against the same seed's dense run (5,000 / 10,000)
    assert ("| dense-s1 | 2 | 0.200 -> 0.400 | 2.00 | 1.50 | 10.0% | 10,000 | 1,500 | 1.00 | "
            "0:0.250 2:0.500 | - |") in text
    assert ("| rkv-64-sparse_rl-s1 | 2 | 0.100 -> 0.300 | 3.00 | 1.50 | 10.0% | 5,000 | 1,500 | 0.50 | "
            "0:0.125 2:0.375 | 0:0.250 2:0.500 |") in text
    # gains 0.25 and 0.125: mean 0.1875, sd 0.0884, t(1) 12.7062 -> half 12.7062 * 0.0884 / sqrt(2) = 0.794
    assert ("| dense | as run | s1: 0.250 -> 0.500 @2 (+0.250); s2: 0.375 -> 0.500 @2 (+0.125) | "
            "+0.188 [-0.607, +0.982] | met on the mean, not the lower bound |") in text
    assert "| rkv-64-sparse_rl | as run | s1: 0.125 -> 0.375 @2 (+0.250) | +0.250 (n=1) |" in text
    assert "| rkv-64-sparse_rl | dense | s1: 0.250 -> 0.500 @2 (+0.250) | +0.250 (n=1) |" in text
    assert "rkv-64-sparse_rl-s1: stopped at the lane time" in text and "Seeds 1, 2" in text
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert {r["config"] for r in rows} == {"dense-s1", "dense-s2", "rkv-64-sparse_rl-s1"} and len(rows) == 9  # merged per step
    assert (out / "curves.png").stat().st_size > 0 and json.loads((out / "lane.json").read_text())["lane_s"] == 450


def test_a_run_with_one_evaluation_has_no_gain():
    assert summary.gain([{"step": 0, "eval/lookup-tool/score": 0.5}]) is None
    assert summary.gain_row("dense", "as run", {1: [{"step": 0, "eval/lookup-tool/score": 0.5}]},
                            summary.GREEDY) == "| dense | as run | s1: n/a | - | - |"


def test_configs_take_the_lane_seeds_or_their_own():
    from benchmarks.studies.tool_lane import parse_runs

    runs = parse_runs(["dense", "rkv:64:sparse_rl@1"], [1, 2, 3])
    assert [r.name for r in runs] == ["dense-s1", "dense-s2", "dense-s3", "rkv-64-sparse_rl-s1"]
    assert [r.name for r in parse_runs(["dense@2,5"], [1])] == ["dense-s2", "dense-s5"]
    with pytest.raises(ValueError, match="dense-s1 named twice"):
        parse_runs(["dense", "dense@1"], [1])
    with pytest.raises(ValueError, match="integers separated by commas"):
        parse_runs(["dense@one"], [1])


def test_pinturns_config_adds_the_engine_flag(tmp_path):
    """``+pinturns`` (--compress-pin-turns) on a compressed config; an unknown variant or one
    on dense is refused before anything starts."""
    import argparse

    from benchmarks.grid import waves
    from benchmarks.studies.tool_lane import grid_args, parse_runs

    [run] = parse_runs(["rkv:64:sparse_rl+pinturns@1"], [1, 2])
    assert run.name == "rkv-64-sparse_rl+pinturns-s1"
    gargs = grid_args(argparse.Namespace(smoke=True, work=tmp_path, num_rollout=2, lr=2e-5,
                                         eval_interval=1, warmup_steps=None, runs=[run], prompts=4))
    setup = waves.SeedSetup(Path("m"), Path("d.jsonl"), [])
    argv = waves.job_argv(waves.Job(run, "lookup-tool"), gargs, setup, Path("e.jsonl"))
    assert "--sglang-compress-pin-turns" in argv and "--sglang-compress-keep-prompt" in argv
    with pytest.raises(ValueError, match="unknown variant 'pinturn'"):
        parse_runs(["rkv:64:sparse_rl+pinturn"], [1])
    with pytest.raises(ValueError, match="dense evicts nothing"):
        parse_runs(["dense+pinturns"], [1])


def test_the_rollout_batch_is_32_prompts_and_a_pool_that_holds_them():
    from benchmarks.studies.tool_lane import batch_flags

    flags = batch_flags(32)
    value = lambda flag: int(flags[flags.index(flag) + 1])  # noqa: E731
    assert (value("--rollout-batch-size"), value("--global-batch-size"), value("--sglang-max-running-requests")) \
        == (32, 256, 256)
    assert value("--sglang-max-total-tokens") >= 256 * 512  # a dense lookup-tool sample: 512 slots at most


def test_bad_flags_are_one_line_errors(tmp_path):
    for argv, message in ((["--configs", "rkv:x"], "--configs"), (["--total-s", "0", "--smoke"], "must be positive"),
                          (["--configs", "dense@x", "--smoke"], "integers separated by commas"),
                          ([], "give --model-dir or --smollm2-wheel"),
                          (["--model-dir", str(tmp_path)], "no config.json")):
        proc = subprocess.run([sys.executable, "-m", "benchmarks.studies.tool_lane", "--out", str(tmp_path / "o"),
                               "--work", str(tmp_path / "w"), *argv], capture_output=True, text=True, cwd=ROOT)
        assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr


def test_runs_past_the_lane_time_are_stopped_with_their_children():
    """A run that ignores SIGINT (and the process it started) is killed after the grace; a run
    that ended keeps its exit code; a run that stops on SIGINT is reported as stopped."""
    from benchmarks.studies.tool_lane import stop_all

    stubborn = "import signal, subprocess, time; signal.signal(signal.SIGINT, signal.SIG_IGN); " \
               "subprocess.Popen(['sleep', '60']); time.sleep(60)"
    procs = {"done": subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True),
             "polite": subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True),
             "stubborn": subprocess.Popen([sys.executable, "-c", stubborn], start_new_session=True)}
    procs["done"].wait()
    import time

    time.sleep(1.0)  # the stubborn run's handler and child in place
    assert stop_all(procs, grace=2.0) == {"done": 0, "polite": None, "stubborn": None}
    assert all(p.poll() is not None for p in procs.values())
    left = subprocess.run(["pgrep", "-s", str(procs["stubborn"].pid)], capture_output=True, text=True).stdout.split()
    assert all(_state(pid) in ("Z", None) for pid in left)  # its child went with it (a zombie at most)


def _state(pid: str) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


@pytest.mark.launch
@pytest.mark.timeout(1800)
def test_smoke_lane_end_to_end(tmp_path):
    """``SMOKE=1``: the tiny model's warm-ups (seeds 1 and 2), dense at both seeds and R-KV 96
    across turns at seed 1 side by side, 2 rollouts, the summary with the gain table."""
    env = {**os.environ, "SMOKE": "1", "PYTHON": sys.executable, "WORK": str(tmp_path / "work"), "TOTAL_S": "1500"}
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "studies" / "tool_lane.sh"), str(tmp_path / "out")],
                          env=env, capture_output=True, text=True, cwd=ROOT, timeout=1700)
    assert proc.returncode == 0, proc.stdout[-4000:]
    files = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert files == ["curves.png", "exit.txt", "gpu.txt", "lane.json", "lane.log", "logs.txt", "metrics.jsonl", "summary.md"]
    text = (tmp_path / "out" / "summary.md").read_text()
    assert "| dense-s1 | 2 |" in text and "| dense-s2 | 2 |" in text and "| rkv-96-sparse_rl-s1 | 2 |" in text
    assert "| dense | as run | s1: " in text and "; s2: " in text
    rows = [json.loads(x) for x in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert any(r.get("config") == "rkv-96-sparse_rl-s1" and "eval/lookup-tool_dense/score" in r for r in rows)
