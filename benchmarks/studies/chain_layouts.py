"""SmolLM2 learning the ``chain`` task in the layouts of ``layouts.py``: steps per hour and
the reward curves side by side, against one-GPU sync (issue 39, item 4).

One call on a 2-GPU machine (``nvidia-h100-x2``), one seed (~8 minutes, see below):

    PYTHONPATH=sglang-kvc:. python -m benchmarks.studies.chain_layouts --model-dir models/SmolLM2-135M-Instruct \\
        --layouts 1gpu-sync coloc-dp2-sync disagg-s1 --configs dense rkv:192 --seeds 1 --num-rollout 20 \\
        --eval-interval 20 --eval-prompts 32 --gpus 0,1 --parallel --out $OUT/chain_layouts

then the same with ``--seeds 2`` on a second call (its own warm-up, of seed 2, as the grid's
runs have), both calls' ``--out`` folders merged into one and reported together:
``python -m benchmarks.studies.chain_layouts --report-only --seeds 1 2 --configs dense rkv:192 --out <merged>``.

What the time goes on (docs/benchmarks.md's SmolLM2 timings, an H200 or H100 of a 2-GPU host):
the warm-up once on the host's CPU (~40 s; 2-2.5 min on 2 cores, docs/long_task.md) and the
torch_dist import once (~10 s); per run ~40 s of start-up (imports, Megatron, engine, graphs,
rollout 1's compile), ~2.7 s a rollout for 1-GPU sync (assumed ~1.8 s colocated DP 2 and ~2 s
disaggregated staleness 1: both halve or hide part of the step), ~2-4 s an eval (a compressed
run evaluates twice: its compression and dense). With ``--parallel`` the two 1-GPU runs share a
wave, one per GPU, and each 2-GPU run has the machine alone: 5 waves of ~80-105 s, ~8 minutes in
all. The full grid (2 seeds x 30 rollouts x dense and rkv:192 x 3 layouts, 12 runs in 10 waves,
evals every 10 rollouts) would take ~20 minutes, and fewer rollouts alone cannot fit it in 10:
the 10 waves' start-up is ~7 minutes by itself. Hence one seed per call and 20 rollouts; the
trade-off: no s.e. from one call (a second call brings it, its 1-GPU sync beside it), the reward's
mean over rollouts 11-20 instead of 21-30, only the greedy evals before and after training, on
32 prompts (~0.09 s.e. for an accuracy near 0.5: layouts differing by less than ~0.15 on one seed
are not told apart). The two 1-GPU runs of a wave share the host's CPUs; on a host-bound model
that may slow them a little (ratios slightly flattered).

Each run is ``trainer.train`` under ``torch.distributed.run`` (``layouts.launcher``, as
``layouts.py`` launches its runs) with the layout's flags (``layouts.LAYOUTS``), the
training the correction grid uses (``grid/correction_grid.py``: the quickstart's setup and trainer
flags, ``REAL_MODEL_FLAGS``' 16 prompts x 8 samples and 81,920-slot pool per engine, the grid's
eval flags and held-out prompts, lr 1e-5). A config is ``dense`` or the grid's
``ALGORITHM:BUDGET[:PRESET[:REPLAY]]`` (``rkv:192`` is ``rkv:192:sparse_rl``, the trainer's
default correction). The warm-up (``trainer.warmup``, the quickstart's) runs once, on the first
seed, and every seed, config and layout starts from that checkpoint (and shares its torch_dist
import); each seed has its own training rows and sampling seed. ``--gpus`` lists the GPUs
(default: all); a run gets ``CUDA_VISIBLE_DEVICES`` of as many as its layout takes (1-GPU sync 1,
the 2-GPU layouts 2), and with ``--parallel`` runs start whenever their GPUs are free (default:
one run at a time). The pool is the same for every layout, so a ``*-fullgpu`` layout equals its
plain one here (the whole batch fits one engine's pool dense).

Printed per (config, layout), and in ``<out>/chain_layouts.json``: rollouts, the step time's
median over the rollouts after the first ``--skip`` (2: start-up and compile, the async pipeline
filling) pooled over seeds, steps per hour and their ratio to the config's 1-GPU sync, the median
split (rollout wait, recompute, update, sync), ``aborted`` summed over every rollout (must be 0),
the mean reward over the last ``--last`` (10) rollouts and the final greedy eval accuracy
(evaluated dense), each mean ± s.e. over seeds. The plot (``--plot``): the reward per rollout,
mean over seeds with their range as a band, one line per layout, against the rollout and against
the cumulative step time (evals and start-up left out). Each run's folder:
``<out>/<layout>/<config>-s<seed>`` (``logs/metrics.jsonl``, ``run.log``, ``command.txt``).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.grid import correction_grid as grid
from benchmarks.studies.layouts import LAYOUTS, launcher, with_speedups
from benchmarks.common.runs import prepare_run_dir

ROOT = Path(__file__).resolve().parents[2]

PHASES = ("rollout", "recompute", "update", "sync")
DEFAULT_PRESET = "sparse_rl"  # the trainer's --mis-preset default


@dataclasses.dataclass(frozen=True)
class Job:
    """One run: a config and seed (the grid's run) in one layout."""

    run: grid.GridRun
    layout: str

    def folder(self, out: Path) -> Path:
        return out / self.layout / self.run.name


@dataclasses.dataclass
class Setup:
    """What every run shares: the warm-up checkpoint, each seed's rows, the held-out prompts."""

    model: Path
    data: dict[int, Path]
    flags: list[str]  # the quickstart's trainer flags for --model (compression is per config)
    evals: Path
    work: Path  # holds the torch_dist import of ``model``


def config_run(spec: str, seed: int) -> grid.GridRun:
    """The grid's config, ``ALGORITHM:BUDGET`` with the trainer's default correction."""
    if "+" in spec:
        raise ValueError(f"config {spec!r}: variants (+NAME) are the grid's, not run here")
    if spec.count(":") == 1:
        spec += ":" + DEFAULT_PRESET
    return grid.parse_config(spec, seed)


def config_flags(run: grid.GridRun, model: str) -> list[str]:
    """The trainer flags of a config: the engine's compression as the quickstart sets it
    (``compress_flags``), then the correction (the grid's flags after its first four, which are
    the quickstart's own --compress-algorithm / --kv-budget)."""
    from trainer.quickstart import compress_flags

    if run.algorithm == "none":
        return []
    return [*compress_flags(model, run.algorithm, run.budget), *run.flags()[4:]]


# --------------------------------------------------------------------------- setup and runs

def setup_args(args, seed: int, warm: bool) -> argparse.Namespace:
    # what the quickstart's setup reads; compression comes per config, and only the first
    # seed warms up (0 steps after it: its checkpoint is everyone's)
    return argparse.Namespace(model_dir=args.model_dir, task=args.task, seed=seed,
                              compress_algorithm="none", kv_budget=None,
                              warmup_steps=args.warmup_steps if warm else 0)


def prepare(args) -> Setup:
    """The quickstart's setup per seed (its training rows), the warm-up once; the grid's
    held-out prompts."""
    from trainer.quickstart import SETUPS

    work, model, data, flags = args.out / "setup", None, {}, []
    for seed in args.seeds:
        folder = work / f"s{seed}"
        folder.mkdir(parents=True, exist_ok=True)
        got, rows, flags = SETUPS[args.model](folder, setup_args(args, seed, warm=model is None))
        model, data[seed] = model or got, folder / "train.jsonl"
        data[seed].write_text("".join(json.dumps(r) + "\n" for r in rows))
    evals = grid.eval_file(args.out, args.model, args.task, args.eval_prompts, args.eval_seed)
    return Setup(model, data, flags, evals, work)


def job_argv(job: Job, args, setup: Setup) -> list[str]:
    """torchrun over trainer.train as the quickstart calls it for this seed, then the config's
    compression and correction, the grid's evals and real-model batch, the layout's flags and
    the user's (a repeated flag's last value wins)."""
    from trainer.quickstart import train_argv

    seed, layout = job.run.seed, LAYOUTS[job.layout]
    # no --save: the final checkpoint costs wall time and nothing here reads it
    train = train_argv(setup.model, setup.data[seed], job.folder(args.out), args.num_rollout,
                       args.lr, seed, setup.flags, save=False)
    real = grid.REAL_MODEL_FLAGS if args.model == "smollm2" else ()
    return [*launcher(layout), "-m", "trainer.train", *train, *config_flags(job.run, args.model),
            *grid.eval_flags(job.run, args, setup.evals), *real, *layout.flags, *args.extra]


def launch(job: Job, args, setup: Setup, gpus: list[int]) -> subprocess.Popen:
    folder = job.folder(args.out)
    prepare_run_dir(folder, setup.model, setup.work)  # logs/hf_import -> the one shared import
    (folder / "logs" / "metrics.jsonl").unlink(missing_ok=True)  # the logger appends: no stale rows
    argv = job_argv(job, args, setup)
    (folder / "command.txt").write_text(shlex.join(argv) + "\n")
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus))
    print(f"[chain-layouts] {job.layout}/{job.run.name} on GPUs {gpus or 'none'}", flush=True)
    return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=open(folder / "run.log", "w"),
                            stderr=subprocess.STDOUT)


