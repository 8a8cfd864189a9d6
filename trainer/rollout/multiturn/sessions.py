"""Engine sessions: each episode's KV state continued turn after turn (SGLang's session API), so
a turn sends only its new tokens (the observation and the next turn's header) and nothing of the
history is prefilled again. Under compression the budget then spans the whole context and the
last turn's eviction record describes every turn (exact replay). Every ``Engines`` kind offers
sessions (``has_sessions``); with several servers a session's turns all go to the server that
opened it (``engines/routing.py``)."""

from __future__ import annotations

import concurrent.futures
import threading
import time

from ..samples.generate import GenerateContext, Request
from .episode import Episode
from .host_times import HostTimes


class Sessions:
    """One session per episode, all opened in one call before the first turn is sent (a session
    op waits for the engine's next step boundary: one wait for all of them), each closed when
    its episode ends. Closes are batched on a thread of their own, so that no episode waits for
    them and the engine sees one close call for every episode that ended since the last one."""

    def __init__(self, ctx: GenerateContext, times: HostTimes | None = None):
        self.backend = ctx.backend
        self.times = times or HostTimes()
        self.held: dict[int, int] = {}  # id(episode) -> context tokens the engine holds
        self.closed: set[str] = set()
        self.to_close: list[str] = []  # ended episodes' sessions no close call has taken yet
        self.lock = threading.Lock()
        # one thread: each call closes the whole batch that gathered while the last one ran
        self.closer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="close-session")
        self.closing: list[concurrent.futures.Future] = []

    def prepare(self, episodes: list[Episode]) -> None:
        begin = time.perf_counter()
        for e, session in zip(episodes, self.backend.open_sessions(len(episodes)), strict=True):
            e.session = session
        self.times.add("open_s", begin)

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
        ids = [e.session for e in episodes if e.session is not None and e.session not in self.closed]
        if not ids:
            return
        self.closed.update(ids)
        with self.lock:
            queued = bool(self.to_close)  # a close call that has not started yet takes these too
            self.to_close += ids
        if not queued:
            self.closing.append(self.closer.submit(self._close_batch))

    def finish(self, episodes: list[Episode]) -> None:
        """Close whatever is still open (an error mid-rollout) and wait until all are closed."""
        begin = time.perf_counter()
        self.close(episodes)
        concurrent.futures.wait(self.closing)
        self.closer.shutdown()
        self.times.add("finish_s", begin)

    def _close_batch(self) -> None:
        with self.lock:
            ids, self.to_close = self.to_close, []
        begin = time.perf_counter()
        self.backend.close_sessions(ids)  # ids the engine no longer knows hold nothing
        self.times.close_calls += 1
        self.times.add("close_s", begin)
