"""One sample of a multi-turn rollout while it runs: the context after the prompt (model turns
and observations alternating, as token ids), which of those tokens the model generated (the
loss mask), their sampler log-probs, and what the environment said."""

from __future__ import annotations

import dataclasses

from ..engines.interface import Generation
from ..samples.data import Prompt
from ..samples.kv_stats import combined
from ..samples.traces import Call, Trace
from .environment import Conversation, Step


@dataclasses.dataclass
class Episode:
    prompt: Prompt
    prompt_index: int  # in this shard
    sample_index: int  # which of the prompt's n samples
    ids: list[int] = dataclasses.field(default_factory=list)  # everything after the prompt
    logprobs: list[float] = dataclasses.field(default_factory=list)  # 0.0 on observations
    mask: list[int] = dataclasses.field(default_factory=list)  # 1 model token, 0 observation
    turns: list[str] = dataclasses.field(default_factory=list)
    observations: list[str] = dataclasses.field(default_factory=list)
    gens: list[Generation] = dataclasses.field(default_factory=list)
    tool_calls: int = 0
    tool_errors: int = 0
    reward: float | None = None
    done: bool = False
    finish_reason: str = "stop"
    session: object = None  # the engine session holding this episode's KV (sessions only)
    # perf_counter() when each turn was submitted and came back; the environment's seconds
    spans: list[list[float]] = dataclasses.field(default_factory=list)
    env_seconds: float = 0.0

    @property
    def context_ids(self) -> list[int]:
        return self.prompt.input_ids + self.ids

    def conversation(self) -> Conversation:
        return Conversation(self.prompt, self.turns, self.observations, self.sample_index)

    def add_turn(self, gen: Generation) -> None:
        self.gens.append(gen)
        self.turns.append(gen.text)
        self._extend(gen.response_ids, gen.logprobs, 1)
        self.finish_reason = gen.finish_reason

    def add_observation(self, text: str, ids: list[int]) -> None:
        self.observations.append(text)
        self._extend(ids, [0.0] * len(ids), 0)

    def _extend(self, ids: list[int], logprobs: list[float], trained: int) -> None:
        self.ids += ids
        self.logprobs += list(logprobs)
        self.mask += [trained] * len(ids)

    def count(self, step: Step) -> None:
        self.tool_calls += step.tool_calls
        self.tool_errors += step.tool_errors

    def finish(self, reward: float | None, reason: str | None = None) -> None:
        self.done, self.reward = True, reward
        self.finish_reason = reason or self.finish_reason

    def trace(self, text: str) -> Trace:
        """The finished episode as a one-call trace: the whole context after the prompt is the
        call's response, its observations masked out of the loss."""
        gen = Generation(list(self.ids), list(self.logprobs), text, self.finish_reason,
                         self.gens[-1].weight_version, self._meta(),
                         eviction_record=self._eviction_record())
        call = Call(list(self.prompt.input_ids), gen, loss_mask=list(self.mask), role="episode")
        return Trace([call], self.turns[-1], self.prompt_index, reward=self.reward,
                     meta=self.stats())

    def stats(self) -> dict:
        model = sum(self.mask)
        return {"turns": len(self.turns), "tool_calls": self.tool_calls,
                "tool_errors": self.tool_errors, "model_tokens": model,
                "observation_tokens": len(self.ids) - model,
                "prompt_tokens": len(self.prompt.input_ids), "env_seconds": self.env_seconds,
                "turn_spans": [list(s) for s in self.spans]}

    def _meta(self) -> dict:
        last = self.gens[-1].meta
        meta = {k: v for k, v in last.items() if k not in ("input_ids", "compression")}
        meta["prompt_tokens"] = len(self.prompt.input_ids)
        # the prompt's prefix-cache hits (a session's later turn counts its whole held context)
        meta["cached_tokens"] = self.gens[0].meta.get("cached_tokens", 0)
        meta["cached_tokens_per_turn"] = [g.meta.get("cached_tokens", 0) for g in self.gens]
        comps = [g.meta["compression"] for g in self.gens if g.meta.get("compression")]
        if comps:
            meta["compression"] = combined(comps)  # the episode is one sample
        return meta

    def _eviction_record(self):
        """The last turn's record when it spans the whole context as sampled: one turn, or a
        session (every turn continued one KV state). A re-prefilled episode's earlier turns were
        sampled under other KV states, which no single record describes: replayed densely."""
        last = self.gens[-1]
        if last.eviction_record is None or (len(self.gens) > 1 and self.session is None):
            return None
        length = len(self.prompt.input_ids) + len(self.ids)
        return last.eviction_record if last.eviction_record.shape[-1] == length else None