def next_fit(pending: list[Job], free: list[int], running: list, args) -> Job | None:
    """The first pending job whose layout's GPUs are free (any, without --gpus lanes), only
    beside others with --parallel."""
    if running and not args.parallel:
        return None
    for i, job in enumerate(pending):
        if not args.lanes or LAYOUTS[job.layout].gpus <= len(free):
            return pending.pop(i)
    return None


def reap(running: list, free: list[int], failed: list[str]) -> list:
    """The jobs still running; a finished one gives its GPUs back (and is named if it failed)."""
    still = []
    for job, proc, gpus in running:
        if proc.poll() is None:
            still.append((job, proc, gpus))
            continue
        free.extend(gpus)
        if proc.returncode:
            failed.append(f"{job.layout}/{job.run.name} (exit {proc.returncode})")
    return still


def run_all(jobs: list[Job], args, setup: Setup) -> list[str]:
    """Every job on its GPUs from the lanes; returns the failed ones."""
    pending, running, free, failed = list(jobs), [], list(args.lanes), []
    start = shown = time.time()
    while pending or running:
        job = next_fit(pending, free, running, args)
        if job is not None:
            gpus = free[:LAYOUTS[job.layout].gpus] if args.lanes else []
            del free[:len(gpus)]
            running.append((job, launch(job, args, setup, gpus), gpus))
            continue
        time.sleep(1.0)  # short: a finished run's GPUs go to the next one at once
        running = reap(running, free, failed)
        if time.time() - shown >= args.poll:
            shown = time.time()
            print(f"[chain-layouts +{shown - start:.0f}s] {progress(running, args.out)}", flush=True)
    return failed


