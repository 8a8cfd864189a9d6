"""Step time and reward per rollout of runs that differ in how they roll out (sync, async, an
engine process, partial rollouts): one line per run, from each run's ``metrics.jsonl``.

    python -m benchmarks.plots.async_runs sync=runs/s/logs/metrics.jsonl async=runs/a/logs/metrics.jsonl \
        --skip 2 --out async.png

Prints, per run, the median step time over the rollouts after ``--skip`` and its speed against
the first run (by the sum of those step times), and the reward of the first and last 5 rollouts.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def load(path: Path) -> list[dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if "time_total" in r]  # eval-only rows have no step


def summary(runs: dict[str, list[dict]], skip: int) -> list[str]:
    base = None
    lines = [f"{'run':<28} {'steps':>5} {'median s':>9} {'min-max s':>13} {'sum s':>8} "
             f"{'vs first':>9} {'reward first 5 -> last 5':>26}"]
    for name, rows in runs.items():
        times = [r["time_total"] for r in rows[skip:]]
        if not times:
            raise SystemExit(f"{name}: no rollouts after --skip {skip}")
        total = sum(times)
        base = base or total
        rewards = [r.get("reward_mean", float("nan")) for r in rows]
        k = max(1, min(5, len(rewards) // 2))
        lines.append(f"{name:<28} {len(times):>5} {statistics.median(times):>9.2f} "
                     f"{min(times):>6.2f}-{max(times):<6.2f} {total:>8.1f} {base / total:>8.2f}x "
                     f"{sum(rewards[:k]) / k:>12.3f} -> {sum(rewards[-k:]) / k:.3f}")
    return lines


def plot(runs: dict[str, list[dict]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_r) = plt.subplots(1, 2, figsize=(11, 4))
    for name, rows in runs.items():
        steps = [r.get("step", i + 1) for i, r in enumerate(rows)]
        ax_t.plot(steps, [r["time_total"] for r in rows], marker="o", ms=3, label=name)
        ax_r.plot(steps, [r.get("reward_mean", float("nan")) for r in rows], marker="o", ms=3,
                  label=name)
    ax_t.set(xlabel="rollout", ylabel="step time (s)", title="step time")
    ax_r.set(xlabel="rollout", ylabel="reward mean", title="reward")
    ax_t.set_ylim(bottom=0)
    ax_t.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", help="name=path/to/metrics.jsonl (the first is the baseline)")
    p.add_argument("--skip", type=int, default=2, help="rollouts left out of the numbers "
                   "(start-up, compilation, the first prefetch)")
    p.add_argument("--out", default=None, help="PNG to write")
    args = p.parse_args(argv)
    for spec in args.runs:
        name, _, path = spec.partition("=")
        if not path or not Path(path).is_file():
            p.error(f"{spec!r}: expected name=path to an existing metrics.jsonl")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    runs = {spec.partition("=")[0]: load(Path(spec.partition("=")[2])) for spec in args.runs}
    print("\n".join(summary(runs, args.skip)))
    if args.out:
        plot(runs, Path(args.out))
        print(f"plot: {args.out}")


if __name__ == "__main__":
    main()
