"""The columns a user needs to pick a budget and a correction from the grid (issue 61):

* the sampler/trainer mismatch the correction has to absorb: k3 (mean over the run) and the
  share of tokens the correction rejected (``rejected_fraction``);
* the memory: pool peak of dense's in slots and in bytes (an FP8 pool holds half the bytes a slot);
* the harness's own noise: the step-0 difference from dense evaluated dense (same weights, so
  anything but 0 is batching and bf16 rounding of greedy decoding);
* where in the answer the errors fall, from the final greedy evaluation's step marks
  (``positions.py``): the share of right steps in each fifth of the chain, the first wrong
  step, the steps written; evaluated dense and deployed compressed.
"""

from __future__ import annotations

import math

from benchmarks.grid import paired, positions, stats
from benchmarks.grid import runs as grid
from benchmarks.grid.analysis import groups


def step0_delta(result: grid.RunResult, dense: grid.RunResult | None, task: str) -> float:
    if dense is None:
        return math.nan
    return paired.start_accuracy(result, task) - paired.start_accuracy(dense, task)


def pool_bytes(result: grid.RunResult, dense: grid.RunResult | None) -> float:
    ours = [v for _, v in result.series("kv_pool_peak_bytes")]
    theirs = [v for _, v in dense.series("kv_pool_peak_bytes")] if dense else []
    return max(ours) / max(theirs) if ours and theirs else math.nan


def choice_lines(results: list[grid.RunResult], task: str) -> list[str]:
    dense = grid.dense_by_seed(results)
    head = ["config", "seeds", "k3 (mean)", "rejected share (mean)", "pool slots, of dense's",
            "pool bytes, of dense's", "response tokens (last rollout)", "step-0 Δ vs dense (noise)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for config, group in groups(results).items():
        ref = lambda r: dense.get(r.run.seed)  # noqa: E731
        cells = [config, str(len(group)),
                 _fmt([r.mean("k3_kl") for r in group], 4), _fmt([r.mean("rejected_fraction") for r in group], 3),
                 _fmt([grid.pool_provision(r, ref(r)) for r in group], 2),
                 _fmt([pool_bytes(r, ref(r)) for r in group], 2),
                 _fmt([r.final("response_len_mean") for r in group], 0),
                 _fmt([step0_delta(r, ref(r), task) for r in group], 3, signed=True)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def final_marks(result: grid.RunResult, task: str, as_dense: bool) -> list[str]:
    key = paired.prompt_key(result, task, as_dense).replace("eval_prompts/", "eval_steps/", 1)
    rows = [r for r in result.rows if isinstance(r.get(key), list)]
    return [m for m in rows[-1][key] if m] if rows else []


def position_lines(results: list[grid.RunResult], task: str) -> list[str]:
    """Accuracy by fifth of the answer, first wrong step and steps written, per config."""
    rows, steps = [], 0
    for config, group in groups(results).items():
        modes = (True,) if group[0].run.algorithm == "none" else (True, False)
        for as_dense in modes:
            marks = [m for r in group for m in final_marks(r, task, as_dense)]
            if marks:
                steps = steps or len(marks[0])
                rows.append((config, "dense" if as_dense else "deployed", marks))
    if not rows:
        return ["(no step marks: these JSONL were exported before issue 61's eval_steps rows)"]
    head = ["config", "evaluated", *positions.bucket_names(steps), "first wrong step (mean)",
            "steps written (mean)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for config, mode, marks in rows:
        buckets = [f"{v:.2f}" for v in positions.bucket_accuracy(marks)]
        first = sum(positions.first_wrong(m) for m in marks) / len(marks)
        written = sum(len(m) - m.count(positions.MISSING) for m in marks) / len(marks)
        lines.append("| " + " | ".join([config, mode, *buckets, f"{first:.1f}", f"{written:.1f}"]) + " |")
    return lines


def _fmt(values: list[float], digits: int, signed: bool = False) -> str:
    return stats.t_interval(values).fmt(digits, signed=signed)