def progress(running: list, out: Path) -> str:
    return " | ".join(f"{job.layout}: {grid.progress([job.run], out / job.layout, {})}"
                      for job, _, _ in running)


# --------------------------------------------------------------------------- report

def timed(rows: list[dict], skip: int) -> list[dict]:
    """The rollouts step times are taken from: after the first ``skip`` (start-up, compile, the
    async pipeline filling), or all of a run too short to have any after them."""
    steps = [r for r in rows if "time_total" in r]
    return steps[skip:] or steps


def summarize(config: str, layout: str, results: list[grid.RunResult], args) -> dict:
    """One (config, layout): step times pooled over seeds, their median's steps per hour and
    split; aborted samples over every rollout; reward and final greedy eval over seeds."""
    rows = [r for res in results for r in timed(res.rows, args.skip)]
    steps = [r["time_total"] for r in rows]
    reward = grid.mean_se([grid._last_mean(res, "reward_mean", args.last) for res in results])
    score = grid.mean_se([res.final(res.eval_key(args.task, "0", True, "score")) for res in results])
    return {"config": config, "layout": layout, "gpus": LAYOUTS[layout].gpus, "seeds": len(results),
            "rollouts": min(len(res.series("time_total")) for res in results), "step_s": steps,
            "step_median_s": statistics.median(steps), "steps_per_hour": 3600 / statistics.median(steps),
            **{f"{p}_s": statistics.median(r.get(f"time_{p}", 0.0) for r in rows) for p in PHASES},
            "aborted": sum(r.get("aborted", 0.0) for res in results for r in res.rows),
            "reward_last": reward[0], "reward_last_se": reward[1],
            "eval_greedy": score[0], "eval_greedy_se": score[1]}


