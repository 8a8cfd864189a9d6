"""Issue 61's report beyond the paired table (``paired.py``): the gate first, what the grid
is missing, the correction's worth, learning curves with bands over seeds, and the columns a user
needs to pick a budget and a correction (k3, rejected share, pool bytes, where in the answer the
errors fall).

The gate: dense's gain over its own start (final minus step-0 greedy accuracy, by seed) must have
a 95% interval whose low end is above 0 and a mean of at least +0.10. A compressed config can only
show that it keeps *learning* when dense learned; below the gate every compressed-run line is a
statement about a policy that barely moved.
"""

from __future__ import annotations

import math
from pathlib import Path

from benchmarks.grid import paired, stats
from benchmarks.grid import runs as grid

GATE_GAIN = 0.10


def gate_verdict(gain: stats.Interval) -> str:
    if gain.n < 2:
        return "NOT DECIDED (needs >= 2 dense seeds)"
    misses = []
    if not gain.low > 0:
        misses.append(f"low end {gain.low:+.3f}, needs > 0")
    if gain.mean < GATE_GAIN:
        misses.append(f"mean {GATE_GAIN - gain.mean:.3f} short of +{GATE_GAIN:.2f}")
    return "PASSED" if not misses else "FAILED (" + "; ".join(misses) + ")"


def gate_lines(results: list[grid.RunResult], task: str) -> list[str]:
    gain = paired.dense_gain(results, task)
    verdict = gate_verdict(gain)
    lines = [f"**Gate** - dense's gain over its start (final - step 0, greedy, by seed): {gain.fmt()} "
             f"(n={gain.n}); target: 95% low end > 0 and mean >= +{GATE_GAIN:.2f}: **{verdict}**"]
    if not verdict.startswith("PASSED"):
        lines.append("The gate is not passed: what follows about the compressed runs does not say whether "
                     "compression keeps learning (dense did not learn enough to lose).")
    return lines


# --------------------------------------------------------------------------- what is missing

def missing_lines(results: list[grid.RunResult], expected: list[str], num_rollout: int) -> list[str]:
    """The expected runs (names ``<config>-s<seed>``) absent, or short of ``num_rollout``."""
    have = {r.run.name: max((x["step"] for x in r.rows), default=0) for r in results}
    absent = [n for n in expected if n not in have]
    short = [f"{n} ({have[n]}/{num_rollout})" for n in expected if n in have and have[n] < num_rollout]
    done = len(expected) - len(absent) - len(short)
    lines = [f"Runs: {done} of {len(expected)} complete."]
    if absent:
        lines.append(f"Not run ({len(absent)}): {', '.join(absent)}")
    if short:
        lines.append(f"Unfinished ({len(short)}): {', '.join(short)}")
    return lines


# --------------------------------------------------------------------------- the correction's worth

def uncorrected_of(run: grid.GridRun) -> str | None:
    """The uncorrected config at the same algorithm, budget and variants (None: it is uncorrected)."""
    if run.algorithm == "none" or (run.preset == "disabled" and run.replay is None):
        return None
    return grid.GridRun(run.algorithm, run.budget, "disabled", run.seed, None, run.variants).config


def worth(group: list[grid.RunResult], base: list[grid.RunResult], task: str, as_dense: bool) -> dict:
    acc = {r.run.seed: paired.final_accuracy(r, task, as_dense) for r in group}
    ref = {r.run.seed: paired.final_accuracy(r, task, as_dense) for r in base}
    prompts = {r.run.seed: paired.final_prompt_scores(r, task, as_dense) for r in group}
    ref_prompts = {r.run.seed: paired.final_prompt_scores(r, task, as_dense) for r in base}
    return {"t": stats.t_interval(stats.paired_differences(acc, ref)),
            "boot": stats.bootstrap_interval(stats.prompt_differences(prompts, ref_prompts),
                                             seed=stats.jitter_seed(group[0].run.config, "worth", as_dense))}


