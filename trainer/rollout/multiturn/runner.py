"""Episodes at engine speed: every episode advances on its own. When a sample's turn comes back,
its environment step (its tools) runs at once on a thread pool, concurrently with the other
samples' steps; when the step answers, the next turn is submitted to the engine and joins the
batch it is running (``Engines.submit``). There is no barrier per turn: one sample's turn 2 may
start while another's turn 1 is still decoding.

Whatever comes back (a turn, a step) is put on one queue by its future's callback; the loop
blocks on that queue, takes everything that has arrived at each wake-up, and sends the next
turns that became ready in one call (``GenerateContext.submit_many``). Waiting on the
futures themselves (``concurrent.futures.wait``) would cost the loop a pass over every pending
future per wake-up, holding the interpreter lock the engine thread needs between its steps.

Everything an episode holds is changed on the calling thread only (the pool runs ``step`` on the
``Conversation`` of an episode that waits for it, changing nothing), so the episode's tokens, mask
and log-probs are built exactly as one turn after another would build them."""

from __future__ import annotations

import concurrent.futures
import queue
import time
from typing import Callable

from ..engines.interface import Generation, RolloutError, engine_error
from ..samples.generate import GenerateContext, Request
from .environment import Step
from .episode import Episode
from .host_times import HostTimes

ENV_WORKERS = 64  # environment steps running at once (each runs its tools under their limit)


class EpisodeRunner:
    """Drives ``episodes`` to their end: ``plan(e) -> budget``, ``answer(e, step)`` (the
    plug-in's rules), ``turns`` (``turns.py``: how a turn is sent, what stays held)."""

    def __init__(self, ctx: GenerateContext, turns, step: Callable, budget: Callable,
                 answer: Callable, workers: int = ENV_WORKERS, times: HostTimes | None = None):
        self.ctx, self.turns, self.step = ctx, turns, step
        self.budget, self.answer, self.workers = budget, answer, workers
        self.times = times or HostTimes()
        self.arrived: queue.SimpleQueue = queue.SimpleQueue()  # (kind, episode, future)
        self.outstanding = 0  # futures whose result the loop has not taken yet
        self.sent: dict[int, tuple[Request, int, int]] = {}  # id(e) -> its turn's request
        self.retried: set[int] = set()  # id(e) of episodes whose turn was re-issued once
        self.ready: list[Episode] = []  # episodes whose next turn waits for ``_send``

    def run(self, episodes: list[Episode]) -> None:
        with concurrent.futures.ThreadPoolExecutor(self.workers, thread_name_prefix="env") as pool:
            self.pool = pool
            for k, e in enumerate(episodes):
                self._submit(e, self.turns.request(e, self.budget(e)), len(e.turns), k)
            self._send()
            while self.outstanding:
                for kind, e, future in self._arrivals():
                    self.outstanding -= 1
                    begin = time.perf_counter()
                    (self._turn_done if kind == "turn" else self._step_done)(e, future.result())
                    self.times.add("handle_s", begin)
                self._send()

    def _arrivals(self) -> list[tuple[str, Episode, concurrent.futures.Future]]:
        """Blocks for the next completion, then takes every other one already in."""
        begin = time.perf_counter()
        out = [self.arrived.get()]
        self.times.add("wait_s", begin)
        self.times.wakeups += 1
        while True:
            try:
                out.append(self.arrived.get_nowait())
            except queue.Empty:
                return out

    def _watch(self, kind: str, e: Episode, future: concurrent.futures.Future) -> None:
        self.outstanding += 1
        future.add_done_callback(lambda f: self.arrived.put((kind, e, f)))

    def _submit(self, e: Episode, r: Request, turn: int, sample: int) -> None:
        """``e``'s next turn, sent with every other turn ready at this wake-up (``_send``)."""
        self.sent[id(e)] = (r, turn, sample)
        self.ready.append(e)

    def _send(self) -> None:
        """The turns made ready since the last call, in one call to the engine: they reach it
        at one step boundary, so their prefills share a step (up to its token budget)."""
        if not self.ready:
            return
        begin = time.perf_counter()
        ready, self.ready = self.ready, []
        futures = self.ctx.submit_many([self.sent[id(e)] for e in ready])
        for e, future in zip(ready, futures, strict=True):
            e.spans.append([begin, float("nan")])
            self._watch("turn", e, future)
        self.times.add("submit_s", begin)

    def _turn_done(self, e: Episode, gen: Generation) -> None:
        if engine_error(gen):
            return self._reissue(e, gen)
        e.spans[-1][1] = time.perf_counter()
        e.add_turn(gen)
        self.turns.sent(e)
        self._watch("step", e, self.pool.submit(_timed, self.step, e.conversation()))

    def _reissue(self, e: Episode, gen: Generation) -> None:
        """Once, the same request (same seed: the same sample if the failure was transient)."""
        if id(e) in self.retried:
            raise RolloutError(f"an episode's turn failed twice: {engine_error(gen)}")
        self.retried.add(id(e))
        e.spans.pop()
        self._submit(e, *self.sent[id(e)])

    def _step_done(self, e: Episode, result: tuple[Step, float]) -> None:
        step, seconds = result
        e.env_seconds += seconds
        self.answer(e, step)
        if e.done:
            self.turns.close([e])  # its KV is freed with the next batch of closes
            return
        _, turn, sample = self.sent[id(e)]
        self._submit(e, self.turns.request(e, self.budget(e)), turn + 1, sample)


def _timed(step: Callable, conversation) -> tuple[Step, float]:
    begin = time.perf_counter()
    out = step(conversation)
    return out, time.perf_counter() - begin
