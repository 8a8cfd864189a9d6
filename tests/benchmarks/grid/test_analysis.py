"""Issue 61's additions to the grid: the budget model (grid/budget.py), the step marks of chain
answers (grid/positions.py, against the grader's own score), the gate, the correction's worth, the
curves and the missing runs (grid/analysis.py, grid/choice.py), the report on a partial grid, and the
bundle the device sends back. Hand-computed values throughout."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from benchmarks.grid import analysis as grid_analysis
from benchmarks.grid import budget as grid_budget
from benchmarks.grid import choice as grid_choice
from benchmarks.grid import correction_grid as grid
from benchmarks.grid import positions, stats, supervisor, waves
from evaluation.grader.tasks import score_chain

ROOT = Path(__file__).resolve().parents[3]

LABEL = json.dumps({"start": 5, "steps": [3, -2, 4]})
ANSWERS = {"5 + 3 = 8\n8 - 2 = 6\n6 + 4 = 11": "110",  # the last sum wrong
           "5 + 3 = 8 and then I stop": "1..",  # two steps never written
           "7 + 1 = 8\n5 + 3 = 9\n9 - 2 = 7": "01.",  # an off-chain line skipped, a wrong sum carried
           "5 + 3 = 8, 8 - 2 = 6, 6 + 4 = 10": "111"}


@pytest.mark.parametrize("response", list(ANSWERS))
def test_chain_marks_agree_with_the_graders_score(response):
    marks = positions.chain_marks(response, LABEL)
    assert marks == ANSWERS[response]
    assert marks.count(positions.RIGHT) / len(marks) == pytest.approx(score_chain(response, LABEL))


def test_buckets_and_first_wrong_step_by_hand():
    marks = ["1111100000", "1111111111", "..........", "1010101010"]
    # fifths of 10 steps: pairs of columns; right cells per pair over 4 answers x 2 steps
    assert positions.bucket_accuracy(marks) == [5 / 8, 5 / 8, 4 / 8, 3 / 8, 3 / 8]
    assert [positions.first_wrong(m) for m in marks] == [6, 11, 1, 2]
    assert positions.bucket_names(25)[0] == "steps 1-5" and positions.bucket_names(25)[-1] == "steps 21-25"


def _train_row(step: int, peak: float, **kw) -> dict:
    return {"step": step, "kv_pool_peak_used": peak, "rollout_engine0/samples": 128.0,
            "prefix_hit_fraction": 0.875, "prompt_len_mean": 192.0, "response_len_max": 400.0, **kw}


def test_budget_model_by_hand():
    """16 groups x 192 prompt slots + 128 samples x (B + 16): B = 64 -> 3,072 + 10,240 = 13,312;
    against dense peaks 52,000 and 41,600: 0.256 and 0.32; B = 512 is capped at the 400-token answer."""
    dense = {"dense-s1": [_train_row(1, 30_000.0), _train_row(60, 52_000.0)],
             "dense-s2": [_train_row(1, 41_600.0)]}
    shape = grid_budget.shape_of(dense["dense-s1"])
    assert (shape.samples, shape.per_prompt, shape.groups, shape.answer_cap) == (128, 8, 16, 400)
    assert grid_budget.modelled_peak(shape, 64, 16) == 13_312
    assert grid_budget.modelled_peak(shape, 512, 16) == 3_072 + 128 * 400
    lines = grid_budget.budget_lines(dense, [64], 16, {64: [_train_row(5, 13_000.0)]})
    assert "dense-s1 52,000" in lines[1] and lines[-1] == "| 64 | 13,312 | 0.26-0.32 | 13,000 | 0.25-0.31 |"


def test_gate_verdicts():
    assert grid_analysis.gate_verdict(stats.Interval(0.12, 0.02, 0.22, 5)) == "PASSED"
    assert grid_analysis.gate_verdict(stats.Interval(0.057, 0.018, 0.096, 4)) == \
        "FAILED (mean 0.043 short of +0.10)"
    assert grid_analysis.gate_verdict(stats.Interval(0.15, -0.01, 0.31, 5)).startswith("FAILED (low end -0.010")
    assert grid_analysis.gate_verdict(stats.Interval(0.2, math.nan, math.nan, 1)).startswith("NOT DECIDED")


def _jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


# Per seed: dense start / final, sparse_rl and uncorrected final (evaluated dense)
DENSE = [(0.30, 0.45), (0.35, 0.50), (0.40, 0.50)]
SPARSE_RL = [0.44, 0.50, 0.47]
UNCORRECTED = [0.40, 0.44, 0.42]  # sparse_rl - uncorrected: 0.04, 0.06, 0.05


def write_partial_grid(folder: Path) -> None:
    """Three seeds of wave 61's first tier (the rest of the wave missing), dense-s3 cut at 40."""
    folder.mkdir(parents=True)
    for s, (start, final) in enumerate(DENSE, 1):
        last = 40 if s == 3 else 60
        _jsonl(folder / f"dense-s{s}.jsonl", [
            {"step": 0, "eval/chain/score": start, "eval_steps/chain": ["111..", "10..."]},
            {"step": 1, "kv_pool_peak_used": 50_000.0, "kv_pool_peak_bytes": 100.0, "k3_kl": 0.001},
            {"step": last, "eval/chain/score": final, "eval_prompts/chain": [final] * 4,
             "eval_steps/chain": ["11111", "11100"]}])
        for name, acc in (("rkv-128-sparse_rl", SPARSE_RL), ("rkv-128-disabled", UNCORRECTED)):
            _jsonl(folder / f"{name}-s{s}.jsonl", [
                {"step": 0, "eval/chain_dense/score": start, "eval/chain/score": start - 0.1},
                {"step": 1, "kv_pool_peak_used": 20_000.0, "kv_pool_peak_bytes": 40.0, "k3_kl": 0.01,
                 "rejected_fraction": 0.02 if "sparse" in name else 0.0},
                {"step": 60, "eval/chain_dense/score": acc[s - 1], "eval_prompts/chain_dense": [acc[s - 1]] * 4,
                 "eval/chain/score": acc[s - 1] - 0.05, "eval_prompts/chain": [acc[s - 1] - 0.05] * 4,
                 "eval_steps/chain_dense": ["11110", "1...."]}])


