"""Engine sessions: each episode's KV state continued turn after turn (SGLang's session API), so
a turn sends only its new tokens (the observation and the next turn's header) and nothing of the
history is prefilled again. Under compression the budget then spans the whole context and the
last turn's eviction record describes every turn (exact replay). Every ``Engines`` kind offers
sessions (``has_sessions``); with several servers a session's turns all go to the server that
opened it (``engines/routing.py``)."""

from __future__ import annotations

import concurrent.futures

from ..samples.generate import GenerateContext, Request
from .episode import Episode


class Sessions:
    """One session per episode, all opened before the first turn is sent (the engine is idle
    then: opening one waits for the engine's next step boundary) and each closed when its
    episode ends, on a thread of its own so that no episode waits for it."""

    def __init__(self, ctx: GenerateContext):
        self.backend = ctx.backend
        self.held: dict[int, int] = {}  # id(episode) -> context tokens the engine holds
        self.closed: set[str] = set()
        # one thread: sessions close in the order their episodes ended
        self.closer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="close-session")
        self.closing: list[concurrent.futures.Future] = []

    def prepare(self, episodes: list[Episode]) -> None:
        for e in episodes:
            e.session = self.backend.open_session()

    def request(self, e: Episode, budget: int) -> Request:
        """The first turn: the prompt in its session; later: only the tokens after what the
        engine holds, continuing the previous turn's request."""
        if id(e) not in self.held:
            return Request(list(e.context_ids), budget, session={"id": e.session, "rid": None})
        new = e.context_ids[self.held[id(e)]:]
        return Request(new, budget, session={"id": e.session, "rid": e.gens[-1].meta["id"]})

    def sent(self, e: Episode) -> None:
        """``e``'s latest turn came back: the engine holds its whole context."""
        self.held[id(e)] = len(e.context_ids)

    def close(self, episodes: list[Episode]) -> None:
        """Free the given episodes' KV (a finished one's, while the others go on)."""
        for e in episodes:
            if e.session is None or e.session in self.closed:
                continue
            self.closed.add(e.session)
            self.closing.append(self.closer.submit(self._close, e.session))

    def finish(self, episodes: list[Episode]) -> None:
        """Close whatever is still open (an error mid-rollout) and wait until all are closed."""
        self.close(episodes)
        concurrent.futures.wait(self.closing)
        self.closer.shutdown()

    def _close(self, session_id: str) -> None:
        try:
            self.backend.close_session(session_id)
        except (ValueError, RuntimeError):  # unknown to the engine (it restarted): none held
            pass
