"""How an episode's turn reaches the engine. ``Reprefill``: each turn is a fresh request whose
prompt is the whole context so far (the reference semantics: any engine, but every turn
prefills the history again). ``Sessions`` (``sessions.py``) continues each episode's KV state
instead. Both answer ``prepare(episodes)`` before the first turn, ``request(episode, budget)``,
``sent(episode)`` after a turn, ``close(episodes)`` when they end and ``finish(episodes)`` at the
end of the rollout."""

from __future__ import annotations

from ..samples.generate import GenerateContext, Request
from .episode import Episode
from .host_times import HostTimes
from .sessions import Sessions


def turns_for(ctx: GenerateContext, use_sessions: bool, times: HostTimes | None = None):
    """Session turns when asked for and ``ctx``'s engines offer sessions, else re-prefill."""
    if use_sessions and ctx.backend.has_sessions:
        return Sessions(ctx, times)
    return Reprefill(ctx)


class Reprefill:
    """Every turn sends the episode's whole context."""

    def __init__(self, ctx: GenerateContext):
        self.ctx = ctx

    def prepare(self, episodes: list[Episode]) -> None:
        """Nothing to open."""

    def request(self, e: Episode, budget: int) -> Request:
        return Request(list(e.context_ids), budget)

    def sent(self, e: Episode) -> None:
        """Nothing is held between turns."""

    def close(self, episodes: list[Episode]) -> None:
        """Nothing is held between turns."""

    def finish(self, episodes: list[Episode]) -> None:
        """Nothing is held between turns."""
