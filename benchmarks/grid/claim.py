"""The claim's figures from the data (issue 69): the README's line, docs/training.md's advice
table and docs/benchmarks.md's report are regenerated from the runs' JSONL (docs/data/issue61)
between markers, so no document carries a figure that the data does not.

    python -m benchmarks.grid.claim docs/data/issue61 --write   # rewrite the three blocks
    python -m benchmarks.grid.claim docs/data/issue61 --check   # exit 1 when a block is stale

A block is the text between ``<!-- claim:NAME -->`` and ``<!-- /claim:NAME -->``.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
import sys
from pathlib import Path

from benchmarks.grid import analysis, paired, report, stats
from benchmarks.grid import runs as grid

TASK = "chain"
WAVES = (61, 69)  # the runs these waves define; the report lists the ones still missing


@dataclasses.dataclass(frozen=True)
class Row:
    """One compressed config against dense, paired by seed (accuracy in points of 100)."""
    config: str
    seeds: int
    pool: stats.Interval  # the pool peak over dense's, mean over seeds
    pool_max: float  # the largest seed's ratio
    delta: stats.Interval  # final greedy accuracy (evaluated dense) minus dense's
    deployed: stats.Interval  # deployed with its own compression, minus dense's
    worth: stats.Interval | None  # minus the uncorrected run at the same budget

    @property
    def decision(self) -> str:
        """Non-inferior when the interval's low end clears -3 points; inferior when its high end
        is below -3; otherwise the seeds cannot decide."""
        if math.isnan(self.delta.low):
            return "needs >= 2 seeds"
        if self.delta.low >= -stats.MARGIN - 1e-12:
            return "non-inferior"
        if self.delta.high < -stats.MARGIN:
            return "inferior"
        return f"undecided at {self.seeds} seeds"


def load(data: Path) -> list[grid.RunResult]:
    return grid.collect(grid.discover(data), data)


def rows(results: list[grid.RunResult]) -> list[Row]:
    dense = grid.dense_by_seed(results)
    by_config = analysis.groups(results)
    return [_row(config, group, dense, by_config) for config, group in sorted(by_config.items(), key=_order)
            if group[0].run.algorithm != "none"]


def _order(item) -> tuple:
    run = item[1][0].run
    return (run.algorithm, -(run.budget or 0), run.variants, item[0])


def _row(config: str, group: list, dense: dict, by_config: dict) -> Row:
    ours, deployed = paired.compare(group, dense, TASK, True), paired.compare(group, dense, TASK, False)
    base_name = analysis.uncorrected_of(group[0].run)
    base = by_config.get(base_name) if base_name else None
    worth = analysis.worth(group, base, TASK, True)["t"] if base else None
    ratios = [r for r in paired.pool_ratios(group, dense) if r == r]
    return Row(config, len({r.run.seed for r in group} & set(dense)), paired.pool_interval(group, dense),
               max(ratios) if ratios else math.nan, ours["diff"], deployed["diff"], worth)


# --------------------------------------------------------------------------- the blocks

def points(interval: stats.Interval) -> str:
    """An accuracy interval in points: -2.0 [-3.8, -0.2]."""
    if math.isnan(interval.mean):
        return "-"
    if math.isnan(interval.low):
        return f"{interval.mean * 100:+.1f} (n={interval.n})"
    return f"{interval.mean * 100:+.1f} [{interval.low * 100:+.1f}, {interval.high * 100:+.1f}]"


def pool_cell(row: Row) -> str:
    return f"{row.pool.fmt(2, signed=False)}, max {row.pool_max:.2f}"


def training_block(table: list[Row], gain: stats.Interval) -> list[str]:
    head = ["config", "seeds", "KV pool, of dense's peak (mean [95%], max over seeds)",
            "Δ vs dense, points (95%, by seed)", "decision (-3 points)", "deployed compressed Δ, points",
            "worth over uncorrected, points"]
    lines = [f"Dense's gain over its start: {points(gain)} points (n={gain.n}).", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in table:
        lines.append("| " + " | ".join([row.config, str(row.seeds), pool_cell(row), points(row.delta),
                                        row.decision, points(row.deployed),
                                        points(row.worth) if row.worth else "-"]) + " |")
    return lines + ["", *advice(table)]


def advice(table: list[Row]) -> list[str]:
    """Plain sentences per budget: what passes, what the seeds cannot decide, what the deployed
    compressed policy loses, and what going uncorrected costs."""
    lines = []
    for budget, group in by_budget(table).items():
        lines.append(f"- **{label(budget)}** (pool {pool_cell(most_seeds(group))} of dense's): " + "; ".join(
            f"`{_correction(r)}` {points(r.delta)}, {r.decision}, deployed {points(r.deployed)}"
            + (f", worth {points(r.worth)}" if r.worth else "") for r in group) + ".")
    return lines


def by_budget(table: list[Row]) -> dict[str, list[Row]]:
    out: dict[str, list[Row]] = {}
    for row in table:
        out.setdefault(":".join(row.config.split(":")[:2]), []).append(row)
    return out


def most_seeds(group: list[Row]) -> Row:
    """The budget's pool as its best-measured config gives it (the configs of one budget share it)."""
    return max(group, key=lambda r: r.seeds)