def collect(args) -> dict[tuple[str, str], list[grid.RunResult]]:
    """Per (config, layout): the seeds' runs that trained at least one rollout."""
    groups = {}
    for spec, layout in itertools.product(args.configs, args.layouts):
        runs = [config_run(spec, seed) for seed in args.seeds]
        found = grid.collect(runs, args.out / layout)
        groups[runs[0].config, layout] = [r for r in found if r.series("time_total")]
    return groups


def table_rows(groups: dict, args) -> list[dict]:
    """Each group's summary, with its speed against the config's 1-GPU sync (``vs_1gpu_median``:
    the ratio of steps per hour)."""
    rows = [summarize(config, layout, results, args) if results else
            {"config": config, "layout": layout, "error": "no metrics"}
            for (config, layout), results in groups.items()]
    return with_speedups(rows)


def print_rows(rows: list[dict]) -> None:
    print("| config | layout | GPUs | seeds | rollouts | median step s | steps/h | vs 1-GPU sync | "
          "rollout wait / recompute / update / sync s | aborted | reward (last 10) | eval greedy (final) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---|---:|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['config']} | {r['layout']} | | | | {r['error']} |")
            continue
        split = " / ".join(f"{r[f'{p}_s']:.2f}" for p in PHASES)
        print(f"| {r['config']} | {r['layout']} | {r['gpus']} | {r['seeds']} | {r['rollouts']} | "
              f"{r['step_median_s']:.2f} | {r['steps_per_hour']:.0f} | "
              f"{r.get('vs_1gpu_median', math.nan):.2f}x | {split} | {r['aborted']:.0f} | "
              f"{grid.fmt_mean_se(r['reward_last'], r['reward_last_se'])} | "
              f"{grid.fmt_mean_se(r['eval_greedy'], r['eval_greedy_se'])} |")


# --------------------------------------------------------------------------- plot

def seed_curve(results: list[grid.RunResult], wall: bool):
    """Reward per rollout over the rollouts every seed has: x (the rollout, or the cumulative
    step time, mean over seeds), the seeds' mean, min and max."""
    n = min(len(r.series("reward_mean")) for r in results)
    rewards = [[v for _, v in r.series("reward_mean")[:n]] for r in results]
    xs = [list(itertools.accumulate(v for _, v in r.series("time_total")[:n])) if wall else
          [s for s, _ in r.series("reward_mean")[:n]] for r in results]
    by_rollout = list(zip(*rewards))
    return ([statistics.mean(c) for c in zip(*xs)], [statistics.mean(c) for c in by_rollout],
            [min(c) for c in by_rollout], [max(c) for c in by_rollout])


