"""Evaluation of the current policy on the ``--eval-prompt-data`` sets: one pass per
``--eval-temperature`` and ``--eval-compression`` mode, scored, each engine's answers written.

    metrics = evaluate(EvalSetup(rollouts, eval_sets, plan, budget, log_dir), rollout_id)

The caller holds the engines for it (``source.exclusive()``): an evaluation never shares them
with a rollout in flight.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

from .samples.fidelity import apply_budget


@dataclasses.dataclass
class EvalSetup:
    rollouts: object  # the RolloutManager
    eval_sets: dict  # name -> prompts
    plan: object  # the RolloutPlan: eval_configs()
    budget: object  # the BudgetController: compressed passes use the training budget
    log_dir: Path  # eval_samples/ goes under it
    write: bool = True  # rank 0 writes the rows


def evaluate(setup: EvalSetup, rollout_id: int) -> dict:
    out = {}
    for name, prompts in setup.eval_sets.items():
        for suffix, sampling, n in setup.plan.eval_configs():
            sampling = apply_budget(setup.budget, sampling)  # compressed: the training budget
            result = setup.rollouts.run(prompts, n, sampling, mode="eval")
            out.update(eval_metrics(f"eval/{name}{suffix}", result))
            if setup.write:  # what each engine answered, for people and tests to read
                write_rows(setup.log_dir / "eval_samples" / f"{name}{suffix}_rollout{rollout_id}.jsonl",
                           result.rows(prompts))
    return out


def eval_metrics(prefix: str, result) -> dict:
    """Mean final score, mean response length, and pass@n (a prompt counts when any of its n
    answers scored > 0) when several samples were drawn per prompt."""
    final = [t for t in result.traces if t.final]
    gens = result.gens
    out = {f"{prefix}/score": sum(t.reward for t in final) / len(final),
           f"{prefix}/response_len": sum(len(g.response_ids) for g in gens) / len(gens)}
    by_prompt: dict[int, bool] = {}
    for t in final:
        by_prompt[t.prompt_index] = by_prompt.get(t.prompt_index, False) or t.reward > 0
    n = len(final) // max(1, len(by_prompt))
    if n > 1:
        out[f"{prefix}/pass@{n}"] = sum(by_prompt.values()) / len(by_prompt)
    return out


def write_rows(path: Path | str | os.PathLike, rows: list[dict]) -> None:
    """``rows`` as JSONL at ``path`` (its directory made)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