def test_worth_curves_and_choice_on_a_partial_grid(tmp_path):
    write_partial_grid(tmp_path / "g")
    results = grid.collect(grid.discover(tmp_path / "g"), tmp_path / "g")
    worth = next(line for line in grid_analysis.worth_lines(results, "chain") if line.startswith("| rkv:128:sparse_rl"))
    # differences 0.04, 0.06, 0.05: mean 0.05, s = 0.01, half-width t(0.975, 2) 4.3027 x 0.01 / sqrt(3) = 0.0248
    cells = [c.strip() for c in worth.strip("|").split("|")]
    assert cells[1:4] == ["rkv:128:disabled", "3", "+0.050 [+0.025, +0.075]"] and cells[-1] == "yes"
    # by prompt: 12 values (4 each of 0.04, 0.06, 0.05), s.d. 0.00816: ~1.96 x 0.00816 / sqrt(12) = 0.0046
    low, high = (float(x) for x in cells[4].split("[")[1].rstrip("]").split(","))
    assert low == pytest.approx(0.0454, abs=0.0015) and high == pytest.approx(0.0546, abs=0.0015)
    dense_curve = grid_analysis.curve(grid.dense_by_seed(results).values(), "chain", True)
    assert sorted(dense_curve) == [0, 40, 60] and dense_curve[60].n == 2 and dense_curve[0].mean == pytest.approx(0.35)
    choice = next(line for line in grid_choice.choice_lines(results, "chain") if line.startswith("| rkv:128:sparse_rl"))
    assert "| 0.40 [0.40, 0.40] | 0.40 [0.40, 0.40] |" in choice  # slots and bytes of dense's
    assert "+0.000 [+0.000, +0.000]" in choice  # step 0: the same weights as dense
    where = next(line for line in grid_choice.position_lines(results, "chain") if line.startswith("| rkv:128:sparse_rl"))
    # 3 seeds x ["11110", "1...."]: per step right 6, 3, 3, 3, 0 of 6; first wrong 5 and 2; written 5 and 1
    assert where == "| rkv:128:sparse_rl | dense | 1.00 | 0.50 | 0.50 | 0.50 | 0.00 | 3.5 | 3.0 |"
    expected = [j.run.name for j in waves.wave_jobs(waves.WAVES[61], [1, 2, 3, 4, 5], "rkv:128", False)]
    missing = grid_analysis.missing_lines(results, expected, 60)
    assert missing[0] == "Runs: 8 of 45 complete." and missing[2] == "Unfinished (1): dense-s3 (40/60)"


