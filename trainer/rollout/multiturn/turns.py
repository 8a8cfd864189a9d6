"""How a turn reaches the engine. ``Reprefill``: each turn is a fresh request whose prompt is the
whole context so far (the reference semantics: any engine or server, but every turn prefills the
history again). ``Sessions`` (``sessions.py``) continues each episode's KV state instead."""

from __future__ import annotations

from ..engines.interface import Generation
from ..samples.generate import GenerateContext, Request
from .episode import Episode


class Reprefill:
    """One wave per turn: every live episode's whole context, in one batch."""

    def __init__(self, ctx: GenerateContext):
        self.ctx = ctx

    def generate(self, episodes: list[Episode], budgets: list[int]) -> list[Generation]:
        return self.ctx.generate([Request(e.context_ids, b) for e, b in zip(episodes, budgets)])

    def close(self, episodes: list[Episode]) -> None:
        """Nothing is held between turns."""