def label(budget: str) -> str:
    algorithm, size = budget.split(":")
    return f"{ {'rkv': 'R-KV', 'snapkv': 'SnapKV', 'streamingllm': 'StreamingLLM'}.get(algorithm, algorithm)} {size}"


def _correction(row: Row) -> str:
    name = row.config.split(":", 2)[2]
    return {"disabled": "uncorrected", "disabled:train-sparse-policy": "replay"}.get(name, name)


def readme_block(table: list[Row]) -> list[str]:
    """One paragraph: per budget its corrections and uncorrected (the FP8 variants left to the table)."""
    parts = []
    for budget, group in by_budget(table).items():
        corrected = [r for r in group if _correction(r) != "uncorrected" and "+" not in r.config]
        uncorrected = [r for r in group if _correction(r) == "uncorrected"]
        text = f"{label(budget)} (pool {pool_cell(most_seeds(group))} of dense's): " + ", ".join(
            f"`{_correction(r)}` {points(r.delta)} ({r.decision})" for r in corrected)
        if uncorrected:
            text += f"; uncorrected {points(uncorrected[0].delta)}"
        parts.append(text)
    seeds = max((r.seeds for r in table), default=0)
    return [f"With the prompt kept, after 60 rollouts of `chain`, final greedy accuracy against dense in points "
            f"(95% interval, up to {seeds} paired seeds): " + ". ".join(parts) + "."]


def benchmarks_block(results: list[grid.RunResult]) -> list[str]:
    args = argparse.Namespace(task=TASK, wave=list(WAVES), eval_samples=4)
    return report.report_lines(results, args)


def blocks(data: Path) -> dict[str, str]:
    results = load(data)
    table, gain = rows(results), paired.dense_gain(results, TASK)
    return {"readme": "\n".join(readme_block(table)), "training": "\n".join(training_block(table, gain)),
            "report": "\n".join(benchmarks_block(results)).rstrip()}


TARGETS = {"readme": "README.md", "training": "docs/training.md", "report": "docs/benchmarks.md"}


def replace_block(text: str, name: str, body: str) -> str:
    pattern = re.compile(rf"(<!-- claim:{name} -->\n).*?(<!-- /claim:{name} -->)", re.S)
    if not pattern.search(text):
        raise ValueError(f"no <!-- claim:{name} --> ... <!-- /claim:{name} --> block")
    return pattern.sub(lambda m: m.group(1) + body + "\n" + m.group(2), text, count=1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.grid.claim", description=__doc__.split("\n\n")[0])
    parser.add_argument("data", type=Path, help="the runs' JSONL folder (docs/data/issue61)")
    parser.add_argument("--root", type=Path, default=Path("."), help="the checkout whose docs to write")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true")
    mode.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    if not args.data.is_dir():
        parser.error(f"data: {args.data} is not a folder")
    stale = []
    for name, body in blocks(args.data).items():
        path = args.root / TARGETS[name]
        old = path.read_text()
        try:
            new = replace_block(old, name, body)
        except ValueError as error:
            parser.error(f"{path}: {error}")
        if new != old:
            stale.append(str(TARGETS[name]))
            if args.write:
                path.write_text(new)
    print(("wrote: " if args.write else "stale: ") + (", ".join(stale) or "nothing"))
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
