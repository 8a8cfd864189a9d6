"""Issue 61's budget choice: the KV pool peak of R-KV at each budget, the prompt kept and prefix
sharing on, against dense's pool peak, modelled from a grid's JSONL (``<config>-s<seed>.jsonl``).

With the prompt kept, a group's samples share its prompt's slots (prefix sharing: the engine's
``prefix_hit_fraction`` is 1 - 1/n for n samples a prompt), and a compressed sample's answer holds
at most its budget plus R-KV's buffer (``--sglang-compress-divide-length``) slots. So a compressed
rollout peaks at most at

    groups x prompt tokens + samples x min(budget + buffer, answer cap)

and dense's peak is measured (its answers lengthen as it trains: rollout 60's is the one to beat).
``--measured BUDGET=JSONL`` adds a compressed run's own peak (prompt kept) as a check of the model.

    python -m benchmarks.grid.budget --dense <grid>/dense-s1.jsonl <grid>/dense-s2.jsonl \
        --measured 128=<grid>/rkv-128-sparse_rl-s1.jsonl --budgets 32 64 128
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class RolloutShape:
    samples: int  # samples a rollout
    per_prompt: int  # samples a prompt (they share its slots)
    prompt: float  # prompt tokens
    answer_cap: int  # --rollout-max-response-len

    @property
    def groups(self) -> int:
        return self.samples // self.per_prompt


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def shape_of(rows: list[dict]) -> RolloutShape:
    """The rollout's shape from a run's training rows."""
    row = next(r for r in rows if "kv_pool_peak_used" in r)
    samples = int(row["rollout_engine0/samples"])
    per_prompt = round(1 / (1 - row.get("prefix_hit_fraction", 0.0)))
    cap = int(max(r.get("response_len_max", 0) for r in rows))
    return RolloutShape(samples, per_prompt, float(row["prompt_len_mean"]), cap)


def pool_peak(rows: list[dict]) -> float:
    """The run's largest KV pool peak over its rollouts (what a user provisions)."""
    return max(r["kv_pool_peak_used"] for r in rows if "kv_pool_peak_used" in r)


def modelled_peak(shape: RolloutShape, budget: int, buffer: int) -> float:
    """Slots of a compressed rollout at its peak, the prompt kept and shared (an upper bound:
    every sample at its cap at once)."""
    return shape.groups * shape.prompt + shape.samples * min(budget + buffer, shape.answer_cap)


def budget_lines(dense: dict[str, list[dict]], budgets: list[int], buffer: int,
                 measured: dict[int, list[dict]]) -> list[str]:
    shape = shape_of(next(iter(dense.values())))
    peaks = {name: pool_peak(rows) for name, rows in dense.items()}
    lines = [f"rollout: {shape.samples} samples, {shape.per_prompt} a prompt (prefix shared), "
             f"{shape.prompt:.0f}-token prompts, answers capped at {shape.answer_cap}; R-KV buffer {buffer}",
             "dense pool peak (max over the run): " + ", ".join(f"{n} {p:,.0f}" for n, p in peaks.items()), "",
             "| budget | modelled peak (slots) | of dense's | measured peak | measured of dense's |",
             "|---:|---:|---|---:|---|"]
    for budget in budgets:
        model = modelled_peak(shape, budget, buffer)
        seen = pool_peak(measured[budget]) if budget in measured else None
        lines.append(f"| {budget} | {model:,.0f} | {_fractions(model, peaks)} | "
                     f"{'-' if seen is None else f'{seen:,.0f}'} | {'-' if seen is None else _fractions(seen, peaks)} |")
    return lines


def _fractions(value: float, peaks: dict[str, float]) -> str:
    values = sorted(value / p for p in peaks.values())
    return f"{values[0]:.2f}" if len(values) == 1 else f"{values[0]:.2f}-{values[-1]:.2f}"


def _measured(specs: list[str], parser) -> dict[int, list[dict]]:
    out = {}
    for spec in specs:
        budget, sep, path = spec.partition("=")
        if not sep or not budget.isdigit() or not Path(path).is_file():
            parser.error(f"--measured {spec!r}: expected BUDGET=JSONL of a compressed run (prompt kept)")
        out[int(budget)] = read_rows(Path(path))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dense", type=Path, nargs="+", required=True, help="dense runs' JSONL (60 rollouts)")
    p.add_argument("--budgets", type=int, nargs="+", default=[32, 64, 128])
    p.add_argument("--buffer", type=int, default=16, help="R-KV's --sglang-compress-divide-length")
    p.add_argument("--measured", nargs="*", default=[], metavar="BUDGET=JSONL")
    args = p.parse_args(argv)
    missing = [str(d) for d in args.dense if not d.is_file()]
    if missing:
        p.error(f"--dense: no such file: {', '.join(missing)}")
    dense = {d.stem: read_rows(d) for d in args.dense}
    if not all(any("kv_pool_peak_used" in r for r in rows) for rows in dense.values()):
        p.error("--dense: a file has no kv_pool_peak_used rows (not a run's metrics)")
    print("\n".join(budget_lines(dense, args.budgets, args.buffer, _measured(args.measured, p))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
