"""The base of the built-in generate plug-ins (``generate.py`` describes the plug-in door)."""

from __future__ import annotations

from .data import Prompt
from .traces import Trace


class GeneratePlugin:
    """The base of the built-in plug-ins (``single_turn.SingleTurn``, the default, and
    ``multiturn.loop.MultiTurn``); a user's function or class needs none of it."""

    def __call__(self, ctx, prompts: list[Prompt], n: int) -> list[Trace]:  # ctx: GenerateContext
        raise NotImplementedError

    def metrics(self, traces: list[Trace]) -> dict:
        """Metrics of the whole rollout's traces (every rank's, gathered) that only this
        plug-in knows how to read."""
        return {}
