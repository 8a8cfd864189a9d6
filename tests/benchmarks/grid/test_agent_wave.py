"""benchmarks/grid/agent_wave.py: issue 69's agent wave on the lookup-tool task: its runs in
priority order, their commands (the task's held-out prompts, the prompt kept under R-KV), the
CLI's names for it, and the CPU smoke end to end."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.grid import agent_wave, waves
from benchmarks.grid import correction_grid as grid

ROOT = Path(__file__).resolve().parents[3]
GRID = [sys.executable, "-m", "benchmarks.grid.correction_grid"]


def test_the_agent_wave_pairs_dense_with_rkv_across_turns_seed_by_seed():
    jobs = waves.wave_jobs(agent_wave.AGENT, [1, 2, 3, 4, 5], "rkv:128", prefix=False)
    assert len(jobs) == 25 and {j.task for j in jobs} == {"lookup-tool"}
    assert [j.run.name for j in jobs[:5]] == ["dense-s1", "rkv-64-disabled-s1", "rkv-64-sparse_rl-s1",
                                              "rkv-64-disabled-train-sparse-policy-s1",
                                              "rkv-64-sparse_rl+pinturns-s1"]
    assert [j.run.seed for j in jobs[::5]] == [1, 2, 3, 4, 5]
    assert (agent_wave.AGENT.num_rollout, agent_wave.AGENT.eval_interval) == (60, 10)


def test_its_commands_evaluate_the_tasks_held_out_prompts(tmp_path):
    args = argparse.Namespace(out=tmp_path, model="smollm2", num_rollout=60, lr=1e-5, eval_interval=10,
                              save_interval=10, variant_flags=dict(waves.VARIANTS), extra=[])
    setup = waves.SeedSetup(tmp_path / "warm", tmp_path / "train.jsonl", [])
    for job in waves.wave_jobs(agent_wave.AGENT, [1], "rkv:128", prefix=False):
        argv = waves.job_argv(job, args, setup, tmp_path / "eval.jsonl")
        at = argv.index("--eval-prompt-data")
        assert argv[at + 1: at + 3] == ["lookup-tool", str(tmp_path / "eval.jsonl")]
        assert argv[argv.index("--eval-interval") + 1] == "10" and argv[argv.index("--eval-temperature") + 1] == "0"
        assert ("--sglang-compress-keep-prompt" in argv) == (job.run.algorithm != "none")
        assert ("--sglang-compress-pin-turns" in argv) == ("pinturns" in job.run.variants)
        # the lookup-tool task's response length, and a pool that holds 128 dense samples of it
        assert argv[argv.index("--rollout-max-response-len") + 1] == "320"
        assert int(argv[argv.index("--sglang-max-total-tokens") + 1]) >= 128 * 512


def test_the_cli_knows_it_by_name():
    plan = subprocess.run([*GRID, "wave", "agent", "--out", "unused", "--plan"], capture_output=True,
                          text=True, cwd=ROOT, timeout=120)
    assert plan.returncode == 0 and "on lookup-tool: 25 runs" in plan.stdout
    smoke = subprocess.run([*GRID, "wave", "agent", "--smoke", "--out", "unused", "--plan"], capture_output=True,
                           text=True, cwd=ROOT, timeout=120)
    assert smoke.returncode == 0 and "lookup-tool/rkv-96-sparse_rl-s2" in smoke.stdout
    bad = subprocess.run([*GRID, "wave", "agents", "--out", "unused"], capture_output=True, text=True, cwd=ROOT,
                         timeout=120)
    assert bad.returncode == 2 and "choose one of 4, 5, 61, 69, agent" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_cpu_smoke_of_the_agent_wave(tmp_path):
    """``wave agent --smoke``: the tiny model on lookup-tool, 2 seeds x dense and R-KV 96 across
    turns, 4 warm-up steps, 2 rollouts of 4 prompts x 8 samples, 4 held-out prompts: every run exported with its
    per-prompt greedy scores, the report with the pool ratio. Pairing: a seed's runs start from
    one warm-up, so their step-0 greedy scores agree prompt by prompt (15 min on 2 cores at load ~28)."""
    out = tmp_path / "w"
    # the wave's name right before `--`: argparse takes the trainer flags after it as `extra`
    proc = subprocess.run([*GRID, "wave", "--smoke", "--out", str(out), "--warmup-steps", "4", "agent", "--",
                           "--rollout-batch-size", "4", "--global-batch-size", "32"],
                          capture_output=True, text=True, cwd=ROOT, timeout=2300)
    log = out / "supervisor.log"
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:] + (log.read_text()[-2000:] if log.is_file() else "")
    data = out / "data" / "lookup-tool"
    assert sorted(p.name for p in data.iterdir()) == ["dense-s1.jsonl", "dense-s2.jsonl",
                                                      "rkv-96-sparse_rl-s1.jsonl", "rkv-96-sparse_rl-s2.jsonl"]
    for seed in (1, 2):
        dense = [json.loads(x) for x in (data / f"dense-s{seed}.jsonl").read_text().splitlines()]
        rkv = [json.loads(x) for x in (data / f"rkv-96-sparse_rl-s{seed}.jsonl").read_text().splitlines()]
        assert [r["step"] for r in dense] == [0, 1, 2] and "kv_pool_peak_used" in rkv[1]
        assert rkv[1]["rollout/turns_per_sample"] >= 1 and "rollout/tool_error_fraction" in rkv[1]
        assert len(dense[0]["eval_prompts/lookup-tool"]) == 4
        assert dense[0]["eval_prompts/lookup-tool"] == rkv[0]["eval_prompts/lookup-tool_dense"]
    report = (out / "report-lookup-tool.md").read_text()
    assert "rkv:96:sparse_rl" in report
