"""The paired report of the correction grid (issue 51): per config, final greedy accuracy
evaluated dense and deployed with the run's own compression, the paired difference from dense
with 95% intervals (``stats.py``), the non-inferiority verdict (3 points), the pool peak against
dense's own in the same seed (and against dense with prefix sharing, when the grid ran it), and
the Pareto plot of pool peak against accuracy with the intervals drawn.

Per-prompt scores come from the rows ``eval_prompts/<task><suffix>`` (one list per evaluation,
in the held-out file's order) that ``waves.export_run`` adds to each run's JSONL.
"""

from __future__ import annotations

import math
from pathlib import Path

from benchmarks.grid import runs as grid
from benchmarks.grid import stats

PREFIX_VARIANT = "prefix"  # dense with prefix sharing: the second pool reference
GAIN_TARGET = 0.15  # dense's gain over its start that makes a task learnable here


def prompt_key(result: grid.RunResult, task: str, dense: bool) -> str:
    """The per-prompt row of the greedy evaluation, as ``eval_key`` names its mean."""
    return result.eval_key(task, "0", dense, "score").replace("eval/", "eval_prompts/", 1)[: -len("/score")]


def final_prompt_scores(result: grid.RunResult, task: str, dense: bool) -> list[float]:
    key = prompt_key(result, task, dense)
    rows = [r for r in result.rows if isinstance(r.get(key), list)]
    return [float(x) for x in rows[-1][key]] if rows else []


def final_accuracy(result: grid.RunResult, task: str, dense: bool) -> float:
    return result.final(result.eval_key(task, "0", dense, "score"))


def start_accuracy(result: grid.RunResult, task: str) -> float:
    points = result.series(result.eval_key(task, "0", True, "score"))
    return points[0][1] if points and points[0][0] == 0 else math.nan


def references(results: list[grid.RunResult]) -> tuple[dict, dict]:
    """Per seed: the plain dense run, and dense with prefix sharing (``dense+prefix``)."""
    prefix = {r.run.seed: r for r in results
              if r.run.algorithm == "none" and r.run.variants == (PREFIX_VARIANT,)}
    return grid.dense_by_seed(results), prefix


def dense_gain(results: list[grid.RunResult], task: str) -> stats.Interval:
    """Dense's final greedy accuracy minus its step-0 accuracy, paired per seed."""
    dense, _ = references(results)
    return stats.t_interval([final_accuracy(r, task, True) - start_accuracy(r, task) for r in dense.values()])


def compare(group: list[grid.RunResult], dense: dict, task: str, as_dense: bool) -> dict:
    """The group's final accuracy (evaluated dense, or deployed with its own compression) and
    its paired difference from dense's, by seed (t) and by (seed, prompt) (bootstrap)."""
    acc = {r.run.seed: final_accuracy(r, task, as_dense) for r in group}
    ref = {s: final_accuracy(d, task, True) for s, d in dense.items()}
    prompts = {r.run.seed: final_prompt_scores(r, task, as_dense) for r in group}
    ref_prompts = {s: final_prompt_scores(d, task, True) for s, d in dense.items()}
    name = group[0].run.config
    return {"acc": stats.t_interval(list(acc.values())),
            "diff": stats.t_interval(stats.paired_differences(acc, ref)),
            "boot": stats.bootstrap_interval(stats.prompt_differences(prompts, ref_prompts),
                                             seed=stats.jitter_seed(name, as_dense))}


def pool_ratios(group: list[grid.RunResult], reference: dict) -> list[float]:
    """Each run's pool peak over its seed's reference run's peak (``pool_provision``)."""
    return [grid.pool_provision(r, reference.get(r.run.seed)) for r in group if r.run.seed in reference]


def pool_interval(group: list[grid.RunResult], reference: dict) -> stats.Interval:
    return stats.t_interval(pool_ratios(group, reference))


def pool_max(group: list[grid.RunResult], reference: dict) -> str:
    """The largest seed's ratio: the claim is "<= half the pool" in every seed, not on average
    (a seed whose dense run peaked low gives the largest ratio)."""
    ratios = [r for r in pool_ratios(group, reference) if r == r]
    return f"{max(ratios):.2f}" if ratios else "-"


HEAD = ["config", "seeds", "pool peak, of dense's (mean)", "max over seeds", "of dense+prefix's",
        "accuracy, evaluated dense", "Δ vs dense, by seed (t, primary)", "Δ vs dense, by prompt (bootstrap)",
        "non-inferior (-3 pts)", "accuracy, deployed compressed", "deployed Δ vs dense, by seed (t)",
        "deployed within 10 pts"]