def worth_lines(results: list[grid.RunResult], task: str) -> list[str]:
    by_config = groups(results)
    head = ["corrected", "minus", "seeds", "Δ evaluated dense, by seed (t)", "Δ by prompt (bootstrap)",
            "Δ deployed compressed, by seed (t)", "worth it (low end > 0, by seed)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for config, group in by_config.items():
        base_name = uncorrected_of(group[0].run)
        base = by_config.get(base_name) if base_name else None
        if not base:
            continue
        dense_eval, deployed = worth(group, base, task, True), worth(group, base, task, False)
        seeds = len({r.run.seed for r in group} & {r.run.seed for r in base})
        shown = "yes" if dense_eval["t"].low > 0 else ("-" if math.isnan(dense_eval["t"].low) else "no")
        lines.append("| " + " | ".join([config, base_name, str(seeds), dense_eval["t"].fmt(),
                                        dense_eval["boot"].fmt(), deployed["t"].fmt(), shown]) + " |")
    if len(lines) == 2:
        return ["(no corrected config with its uncorrected twin in this grid)"]
    return lines + ["", "Paired by seed: the same warm-up, data order and held-out prompts; Δ in accuracy."]


def groups(results: list[grid.RunResult]) -> dict[str, list[grid.RunResult]]:
    out: dict[str, list[grid.RunResult]] = {}
    for r in results:
        if r.rows:
            out.setdefault(r.run.config, []).append(r)
    return out


# --------------------------------------------------------------------------- learning curves

def curve(group: list[grid.RunResult], task: str, as_dense: bool) -> dict[int, stats.Interval]:
    """Per eval step: the greedy accuracy over the group's seeds, as a 95% interval."""
    per_step: dict[int, list[float]] = {}
    for r in group:
        for step, value in r.series(r.eval_key(task, "0", as_dense, "score")):
            per_step.setdefault(step, []).append(value)
    return {s: stats.t_interval(v) for s, v in sorted(per_step.items())}


def curve_lines(results: list[grid.RunResult], task: str) -> list[str]:
    by_config = groups(results)
    steps = sorted({s for g in by_config.values() for s in curve(g, task, True)})
    lines = ["| config | evaluated | " + " | ".join(f"rollout {s}" for s in steps) + " |",
             "|" + "---|" * (len(steps) + 2)]
    for config, group in by_config.items():
        modes = (True,) if group[0].run.algorithm == "none" else (True, False)
        for as_dense in modes:
            points = curve(group, task, as_dense)
            cells = [points[s].fmt(signed=False) if s in points else "-" for s in steps]
            lines.append(f"| {config} | {'dense' if as_dense else 'deployed'} | " + " | ".join(cells) + " |")
    return lines


def plot_curves(results: list[grid.RunResult], path: Path, task: str) -> None:
    """Greedy accuracy against rollout, mean over seeds with its 95% band, evaluated dense and
    deployed compressed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 5), sharey=True)
    for i, (config, group) in enumerate(groups(results).items()):
        color = plt.cm.tab10(i % 10)
        for ax, as_dense in zip(axes, (True, False)):
            if not as_dense and group[0].run.algorithm == "none":
                as_dense = True  # dense deployed is dense: the reference line on both panels
            _band(ax, curve(group, task, as_dense), color, config)
    for ax, title in zip(axes, ("evaluated dense", "deployed compressed (dense: as trained)")):
        ax.set_title(f"greedy accuracy, {title}", fontsize=10)
        ax.set_xlabel("rollout")
    axes[0].set_ylabel("accuracy (mean over seeds, 95% band)")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _band(ax, points: dict[int, stats.Interval], color, label: str) -> None:
    steps = list(points)
    if not steps:
        return
    ax.plot(steps, [points[s].mean for s in steps], marker="o", color=color, label=label, linewidth=1.3)
    low = [points[s].low if not math.isnan(points[s].low) else points[s].mean for s in steps]
    high = [points[s].high if not math.isnan(points[s].high) else points[s].mean for s in steps]
    ax.fill_between(steps, low, high, color=color, alpha=0.15)
