"""The grid report's text (``correction_grid report`` prints it, the wave supervisor writes it):
the gate first, the paired table, the correction's worth, the curves, and the per-config table.
Moved from correction_grid.py so the supervisor reads it without importing the CLI module that
starts it."""

from __future__ import annotations

import math

from benchmarks.grid import analysis, choice, paired
from benchmarks.grid.runs import RunResult, dense_by_seed, pool_fraction, pool_provision


def mean_se(values: list[float]) -> tuple[float, float]:
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return math.nan, math.nan
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, math.nan
    var = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return mean, math.sqrt(var / len(values))


def fmt_mean_se(mean: float, se: float, digits: int = 3) -> str:
    if math.isnan(mean):
        return "-"
    return f"{mean:.{digits}f}" + ("" if math.isnan(se) else f" ± {se:.{digits}f}")


# One table column: (header, value of a run).
def _columns(task: str, k: int) -> list[tuple[str, callable]]:
    return [
        ("dense eval greedy (final)", lambda r: r.final(r.eval_key(task, "0", True, "score"))),
        (f"dense eval pass@{k} T=1 (final)", lambda r: r.final(r.eval_key(task, "1", True, f"pass@{k}"))),
        ("sparse eval greedy (final)", lambda r: r.final(r.eval_key(task, "0", False, "score"))),
        ("train reward (last 5)", lambda r: _last_mean(r, "reward_mean", 5)),
        ("response tokens (mean)", lambda r: r.mean("response_len_mean")),
        ("k3 (mean)", lambda r: r.mean("k3_kl")),
        ("rejected (mean)", lambda r: r.mean("rejected_fraction")),
        # samples whose KV was dropped and recomputed because the pool ran out, per rollout
        ("preemptions (mean)", lambda r: r.mean("rollout_preemptions")),
        ("rollout s (mean)", lambda r: r.mean("time_rollout")),
    ]


def _last_mean(result: RunResult, key: str, n: int) -> float:
    values = [v for _, v in result.series(key)][-n:]
    return sum(values) / len(values) if values else math.nan


def table(results: list[RunResult], task: str = "chain", k: int = 4) -> list[str]:
    dense = dense_by_seed(results)
    columns = _columns(task, k)
    head = ["config", "seeds", "rollouts"] + [c for c, _ in columns] + ["pool KV of dense (max over run)",
                                                                  "pool peak of dense's peak"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for config in dict.fromkeys(r.run.config for r in results):
        group = [r for r in results if r.run.config == config and r.rows]
        if not group:
            continue
        cells = [config, str(len(group)), str(min(max(x["step"] for x in r.rows) for r in group))]
        cells += [fmt_mean_se(*mean_se([fn(r) for r in group])) for _, fn in columns]
        for fraction in (pool_fraction, pool_provision):
            cells.append(fmt_mean_se(*mean_se([fraction(r, dense.get(r.run.seed)) for r in group]), 2))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def report_lines(results: list[RunResult], args) -> list[str]:
    """The gate first (no compressed-run conclusion before it), what the grid is missing, the
    paired table, the correction's worth, the learning curves, the columns to choose by."""
    lines = analysis.gate_lines(results, args.task) + [""]
    if args.wave:
        from benchmarks.grid import waves

        chosen = [waves.WAVES[n] for n in (args.wave if isinstance(args.wave, list) else [args.wave])]
        expected = list(dict.fromkeys(j.run.name for wave in chosen
                                      for j in waves.wave_jobs(wave, [1, 2, 3, 4, 5], "rkv:128", False)))
        lines += analysis.missing_lines(results, expected, chosen[0].num_rollout) + [""]
    sections = (("Paired against dense", paired.paired_table(results, args.task, gain_line=False)),
                ("The correction's worth: corrected minus uncorrected, same budget",
                 analysis.worth_lines(results, args.task)),
                ("Learning curves: greedy accuracy by rollout, mean [95% over seeds]",
                 analysis.curve_lines(results, args.task)),
                ("To choose a budget and a correction", choice.choice_lines(results, args.task)),
                ("Where the errors fall (final greedy evaluation)", choice.position_lines(results, args.task)),
                ("Per config, mean ± s.e. over seeds", table(results, args.task, args.eval_samples)))
    for title, body in sections:
        lines += [f"### {title}", "", *body, ""]
    return lines