def test_report_cli_puts_the_gate_first_and_lists_what_is_missing(tmp_path):
    write_partial_grid(tmp_path / "g")
    out = subprocess.run([sys.executable, "-m", "benchmarks.grid.correction_grid", "report",
                          str(tmp_path / "g"), "--wave", "61", "--curves", str(tmp_path / "c.png")],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    # dense gains 0.15, 0.15, 0.10: mean 0.1333, s = 0.02887, half-width 4.3027 x 0.01667 = 0.0717
    assert lines[0].startswith("**Gate** - dense's gain over its start") and "+0.133 [+0.062, +0.205]" in lines[0]
    assert lines[0].endswith("**PASSED**") and "Not run (36)" in out.stdout
    assert out.stdout.index("**Gate**") < out.stdout.index("### Paired against dense")
    assert (tmp_path / "c.png").stat().st_size > 10_000
    bad = subprocess.run([sys.executable, "-m", "benchmarks.grid.correction_grid", "report",
                          str(tmp_path / "g"), "--wave", "7"], capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and "--wave 7: choose one of" in bad.stderr and "Traceback" not in bad.stderr


def test_export_marks_chain_answers_step_by_step(tmp_path):
    job = waves.Job(grid.parse_config("dense", 1), "chain")
    folder = job.folder(tmp_path)
    (folder / "logs" / "eval_samples").mkdir(parents=True)
    (folder / "logs" / "metrics.jsonl").write_text(json.dumps({"step": 0, "eval/chain/score": 0.5}) + "\n")
    (folder / "command.txt").write_text("python -m trainer.train --seed 1\n")
    evals = tmp_path / "eval.jsonl"
    other = json.dumps({"start": 1, "steps": [1, 1, 1]})
    evals.write_text("".join(json.dumps({"label": lab}) + "\n" for lab in (LABEL, other)))
    answers = [{"label": other, "reward": 1 / 3, "response": "1 + 1 = 2", "final": True},
               {"label": LABEL, "reward": 2 / 3, "response": "5 + 3 = 8\n8 - 2 = 6\n6 + 4 = 11", "final": True}]
    (folder / "logs" / "eval_samples" / "chain_rollout0.jsonl").write_text("".join(json.dumps(a) + "\n" for a in answers))
    row = json.loads(waves.export_run(job, tmp_path, evals).read_text().splitlines()[0])
    assert row["eval_steps/chain"] == ["110", "1.."] and row["eval_prompts/chain"] == [2 / 3, 1 / 3]
    assert row["run/command"] == "python -m trainer.train --seed 1"


def test_bundle_has_a_progress_line_per_run_and_stays_under_the_limit(tmp_path, monkeypatch):
    out = tmp_path / "w"
    (out / "data" / "chain").mkdir(parents=True)
    _jsonl(out / "data" / "chain" / "dense-s1.jsonl", [{"step": 60, "eval/chain/score": 0.5}])
    (out / "chain" / "rkv-128-sparse_rl-s1" / "logs").mkdir(parents=True)
    _jsonl(out / "chain" / "rkv-128-sparse_rl-s1" / "logs" / "metrics.jsonl", [{"step": 12, "reward_mean": 0.1}])
    (out / "chain" / "rkv-128-sparse_rl-s1" / "run.log").write_bytes(b"x" * 200_000)
    state = {"wave": "wave61", "num_rollout": 60, "finished": False, "jobs": [
        {"task": "chain", "name": "dense-s1", "status": "done"},
        {"task": "chain", "name": "rkv-128-sparse_rl-s1", "status": "running"}]}
    (out / "state.json").write_text(json.dumps(state))
    target = supervisor.make_bundle(out, tmp_path / "b", "wave61")
    with tarfile.open(target) as tar:
        progress = tar.extractfile("progress.txt").read().decode().splitlines()
        log = tar.extractfile("chain/rkv-128-sparse_rl-s1/run.log").read()
    assert progress == ["dense-s1 done 60/60", "rkv-128-sparse_rl-s1 runn 12/60"]
    assert len(log) == supervisor.LOG_TAIL
    monkeypatch.setattr(supervisor, "BUNDLE_LIMIT", 500)  # the logs go first when it is too big
    with tarfile.open(supervisor.make_bundle(out, tmp_path / "b", "wave61")) as tar:
        assert "data/chain/dense-s1.jsonl" in tar.getnames() and not any(n.endswith("run.log") for n in tar.getnames())


@pytest.mark.launch
@pytest.mark.slow  # ~2 min: CI's launch stage keeps its margin; the grid's own CPU smoke is slow too
def test_grid_lane_smoke_start_then_poll(tmp_path):
    """``benchmarks/grid/lane.sh`` as the lead runs it, on the CPU smoke (SMOKE=1: the tiny model,
    2 seeds x dense and R-KV 20, 2 rollouts; 7-8 min here on 2 cores at load 10-16): ``start`` returns with the
    supervisor detached, ``poll`` waits for it and leaves the bundle (every run's JSONL and a
    progress line per run), the report (the gate first) and both plots; a second ``start``
    finds every run done and launches none."""
    import os

    env = dict(os.environ, SMOKE="1", GRID_OUT=str(tmp_path / "w"), PYTHON=sys.executable,
               DONE_DIR=str(tmp_path / "none"))
    lane = ["bash", str(ROOT / "benchmarks" / "grid" / "lane.sh")]
    started = subprocess.run([*lane, "start"], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert started.returncode == 0 and "supervisor" in started.stdout, started.stdout + started.stderr
    polled = subprocess.run([*lane, "poll", "1200", str(tmp_path / "out")], capture_output=True, text=True,
                            cwd=ROOT, env=env, timeout=1500)
    log = (tmp_path / "w" / "supervisor.log").read_text()
    assert polled.returncode == 0, polled.stdout[-3000:] + log[-3000:]
    with tarfile.open(tmp_path / "out" / "smoke.tar.gz") as tar:
        progress = tar.extractfile("progress.txt").read().decode().splitlines()
        names = tar.getnames()
    runs = ["dense-s1", "rkv-20-sparse_rl-s1", "dense-s2", "rkv-20-sparse_rl-s2"]
    assert sorted(progress) == sorted(f"{r} done 2/2" for r in runs)
    assert all(f"data/arith/{r}.jsonl" in names for r in runs)
    report = (tmp_path / "out" / "report.md").read_text()
    assert report.startswith("**Gate** - dense's gain over its start") and "| rkv:20:sparse_rl | 2 |" in report
    assert all((tmp_path / "out" / png).stat().st_size > 10_000 for png in ("curves.png", "pareto.png"))
    again = subprocess.run([*lane, "start"], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert again.returncode == 0
    polled = subprocess.run([*lane, "poll", "300", str(tmp_path / "out")], capture_output=True, text=True,
                            cwd=ROOT, env=env, timeout=600)
    assert polled.returncode == 0 and "(attempt" not in (tmp_path / "w" / "supervisor.log").read_text()[len(log):]