def plot(groups: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    configs = list(dict.fromkeys(c for c, _ in groups))
    layouts = list(dict.fromkeys(lay for _, lay in groups))
    fig, axes = plt.subplots(len(configs), 2, figsize=(12, 4 * len(configs)), squeeze=False)
    for (config, layout), results in groups.items():
        for ax, wall in zip(axes[configs.index(config)], (False, True)):
            if results:
                x, mean, lo, hi = seed_curve(results, wall)
                color = plt.cm.tab10(layouts.index(layout) % 10)
                ax.plot(x, mean, color=color, label=layout)
                ax.fill_between(x, lo, hi, color=color, alpha=0.2)
            ax.set_title(f"{config}: reward (mean over seeds, band = range)", fontsize=10)
            ax.set_xlabel("cumulative step time, s" if wall else "rollout")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


# --------------------------------------------------------------------------- CLI

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layouts", nargs="+", default=["1gpu-sync", "coloc-dp2-sync", "disagg-s1"],
                   choices=sorted(LAYOUTS))
    p.add_argument("--configs", nargs="+", default=["dense"], help="dense or ALGORITHM:BUDGET[:PRESET]")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    p.add_argument("--num-rollout", type=int, default=30)
    p.add_argument("--model", default="smollm2", choices=["smollm2", "tiny"],
                   help="tiny: the quickstart's tiny random model (a CPU smoke run)")
    p.add_argument("--model-dir", default=None, help="SmolLM2-135M-Instruct's HF dir")
    p.add_argument("--task", default="chain")
    p.add_argument("--warmup-steps", type=int, default=None, help="default: the task's (chain: 12)")
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--eval-interval", type=int, default=10)
    p.add_argument("--eval-prompts", type=int, default=64)
    p.add_argument("--eval-samples", type=int, default=4, help="T = 1 samples per eval prompt")
    p.add_argument("--eval-seed", type=int, default=999_999)
    p.add_argument("--skip", type=int, default=2, help="first rollouts left out of step times")
    p.add_argument("--last", type=int, default=10, help="rollouts of the reported reward")
    p.add_argument("--gpus", default=None, help="the GPUs runs take theirs from, e.g. 0,1 "
                   "(default: all of them)")
    p.add_argument("--parallel", action="store_true", help="runs side by side while GPUs are free")
    p.add_argument("--poll", type=float, default=60.0, help="seconds between progress lines")
    p.add_argument("--out", type=Path, default=Path("runs/chain_layouts"))
    p.add_argument("--plot", type=Path, default=None, help="default: <out>/chain_layouts.png")
    p.add_argument("--report-only", action="store_true", help="summarize the runs under --out")
    args, extra = p.parse_known_args(argv)
    args.extra = extra  # anything else goes to every trainer.train, last
    return check(p, args)


def check(p: argparse.ArgumentParser, args) -> argparse.Namespace:
    """Everything a run would trip over, before the warm-up."""
    if args.model == "tiny":
        args.task = "arith"  # the tiny model learns its own counting task; only the eval's name
    try:
        [config_run(c, 0) for c in args.configs]
    except ValueError as e:
        p.error(f"--configs: {e}")
    args.lanes = lanes(args.gpus)
    widest = max(LAYOUTS[name].gpus for name in args.layouts)
    if args.lanes and widest > len(args.lanes) and not args.report_only:
        p.error(f"--layouts need {widest} GPUs; --gpus has {len(args.lanes)}")
    return args


def lanes(gpus: str | None) -> list[int]:
    """The GPUs runs take theirs from: --gpus, else every visible one (none on a CPU)."""
    if gpus:
        return [int(i) for i in gpus.split(",")]
    import torch

    return list(range(torch.cuda.device_count()))


def main(argv=None) -> int:
    args = parse_args(argv)
    failed = [] if args.report_only else run(args)
    groups = collect(args)
    rows = table_rows(groups, args)
    print_rows(rows)
    (args.out / "chain_layouts.json").write_text(json.dumps(rows, indent=2))
    plot(groups, args.plot or args.out / "chain_layouts.png")
    if failed:
        print(f"[chain-layouts] failed: {', '.join(failed)} (see <out>/<layout>/<run>/run.log)",
              file=sys.stderr)
    return 1 if failed else 0


def run(args) -> list[str]:
    from trainer.quickstart import check_trainer_flags

    check_trainer_flags(args.extra)  # a typo fails now, not after the warm-up
    args.out.mkdir(parents=True, exist_ok=True)
    setup = prepare(args)
    jobs = [Job(config_run(spec, seed), layout) for spec in args.configs
            for seed in args.seeds for layout in args.layouts]
    return run_all(jobs, args, setup)


if __name__ == "__main__":
    raise SystemExit(main())
