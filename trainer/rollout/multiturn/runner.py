"""Episodes at engine speed: every episode advances on its own. When a sample's turn comes back,
its environment step (its tools) runs at once on a thread pool, concurrently with the other
samples' steps; when the step answers, the next turn is submitted to the engine and joins the
batch it is running (``Engines.submit``). There is no barrier per turn: one sample's turn 2 may
start while another's turn 1 is still decoding.

Everything an episode holds is changed on the calling thread only (the pool runs ``step`` on the
``Conversation`` of an episode that waits for it, changing nothing), so the episode's tokens, mask
and log-probs are built exactly as one turn after another would build them."""

from __future__ import annotations

import concurrent.futures
import time
from typing import Callable

from ..engines.interface import Generation, RolloutError, engine_error
from ..samples.generate import GenerateContext, Request
from .environment import Step
from .episode import Episode

ENV_WORKERS = 64  # environment steps running at once (each runs its tools under their limit)


class EpisodeRunner:
    """Drives ``episodes`` to their end: ``plan(e) -> budget``, ``answer(e, step)`` (the
    plug-in's rules), ``turns`` (``turns.py``: how a turn is sent, what stays held)."""

    def __init__(self, ctx: GenerateContext, turns, step: Callable, budget: Callable,
                 answer: Callable, workers: int = ENV_WORKERS):
        self.ctx, self.turns, self.step = ctx, turns, step
        self.budget, self.answer, self.workers = budget, answer, workers
        self.pending: dict[concurrent.futures.Future, tuple[str, Episode]] = {}
        self.sent: dict[int, tuple[Request, int, int]] = {}  # id(e) -> its turn's request
        self.retried: set[int] = set()  # id(e) of episodes whose turn was re-issued once

    def run(self, episodes: list[Episode]) -> None:
        with concurrent.futures.ThreadPoolExecutor(self.workers, thread_name_prefix="env") as pool:
            self.pool = pool
            for k, e in enumerate(episodes):
                self._submit(e, self.turns.request(e, self.budget(e)), len(e.turns), k)
            while self.pending:
                done, _ = concurrent.futures.wait(
                    list(self.pending), return_when=concurrent.futures.FIRST_COMPLETED)
                for f in done:
                    kind, e = self.pending.pop(f)
                    (self._turn_done if kind == "turn" else self._step_done)(e, f.result())

    def _submit(self, e: Episode, r: Request, turn: int, sample: int) -> None:
        self.sent[id(e)] = (r, turn, sample)
        e.spans.append([time.perf_counter(), float("nan")])
        self.pending[self.ctx.submit(r, turn, sample)] = ("turn", e)

    def _turn_done(self, e: Episode, gen: Generation) -> None:
        if engine_error(gen):
            return self._reissue(e, gen)
        e.spans[-1][1] = time.perf_counter()
        e.add_turn(gen)
        self.turns.sent(e)
        self.pending[self.pool.submit(_timed, self.step, e.conversation())] = ("step", e)

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
            self.turns.close([e])  # its KV is free at once
            return
        _, turn, sample = self.sent[id(e)]
        self._submit(e, self.turns.request(e, self.budget(e)), turn + 1, sample)


def _timed(step: Callable, conversation) -> tuple[Step, float]:
    begin = time.perf_counter()
    out = step(conversation)
    return out, time.perf_counter() - begin
