"""Engine sessions: each episode's KV state continued turn after turn (SGLang's session API), so
a turn sends only its new tokens (the observation and the next turn's header) and nothing of the
history is prefilled again. Under compression the budget then spans the whole context and the
last turn's eviction record describes every turn (exact replay). Used when the rollout's engine
offers sessions (the in-process engine, or one HTTP server: ``open_session``); otherwise (several
servers) the loop re-prefills (``turns.Reprefill``)."""

from __future__ import annotations

from ..engines.interface import Generation
from ..samples.generate import GenerateContext, Request
from .episode import Episode


def sessions_for(ctx: GenerateContext) -> "Sessions | None":
    """The session turns of ``ctx``'s engine, or None when it has none."""
    backend = ctx.backend
    if not getattr(backend, "has_sessions", True):  # several HTTP servers
        return None
    if callable(getattr(backend, "open_session", None)) and callable(
            getattr(backend, "close_session", None)):
        return Sessions(ctx)
    return None


class Sessions:
    """One session per episode, opened at its first turn and closed when it ends."""

    def __init__(self, ctx: GenerateContext):
        self.ctx, self.backend = ctx, ctx.backend
        self.sent: dict[int, int] = {}  # id(episode) -> context tokens the engine holds
        self.closed: set[str] = set()

    def generate(self, episodes: list[Episode], budgets: list[int]) -> list[Generation]:
        requests = [self._request(e, b) for e, b in zip(episodes, budgets)]
        gens = self.ctx.generate(requests)
        for e, g in zip(episodes, gens):
            self.sent[id(e)] = len(e.context_ids) + len(g.response_ids)
        return gens

    def _request(self, e: Episode, budget: int) -> Request:
        """The first turn: the prompt in a new session; later: only the tokens after what the
        engine holds, continuing the previous turn's request."""
        if e.session is None:
            e.session = self.backend.open_session()
            return Request(list(e.context_ids), budget, session={"id": e.session, "rid": None})
        new = e.context_ids[self.sent[id(e)]:]
        return Request(new, budget, session={"id": e.session, "rid": e.gens[-1].meta["id"]})

    def close(self, episodes: list[Episode]) -> None:
        """Free the given episodes' KV now (the finished ones, before the next turn)."""
        for e in episodes:
            if e.session is None or e.session in self.closed:
                continue
            self.closed.add(e.session)
            try:
                self.backend.close_session(e.session)
            except (ValueError, RuntimeError):  # unknown to the engine (it restarted): none held
                pass
