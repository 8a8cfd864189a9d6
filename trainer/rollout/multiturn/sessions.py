"""Engine sessions: each episode's KV state continued turn after turn (SGLang's session API),
so a turn sends only its new tokens (observation and next turn header) and nothing of the
history is prefilled again. Used when the rollout's engines offer sessions; otherwise the loop
re-prefills (``turns.Reprefill``)."""

from __future__ import annotations


def sessions_for(ctx):
    """The session turns of ``ctx``'s engines, or None when they have none."""
    return None
