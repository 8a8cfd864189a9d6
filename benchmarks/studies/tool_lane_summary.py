"""The tool lane's results (``tool_lane.py``): ``summary.md``, ``curves.png`` and ``metrics.jsonl``
from each run's folder, finished or stopped by the lane's time.

The gain table: a run's greedy held-out gain is its last evaluation's accuracy minus its first
(rollout 0, the warm-up's policy, on the same prompts), so each seed's gain is paired with its
own start; a config's mean gain over its seeds gets a 95% Student-t interval
(``benchmarks.grid.stats``) and the verdict against issue 66's +0.15."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from benchmarks.grid import runs as grid
from benchmarks.grid import stats

TASK = "lookup-tool"
GREEDY = f"eval/{TASK}/score"  # as trained (a compressed run: compressed)
GREEDY_DENSE = f"eval/{TASK}_dense/score"  # a compressed run's policy evaluated dense
COLUMNS = (("reward_mean", "reward", "{:.3f}"), ("rollout/turns_per_sample", "turns", "{:.2f}"),
           ("rollout/tool_calls_per_sample", "calls", "{:.2f}"),
           ("rollout/tool_error_fraction", "tool errors", "{:.1%}"),
           ("kv_pool_peak_used", "pool peak", "{:,.0f}"), ("rollout_tokens_per_s", "tokens/s", "{:,.0f}"))


def series(rows: list[dict], key: str) -> list[tuple[int, float]]:
    return [(r["step"], float(r[key])) for r in rows if isinstance(r.get(key), (int, float))]


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def window(points: list[tuple[int, float]], first: bool, k: int = 5) -> float:
    """The mean of the first (or last) ``k`` points (fewer when the run is short)."""
    k = max(1, min(k, len(points) // 2 or 1))
    chosen = points[:k] if first else points[-k:]
    return mean([v for _, v in chosen])


def fmt(value: float, spec: str) -> str:
    return "n/a" if value is None or math.isnan(value) else spec.format(value)


TARGET_GAIN = 0.15  # issue 66 item 4: dense RL's greedy held-out gain in 60 rollouts
SEEDED = re.compile(r"^(?P<config>.+)-s(?P<seed>\d+)$")


def config_and_seed(name: str) -> tuple[str, int | None]:
    """``dense-s2`` -> ``("dense", 2)``; a name without a seed suffix is its own config."""
    m = SEEDED.match(name)
    return (m["config"], int(m["seed"])) if m else (name, None)


def gain(rows: list[dict], key: str = GREEDY) -> tuple[float, float, int] | None:
    """``(first, last, last step)`` of the run's greedy evaluations, or None with fewer than two."""
    points = series(rows, key)
    return (points[0][1], points[-1][1], points[-1][0]) if len(points) >= 2 else None


def gain_lines(results: dict[str, list[dict]]) -> list[str]:
    """Per config: each seed's greedy gain (last - first), the mean with its 95% t-interval over
    the seeds, and (compressed runs) the same for the policy evaluated dense."""
    groups: dict[str, dict[int | None, list[dict]]] = {}
    for name, rows in results.items():
        config, seed = config_and_seed(name)
        groups.setdefault(config, {})[seed] = rows
    lines = ["| config | evaluated | per seed: first -> last (gain) | mean gain [95% t-interval] | "
             f"vs +{TARGET_GAIN:.2f} |", "|---|---|---|---|---|"]
    for config, runs in groups.items():
        keys = [("as run", GREEDY)] + ([("dense", GREEDY_DENSE)] if not config.startswith("dense") else [])
        lines += [gain_row(config, label, runs, key) for label, key in keys]
    return lines


def gain_row(config: str, label: str, runs: dict, key: str) -> str:
    cells, gains = [], []
    for seed, rows in runs.items():
        g = gain(rows, key)
        if g is None:
            cells.append(f"s{seed}: n/a")
            continue
        gains.append(g[1] - g[0])
        cells.append(f"s{seed}: {g[0]:.3f} -> {g[1]:.3f} @{g[2]} ({gains[-1]:+.3f})")
    interval = stats.t_interval(gains)
    return (f"| {config} | {label} | {'; '.join(cells)} | {interval.fmt()} | "
            f"{stats.gain_verdict(interval, TARGET_GAIN)} |")


