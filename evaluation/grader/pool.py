"""Grading many pairs in worker processes with a hard per-item timeout.

Each worker is a separate interpreter (``python -m evaluation.grader.worker``) talking to the
parent over a pair of pipes, so nothing of the parent (threads, CUDA, sockets, its ``__main__``)
is inherited or re-imported. The parent hands a worker one item at a time and waits on all
pipes with a deadline; a worker that overruns its item's deadline is killed (SIGKILL; no
signals in threads anywhere) and replaced, and the item scores ``False`` with
``timed_out=True``. The clock of an item starts when it is handed to a worker that has finished
importing, so worker start-up is never charged to an item.
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import subprocess
import sys
import time
from collections import deque
from multiprocessing.connection import Connection, wait
from typing import Iterable

from .equivalence import DEFAULT_OPTIONS, GradeOptions, answers_equal, gold_answer, prediction_answer

# the directory holding the `evaluation` package, so workers import the same code as the parent
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STARTUP_TIMEOUT = 120.0  # seconds a fresh worker may take to import sympy & co.
MAX_CHUNK = 16  # items handed to a worker per message


@dataclasses.dataclass
class GradeResult:
    """Outcome of grading one pair; truthy when correct."""

    correct: bool
    extracted: str | None = None
    timed_out: bool = False
    error: str | None = None

    def __bool__(self) -> bool:
        return self.correct


def grade_one(pred, gold, options: GradeOptions = DEFAULT_OPTIONS) -> GradeResult:
    """Grade one pair in this process and report the extracted answer."""
    extracted = prediction_answer(pred)
    try:
        correct = answers_equal(extracted, gold_answer(gold), options)
    except Exception as exc:  # noqa: BLE001 - a grader bug must not kill the batch
        return GradeResult(False, extracted, error=f"{type(exc).__name__}: {exc}")
    return GradeResult(bool(correct), extracted)


class _Worker:
    """One grader subprocess; ``state`` is ``starting`` or ``idle`` (ready for work)."""

    def __init__(self, options: GradeOptions):
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        cmd = [sys.executable, "-m", "evaluation.grader.worker", str(to_child_r), str(from_child_w)]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
        # a session of its own: the terminal's Ctrl-C goes to the parent alone, even while the
        # worker starts (the worker ignores SIGINT too); the parent stops the pool
        self.process = subprocess.Popen(cmd, pass_fds=(to_child_r, from_child_w), env=env,
                                        stdin=subprocess.DEVNULL, close_fds=True,
                                        start_new_session=True)
        os.close(to_child_r)
        os.close(from_child_w)
        self.send_conn = Connection(to_child_w, readable=False)
        self.conn = Connection(from_child_r, writable=False)
        self.send_conn.send(options)
        self.state = "starting"
        self.queue: deque[int] = deque()  # indices handed over and not answered yet, in order
        self.deadline = time.monotonic() + STARTUP_TIMEOUT

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        try:
            self.process.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            pass
        for conn in (self.send_conn, self.conn):
            try:
                conn.close()
            except OSError:
                pass


class GraderPool:
    """A reusable pool of grader processes. Use as a context manager or call :meth:`close`."""

    def __init__(self, workers: int | None = None, timeout: float = 5.0,
                 options: GradeOptions = DEFAULT_OPTIONS):
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        self.n_workers = max(1, workers or os.cpu_count() or 1)
        self.timeout = timeout
        self.options = options
        self._workers: list[_Worker] = []
        self.timeouts = 0  # items killed for running past the timeout, over the pool's life
        self._start_failures = 0  # workers that died before reporting ready

    def map(self, pairs: Iterable, progress: bool = False, desc: str = "grading") -> list[GradeResult]:
        """Grade ``pairs`` (``(pred, gold)`` tuples or dicts with ``pred``/``gold``), in order.

        Items go to workers in small chunks (fewer round trips); the worker answers each item as
        it finishes, and the deadline of a worker is always ``timeout`` after its last answer
        (or hand-over), so every item gets the full ``timeout`` on its own.
        """
        items = [_as_pair(p) for p in pairs]
        results: list[GradeResult | None] = [None] * len(items)
        pending = deque(range(len(items)))
        bar = None
        if progress:
            from ..progress import progress_bar

            bar = progress_bar(total=len(items), desc=desc, unit="pair")

        def finish(index: int, result: GradeResult) -> None:
            results[index] = result
            if bar:
                bar.update(1)

        def requeue(worker: _Worker) -> None:
            pending.extendleft(reversed(worker.queue))
            worker.queue.clear()

        try:
            while pending or any(w.queue for w in self._workers):
                in_flight = sum(len(w.queue) for w in self._workers)
                want = min(self.n_workers, len(pending) + in_flight)
                while len(self._workers) < want:
                    self._workers.append(_Worker(self.options))
                chunk = max(1, min(MAX_CHUNK, len(pending) // (4 * self.n_workers)))
                for worker in self._workers:
                    if worker.state == "idle" and not worker.queue and pending:
                        batch = [pending.popleft() for _ in range(min(chunk, len(pending)))]
                        try:
                            worker.send_conn.send([(i, *items[i]) for i in batch])
                        except (BrokenPipeError, OSError):
                            pending.extendleft(reversed(batch))
                            self._retire(worker)
                            continue
                        worker.queue.extend(batch)
                        worker.deadline = time.monotonic() + self.timeout
                waiting = [w for w in self._workers if w.queue or w.state == "starting"]
                if not waiting:
                    continue
                timeout = max(0.0, min(w.deadline for w in waiting) - time.monotonic())
                ready = wait([w.conn for w in waiting], timeout=timeout)
                for worker in waiting:
                    if worker.conn not in ready:
                        continue
                    try:
                        message = worker.conn.recv()
                    except (EOFError, OSError):
                        if worker.queue:
                            finish(worker.queue.popleft(), GradeResult(False, None, error="grader worker died"))
                            requeue(worker)
                        elif worker.state == "starting":
                            self._start_failures += 1
                            if len(self._workers) == 1 or self._start_failures > 3 * len(self._workers):
                                raise RuntimeError(
                                    "grader workers fail to start; run `python -m "
                                    "evaluation.grader.worker` to see why") from None
                        self._retire(worker)
                        continue
                    if message == "ready":
                        worker.state = "idle"
                        continue
                    index, result = message
                    if worker.queue and worker.queue[0] == index:
                        worker.queue.popleft()
                    finish(index, result)
                    worker.deadline = time.monotonic() + self.timeout
                now = time.monotonic()
                for worker in [w for w in self._workers if (w.queue or w.state == "starting") and w.deadline <= now]:
                    if worker.queue:
                        self.timeouts += 1
                        finish(worker.queue.popleft(), GradeResult(
                            False, None, timed_out=True, error=f"timed out after {self.timeout:g} s"))
                        requeue(worker)
                    self._retire(worker)
        finally:
            if bar:
                bar.close()
        return results  # type: ignore[return-value]

    def _retire(self, worker: _Worker) -> None:
        worker.kill()
        if worker in self._workers:
            self._workers.remove(worker)

    def close(self) -> None:
        for worker in list(self._workers):
            try:
                worker.send_conn.send(None)
            except (BrokenPipeError, OSError):
                pass
        for worker in list(self._workers):
            try:
                worker.process.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                pass
            worker.kill()
        self._workers.clear()

    def __enter__(self) -> "GraderPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _as_pair(item) -> tuple:
    if isinstance(item, dict):
        return item.get("pred"), item.get("gold")
    pred, gold = item
    return pred, gold


_SHARED: dict[tuple, GraderPool] = {}


def grade_many(pairs: Iterable, timeout: float = 5.0, workers: int | None = None,
               options: GradeOptions = DEFAULT_OPTIONS, progress: bool = False) -> list[GradeResult]:
    """Grade ``(pred, gold)`` pairs in worker processes, each with a hard ``timeout`` in seconds.

    Returns one :class:`GradeResult` per pair, in order (truthy when correct). Pools are kept
    alive between calls (one per ``workers``/``timeout``/``options``) so repeated calls from a
    training loop pay no start-up cost; they are shut down at interpreter exit.
    """
    key = (workers, timeout, options)
    pool = _SHARED.get(key)
    if pool is None:
        pool = _SHARED[key] = GraderPool(workers, timeout, options)
    return pool.map(pairs, progress=progress)


@atexit.register
def _close_shared() -> None:
    for pool in _SHARED.values():
        pool.close()
    _SHARED.clear()
