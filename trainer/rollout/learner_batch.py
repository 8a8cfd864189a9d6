"""A rollout as the learner sees it: every call a sample, advantages per trace.

    batch = learner_batch(result, training_rewards(result.traces, plan), pad_id, kl_coef)

The rollout side speaks traces (a prompt's calls, their rewards and groups); the learner speaks
``RolloutBatch`` (``learner/grpo_update.py``). This is the one place one becomes the other.
"""

from __future__ import annotations

import torch

from ..learner.grpo_update import RolloutBatch
from ..learner.packing import Sample
from .samples.fidelity import dense_rows


def learner_batch(result, shaped, pad_id: int, kl_loss_coef: float) -> RolloutBatch:
    """``result``'s calls as samples with ``shaped`` (training_rewards) as their rewards."""
    traces = result.traces
    calls = [c for t in traces for c in t.calls]
    plain = all(len(t.calls) == 1 and t.group is None for t in traces)
    return RolloutBatch(
        [learner_sample(c, pad_id) for c in calls], shaped.rewards,
        [torch.tensor(c.gen.logprobs or [0.0]) for c in calls],
        group_index=[t.group_label for t in traces],
        trace_index=None if plain else [i for i, t in enumerate(traces) for _ in t.calls],
        loss_weights=None if plain else [c.loss_weight for c in calls],
        kl_coefs=kl_coefs(calls, kl_loss_coef), keep=shaped.keep,
        dense=dense_rows([c.gen for c in calls]))


def learner_sample(call, pad_id: int) -> Sample:
    """A call as the learner's sample, with its eviction record (replay) when it has one; an
    empty response becomes one pad token, whose record would not fit: replayed densely."""
    gen = call.gen
    record = gen.eviction_record if gen.response_ids else None
    return Sample(call.prompt_ids, gen.response_ids or [pad_id], record,
                  gen.meta.get("eviction_record_dense_from"),
                  call.loss_mask if gen.response_ids else None)


def kl_coefs(calls, default: float) -> list[float] | None:
    """Per-call KL coefficients when a plug-in set any (None: --kl-loss-coef for all)."""
    if all(c.kl_coef is None for c in calls):
        return None
    return [default if c.kl_coef is None else c.kl_coef for c in calls]