def config_row(group: list[grid.RunResult], dense: dict, prefix: dict, task: str) -> list[str]:
    ours = compare(group, dense, task, True)
    compressed = group[0].run.algorithm != "none"
    deployed = compare(group, dense, task, False) if compressed else None
    is_dense = group[0].run.algorithm == "none" and not group[0].run.variants
    cells = [group[0].run.config, str(len(group)),
             pool_interval(group, dense).fmt(2, signed=False), pool_max(group, dense),
             pool_interval(group, prefix).fmt(2, signed=False) if prefix else "-",
             ours["acc"].fmt(signed=False)]
    if is_dense:
        return cells + ["(reference)", "", "", "", "", ""]
    cells += [ours["diff"].fmt(), ours["boot"].fmt(), stats.verdict(ours["diff"], stats.MARGIN)]
    if deployed is None:
        return cells + ["(dense)", "", ""]
    return cells + [deployed["acc"].fmt(signed=False), deployed["diff"].fmt(),
                    stats.verdict(deployed["diff"], stats.DEPLOY_MARGIN)]


def paired_table(results: list[grid.RunResult], task: str, gain_line: bool = True) -> list[str]:
    """The markdown table (and, above it unless ``gain_line`` is off, dense's gain over its start)."""
    dense, prefix = references(results)
    gain = dense_gain(results, task)
    lines = [f"Dense gain over its start (final - step 0, greedy, by seed): {gain.fmt()} "
             f"(n={gain.n}); target +{GAIN_TARGET:.2f}: {stats.gain_verdict(gain, GAIN_TARGET)}", ""][: 2 * gain_line]
    lines += ["| " + " | ".join(HEAD) + " |", "|" + "---|" * len(HEAD)]
    for config in dict.fromkeys(r.run.config for r in results):
        group = [r for r in results if r.run.config == config and r.rows]
        if group:
            lines.append("| " + " | ".join(config_row(group, dense, prefix, task)) + " |")
    lines += ["", "Intervals are 95%: [low, high]. Δ is in accuracy (0.03 = 3 points); a config is "
              "non-inferior when the by-seed interval's low end is >= -0.03. The by-prompt bootstrap "
              "pools the seeds' (seed, prompt) differences and holds only the eval set's sampling "
              "error. Pool peak: the run's largest KV pool peak over its seed's dense run's largest; "
              "the mean over seeds with its interval, and the largest seed's ratio."]
    return lines


# --------------------------------------------------------------------------- Pareto with intervals

def pareto_points(results: list[grid.RunResult], task: str) -> list[dict]:
    """Per config: pool peak (of dense's) and accuracy (dense eval, deployed), as intervals."""
    dense, _ = references(results)
    points = []
    for config in dict.fromkeys(r.run.config for r in results):
        group = [r for r in results if r.run.config == config and r.rows]
        if group:
            points.append({"config": config, "pool": pool_interval(group, dense),
                           "dense": stats.t_interval([final_accuracy(r, task, True) for r in group]),
                           "sparse": stats.t_interval([final_accuracy(r, task, False) for r in group])})
    return points


def plot_pareto(results: list[grid.RunResult], path: Path, task: str) -> None:
    """Pool peak against final greedy accuracy, evaluated dense and deployed compressed; 95%
    intervals over seeds on both axes; dense's mean - 3 points dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = pareto_points(results, task)
    fig, axes = plt.subplots(1, 2, figsize=(13, 5.5), sharex=True, sharey=True)
    for ax, key, title in zip(axes, ("dense", "sparse"), ("evaluated dense", "deployed compressed")):
        for p in points:
            _draw(ax, p["pool"], p[key], p["config"])
        ref = next((p["dense"].mean for p in points if p["config"] == "dense"), math.nan)
        if not math.isnan(ref):
            ax.axhline(ref - stats.MARGIN, color="k", linestyle="--", linewidth=0.8,
                       label="dense - 3 pts")
            ax.legend(fontsize=7, loc="lower right")
        ax.set_title(f"final greedy accuracy, {title}", fontsize=10)
        ax.set_xlabel("pool peak, of dense's in the same seed (95% interval)")
    axes[0].set_ylabel("accuracy (mean over seeds, 95% interval)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _draw(ax, x: stats.Interval, y: stats.Interval, label: str) -> None:
    if math.isnan(x.mean) or math.isnan(y.mean):
        return
    half = lambda i: 0.0 if math.isnan(i.low) else i.high - i.mean  # noqa: E731
    ax.errorbar(x.mean, y.mean, xerr=half(x), yerr=half(y), fmt="o", capsize=3, markersize=4)
    ax.annotate(label, (x.mean, y.mean), fontsize=6, xytext=(3, 3), textcoords="offset points")
