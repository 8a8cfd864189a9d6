"""DAPO's dynamic sampling with slime's over-sampling: generate rounds of
``--over-sampling-batch-size`` prompts, keep the groups (all traces of one prompt) that the filter
passes, stop once ``--rollout-batch-size`` groups are kept.

    sampler = DynamicSampler(plan.dynamic)
    prompts, result, metrics = sampler.collect(manager, stream, batch_size, n, sampling)

Every rank receives every round's gathered result and the filter is deterministic, so all ranks
keep the same groups and draw the same next round: it works with any number of data-parallel
engines. Groups that pass the filter in the last round beyond the batch are dropped (no round
is started once the batch is full); they are counted as ``rollout/groups_surplus``.

A filter is ``fn(group: list[Trace]) -> bool`` (or an object with a ``keep`` attribute, like
slime's ``DynamicFilterOutput``), named by ``--dynamic-sampling-filter-path``; the built-in
``reward_nonzero_std`` (slime's ``check_reward_nonzero_std``) keeps groups whose raw rewards
are not all equal: with GRPO those are the only ones with a non-zero advantage.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Callable

from .samples.data import Prompt
from .samples.plugins import load_dotted
from .samples.traces import Trace

if TYPE_CHECKING:  # the flags check a filter here: the manager (engines, torch) loads with a run
    from .manager import RolloutResult, Shard

FLAG = "--dynamic-sampling-filter-path"


def reward_nonzero_std(group: list[Trace]) -> bool:
    """Whether the group's rewards differ (its GRPO advantages are not all zero)."""
    rewards = [t.reward for t in group]
    return max(rewards) > min(rewards)


# built-in filters by name (slime's name too); any other value is a dotted path
BUILTIN_FILTERS = {"reward_nonzero_std": reward_nonzero_std,
                   "check_reward_nonzero_std": reward_nonzero_std}


@dataclasses.dataclass
class DynamicSamplingConfig:
    filter_path: str | None = None  # None: dynamic sampling off
    over_sampling_batch_size: int | None = None  # prompts per round; None: the rollout batch size
    max_rounds: int = 64  # a task the filter never passes fails loudly instead of looping

    @property
    def enabled(self) -> bool:
        return self.filter_path is not None

    def load_filter(self) -> Callable:
        if self.filter_path in BUILTIN_FILTERS:
            return BUILTIN_FILTERS[self.filter_path]
        return load_dotted(self.filter_path, FLAG)


@dataclasses.dataclass
class _Group:
    prompt: Prompt
    traces: list[Trace]
    engine: int  # the shard (engine) that generated it


class DynamicSampler:
    def __init__(self, cfg: DynamicSamplingConfig):
        self.cfg, self.keep = cfg, cfg.load_filter()

    def collect(self, manager, stream, batch_size: int, n: int, sampling
                ) -> tuple[list[Prompt], RolloutResult, dict]:
        """Rounds until ``batch_size`` groups are kept: their prompts, result and counts."""
        size = self.cfg.over_sampling_batch_size or batch_size
        kept, rounds, counts = [], [], {"generated": 0, "dropped": 0}
        while len(kept) < batch_size:
            if len(rounds) == self.cfg.max_rounds:
                raise RuntimeError(_exhausted(self.cfg, len(kept), batch_size, counts))
            prompts = stream.next_batch(size)
            # each round its own seeds; round 0 samples what a run without the filter would
            cfg = sampling if sampling.seed is None else \
                dataclasses.replace(sampling, seed=sampling.seed + len(rounds) * size * n)
            result = manager.run(prompts, n, cfg)
            rounds.append(result)
            kept += self._filter(prompts, result, len(rounds) - 1, counts)
        surplus = len(kept) - batch_size
        prompts, merged = _merge(kept[:batch_size], rounds)
        return prompts, merged, _metrics(counts, batch_size, surplus, len(rounds))

    def _filter(self, prompts: list[Prompt], result: RolloutResult, round_id: int,
                counts: dict) -> list[_Group]:
        out = []
        for group in _groups(prompts, result, round_id):
            counts["generated"] += 1
            if _passes(self.keep(group.traces)):
                out.append(group)
            else:
                counts["dropped"] += 1
        return out


def _passes(verdict) -> bool:
    return bool(getattr(verdict, "keep", verdict))


def _groups(prompts: list[Prompt], result: RolloutResult, round_id: int) -> list[_Group]:
    """One group per prompt, in prompt order, with the engine that generated it."""
    by_prompt: dict[int, _Group] = {}
    for engine, shard in enumerate(result.shards):
        for t in shard.traces:
            if t.group is not None:  # a plug-in's labels repeat across rounds: make them unique
                t.group = ("round", round_id, t.group)
            g = by_prompt.setdefault(t.prompt_index, _Group(prompts[t.prompt_index], [], engine))
            g.traces.append(t)
    return [by_prompt[i] for i in sorted(by_prompt)]


def _merge(groups: list[_Group], rounds: list[RolloutResult]) -> tuple[list[Prompt], RolloutResult]:
    """The kept groups as one result, one shard per engine (its rounds' times and pools), the
    prompts renumbered in the result's trace order."""
    from .manager import RolloutResult

    num_engines = len(rounds[0].shards)
    prompts, shards = [], []
    for e in range(num_engines):
        traces = []
        for g in (g for g in groups if g.engine == e):
            for t in g.traces:
                t.prompt_index = len(prompts)
            traces += g.traces
            prompts.append(g.prompt)
        shards.append(_engine_shard(traces, [r.shards[e] for r in rounds]))
    return prompts, RolloutResult(shards, rounds[0].plugin)


def _engine_shard(traces: list[Trace], parts: list[Shard]) -> Shard:
    from .manager import Shard

    pools = [p.kv_pool for p in parts if p.kv_pool]
    return Shard(traces, sum(p.seconds for p in parts), sum(p.reward_seconds for p in parts),
                 max(pools, key=lambda p: p["peak_used"]) if pools else None,
                 _summed([p.plugin_stats for p in parts]), _summed([p.faults for p in parts]),
                 _summed([p.decode for p in parts]))


def _summed(dicts: list[dict]) -> dict:
    out: dict = {}
    for d in dicts:
        for k, v in d.items():
            out[k] = out.get(k, 0) + v
    return out


def _metrics(counts: dict, kept: int, surplus: int, rounds: int) -> dict:
    return {"rollout/groups_generated": float(counts["generated"]),
            "rollout/groups_kept": float(kept), "rollout/groups_dropped": float(counts["dropped"]),
            "rollout/groups_surplus": float(surplus), "rollout/sampling_rounds": float(rounds)}


def _exhausted(cfg: DynamicSamplingConfig, kept: int, wanted: int, counts: dict) -> str:
    return (f"dynamic sampling: {cfg.max_rounds} rounds kept {kept} of {wanted} groups "
            f"({counts['dropped']} of {counts['generated']} dropped by {FLAG} "
            f"{cfg.filter_path}); raise --over-sampling-batch-size or relax the filter")
