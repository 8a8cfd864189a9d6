"""The multi-turn rollout (``--env-path``): model turns and environment observations alternate
in one context per sample, up to ``--max-turns`` model turns. ``MultiTurn`` is a generate
plug-in, the sibling of the default single-turn one (``samples/single_turn.py``).

Every episode advances on its own (``runner.py``): when its turn comes back the environment
answers it at once, concurrently with the others, and its next turn joins the engine's running
batch. An episode ends when the environment says done (no observation), at the turn limit, or
when the response budget ``--rollout-max-response-len`` (model and observation tokens together)
is spent; its engine session is closed then, freeing its KV. The finished sample is one trace:
the prompt, then everything after it as the response, with a loss mask that keeps observations
out of the loss.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from ..samples.data import Prompt
from ..samples.generate import GenerateContext
from ..samples.plugin_base import GeneratePlugin
from ..samples.traces import Trace
from .chat import ObservationFormat, observation_format
from .environment import Step
from .episode import Episode
from .host_times import HostTimes
from .runner import EpisodeRunner
from .stats import episode_stats
from .turns import turns_for


@dataclasses.dataclass
class MultiTurn(GeneratePlugin):
    """A generate plug-in (``samples/generate.py``) built from the multi-turn flags."""

    step: Callable  # the environment: step(Conversation) -> Step
    max_turns: int = 4
    turn_tokens: int | None = None  # --max-tokens-per-turn (None: what the budget leaves)
    observation_role: str = "user"  # the chat role observations are rendered as
    use_sessions: bool = True  # continue each episode's KV when the engine has sessions
    # the latest rollout's host time split (``host_times.py``), for benchmarks
    host_times: HostTimes = dataclasses.field(default_factory=HostTimes, repr=False,
                                              compare=False)

    def __call__(self, ctx: GenerateContext, prompts: list[Prompt], n: int) -> list[Trace]:
        fmt = observation_format(ctx.tokenizer, self.observation_role)
        self.host_times = HostTimes()
        turns = turns_for(ctx, self.use_sessions, self.host_times)
        episodes = [Episode(p, i, k) for i, p in enumerate(prompts) for k in range(n)]
        runner = EpisodeRunner(ctx, turns, self.step, lambda e: self._budget(ctx, e),
                               lambda e, step: self._answer(ctx, fmt, e, step),
                               times=self.host_times)
        try:
            turns.prepare(episodes)
            runner.run(episodes)
        finally:
            turns.finish(episodes)  # whatever is still open (an error mid-rollout) closed
        return [e.trace(ctx.decode(e.ids)) for e in episodes]

    def metrics(self, traces: list[Trace]) -> dict:
        """The rollout's episode metrics (turns, tool calls and errors, observation share)."""
        return episode_stats(traces)

    def _answer(self, ctx: GenerateContext, fmt: ObservationFormat, e: Episode, step: Step) -> None:
        """The environment's answer to ``e``'s latest turn: its observation appended, or the
        episode finished (also when the turn limit is reached: the environment's reward if it
        ended the episode, else the run's reward on the last turn)."""
        last = len(e.turns) >= self.max_turns
        if not isinstance(step, Step):
            raise TypeError(f"--env-path: step() must return a Step, got {type(step).__name__}")
        e.count(step)
        if step.finished or last:
            e.finish(step.reward if step.finished else None)
            return
        ids = ctx.encode(fmt.render(e.turns[-1], step.observation))
        if len(ids) >= self._room(ctx, e):  # no room for the observation and a next turn
            e.finish(None, "length")
            return
        e.add_observation(step.observation, ids)

    def _room(self, ctx: GenerateContext, e: Episode) -> int:
        left = ctx.cfg.max_response_len - len(e.ids)
        if ctx.context_length:  # never truncate a context: the episode ends instead
            left = min(left, ctx.context_length - len(e.context_ids) - 1)
        return left

    def _budget(self, ctx: GenerateContext, e: Episode) -> int:
        room = self._room(ctx, e)
        return room if self.turn_tokens is None else min(room, self.turn_tokens)