def config_line(name: str, rows: list[dict], dense_peak: float) -> str:
    rollouts = series(rows, "reward_mean")
    reward = f"{fmt(window(rollouts, True), '{:.3f}')} -> {fmt(window(rollouts, False), '{:.3f}')}"
    cells = [fmt(mean([v for _, v in series(rows, key)]), spec) for key, _, spec in COLUMNS[1:]]
    peak = max((v for _, v in series(rows, "kv_pool_peak_used")), default=math.nan)
    ratio = peak / dense_peak if dense_peak and not math.isnan(dense_peak) else math.nan
    evals = " ".join(f"{s}:{v:.3f}" for s, v in series(rows, GREEDY))
    dense_evals = " ".join(f"{s}:{v:.3f}" for s, v in series(rows, GREEDY_DENSE))
    cells[3] = fmt(peak, "{:,.0f}")  # the run's largest peak, not the mean
    return (f"| {name} | {len(rollouts)} | {reward} | " + " | ".join(cells) + f" | {fmt(ratio, '{:.2f}')} | "
            f"{evals or 'n/a'} | {dense_evals or '-'} |")


def dense_peaks(results: dict[str, list[dict]]) -> dict[int | None, float]:
    """Each seed's dense pool peak (the reference of that seed's compressed runs)."""
    peaks = {}
    for name, rows in results.items():
        config, seed = config_and_seed(name)
        if config == "dense":
            peaks[seed] = max((v for _, v in series(rows, "kv_pool_peak_used")), default=math.nan)
    return peaks


def summary_lines(results: dict[str, list[dict]], lane: dict) -> list[str]:
    peaks = dense_peaks(results)
    fallback = mean([p for p in peaks.values() if not math.isnan(p)])
    seeds = ", ".join(str(s) for s in lane["seeds"])
    head = ["# Tool lane: lookup-tool, dense RL's gain over seeds, dense against R-KV across turns", "",
            f"Seeds {seeds}, one warm-up per seed shared by its configs (all set up in {lane['setup_s']} s), "
            f"runs side by side for the lane's {lane['lane_s']} s, {lane['prompts']} prompts x 8 samples a "
            f"rollout, lr {lane['lr']:g}{' (SMOKE: the tiny model on a CPU, measuring nothing)' if lane['smoke'] else ''}.",
            "", "## Greedy held-out gain (last evaluation - rollout 0, same prompts, paired by seed)", "",
            *gain_lines(results), "", "## Runs", "",
            "Reward: the mean of the first and last (up to) 5 rollouts; turns, calls, tool errors, tokens/s: "
            "means over rollouts; pool peak: the run's largest, and over its seed's dense run's; greedy: held-out "
            "accuracy by rollout (step:score), as sampled and (compressed runs) evaluated dense.", "",
            "| run | rollouts | reward first -> last | turns | calls | tool errors | pool peak | tokens/s "
            "| pool / dense | greedy held-out | greedy, dense eval |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    lines = [config_line(name, rows, peaks.get(config_and_seed(name)[1], fallback)) for name, rows in results.items()]
    exits = ", ".join(f"{n}: {'stopped at the lane time' if c is None else 'exit ' + str(c)}"
                      for n, c in lane["exits"].items())
    commands = [f"- {n}: `{c}`" for n, c in lane["commands"].items()]
    return head + lines + ["", f"Runs: {exits}.", "", "Commands:", *commands]


def plot(results: dict[str, list[dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    panels = (("reward_mean", "rollout reward (T = 1)"), (GREEDY, "greedy held-out accuracy"),
              ("kv_pool_peak_used", "KV pool peak (slots)"))
    for ax, (key, title) in zip(axes, panels):
        for name, rows in results.items():
            points = series(rows, key)
            if points:
                ax.plot(*zip(*points), marker="o" if key == GREEDY else None, markersize=3, label=name)
        ax.set_title(title)
        ax.set_xlabel("rollout")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_results(out: Path, folders: dict[str, Path], lane: dict) -> None:
    results = {name: grid.read_rows(folder) for name, folder in folders.items()}
    with open(out / "metrics.jsonl", "w") as f:
        for name, rows in results.items():
            f.writelines(json.dumps({"config": name, **row}) + "\n" for row in rows)
    (out / "lane.json").write_text(json.dumps(lane, indent=1) + "\n")
    (out / "summary.md").write_text("\n".join(summary_lines(results, lane)) + "\n")
    plot(results, out / "curves.png")
