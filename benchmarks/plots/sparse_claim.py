"""Dense vs R-KV (uncorrected) vs R-KV (corrected) runs in one PNG, and their summary numbers.

    python -m benchmarks.plots.sparse_claim docs/data/claim-2026-11-23 --out docs/sparse_claim_smollm2.png

Each run directory file is a trainer ``metrics.jsonl`` named ``dense.jsonl``,
``rkv-uncorrected.jsonl``, ``rkv-corrected.jsonl``. A dense sample holds prompt + response KV
slots, so its peak per sample is ``prompt_len_mean + response_len_mean``; compressed runs log
``kv_peak_slots_per_sample``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

RUNS = ("dense", "rkv-uncorrected", "rkv-corrected")
PANELS = (("reward_mean", "reward (sampled rollouts)"), ("response_len_mean", "response tokens"),
          ("k3_kl", "k3 KL(sampler, dense policy)"), ("rejected_fraction", "rejected token fraction"),
          ("peak_kv", "peak KV slots per sample"))


def load(path: Path) -> list[dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    for r in rows:
        r["peak_kv"] = r.get("kv_peak_slots_per_sample", r["prompt_len_mean"] + r["response_len_mean"])
    return rows


def mean_last(rows: list[dict], key: str, k: int) -> float:
    tail = rows[-k:]
    return sum(r.get(key, 0.0) for r in tail) / len(tail)


def summary(runs: dict[str, list[dict]], k: int) -> list[str]:
    steps = min(len(r) for r in runs.values())
    lines = [f"first {steps} rollouts of each run; means of rollouts {steps - k + 1}-{steps}"]
    dense_reward = mean_last(runs["dense"][:steps], "reward_mean", k)
    dense_kv = mean_last(runs["dense"][:steps], "peak_kv", k)
    dense_max = max(r["peak_kv"] for r in runs["dense"][:steps])
    dense_auc = sum(r["reward_mean"] for r in runs["dense"][:steps])
    for name, rows in runs.items():
        rows = rows[:steps]
        reward, kv = mean_last(rows, "reward_mean", k), mean_last(rows, "peak_kv", k)
        run_max = max(r["peak_kv"] for r in rows)  # the run's peak: when responses are longest
        auc = sum(r["reward_mean"] for r in rows)
        lines.append(f"{name:16s} reward {rows[0]['reward_mean']:.3f} -> {reward:.3f} "
                     f"({reward / dense_reward:.1%} of dense; mean over all rollouts "
                     f"{auc / dense_auc:.1%}) | peak KV/sample over the run {run_max:.0f} "
                     f"({run_max / dense_max:.0%}), at the end {kv:.0f} ({kv / dense_kv:.0%}) | "
                     f"k3 {mean_last(rows, 'k3_kl', k):.4f} (max {max(r.get('k3_kl', 0) for r in rows):.4f}) | "
                     f"rejected {mean_last(rows, 'rejected_fraction', k):.3f}")
    return lines


def plot(runs: dict[str, list[dict]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(PANELS), figsize=(4 * len(PANELS), 3.4))
    for ax, (key, title) in zip(axes, PANELS):
        for name, rows in runs.items():
            ax.plot([r["step"] for r in rows], [r.get(key, 0.0) for r in rows], label=name)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("rollout")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", type=Path)
    p.add_argument("--out", type=Path, default=None, help="PNG (default: <run_dir>/claim.png)")
    p.add_argument("--last", type=int, default=5, help="rollouts averaged at the end (default 5)")
    args = p.parse_args(argv)
    missing = [r for r in RUNS if not (args.run_dir / f"{r}.jsonl").is_file()]
    if missing:
        p.error(f"{args.run_dir}: missing {', '.join(m + '.jsonl' for m in missing)}")
    runs = {r: load(args.run_dir / f"{r}.jsonl") for r in RUNS}
    plot(runs, args.out or args.run_dir / "claim.png")
    print("\n".join(summary(runs, args.last)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
