"""Asynchronous rollouts with a staleness bound (slime's ``train_async``, AReaL's
``max_head_offpolicyness``): a background thread generates the next rollouts while the current
one trains.

    gate = WeightGate(version=start, max_staleness=1, interrupt=abort_all)  # abort_all: partial
    producer = AsyncRollouts(generate, gate, range(start, num_rollout)).start()
    out = producer.get(rollout_id)                 # blocks until that rollout is generated
    with gate.update(rollout_id + 1):              # waits for (or interrupts) generation
        push the weights

Rollout r starts generating only once the engines serve version >= r - max_staleness, so every
sample trained at step r started under a version no older than that: the bound holds by
construction (and ``staleness.check_bound`` verifies it). With the bound at 0 the thread
generates rollout r exactly when the synchronous loop would, with the same calls: the run is
the synchronous one.

A weight push never overlaps generation: without partial rollouts it waits until the rollout in
flight is complete (slime's async), so every sample has one version; with partial rollouts
(``interrupt`` set) it aborts the requests in flight and waits only until the engines are
unused (``engine_use``, held by ``partial.ResumableBackend`` around each batch of requests),
which then waits for the push before it continues them. The rest of the rollout (rewards, the
gather between data-parallel ranks) may run during the push: a rank's push (its collectives)
never waits for another rank's generation thread.
"""

from __future__ import annotations

import contextlib
import dataclasses
import queue
import threading
from typing import Callable


_ABORT_EVERY = 0.2  # seconds between aborts while a push waits: requests sent meanwhile end too


@dataclasses.dataclass
class AsyncConfig:
    max_staleness: int | None = None  # --max-staleness; None: the synchronous loop
    partial_rollout: bool = False  # --partial-rollout: interrupt generation at a weight push

    @property
    def enabled(self) -> bool:
        return self.max_staleness is not None


class Closed(Exception):
    """The run is ending: the generation thread stops waiting."""


class WeightGate:
    """Who may use the engines: the generation thread (one rollout at a time, within the bound)
    or a weight push (``update``) / an evaluation (``exclusive``) of the training thread."""

    def __init__(self, version: int, max_staleness: int,
                 interrupt: Callable[[], None] | None = None):
        self.version, self.max_staleness, self.interrupt = version, max_staleness, interrupt
        self._cond = threading.Condition()
        self._generating = self._updating = self._evaluating = self._closed = False
        self._engine_users = 0  # partial rollouts: batches of requests on the engines now
        self.interruptions = 0  # pushes that found generation in flight and interrupted it

    def wait_for_turn(self, rollout_id: int) -> None:
        """(generation thread) Until the engines are recent enough for ``rollout_id``."""
        self._wait(lambda: self.version >= rollout_id - self.max_staleness)

    @contextlib.contextmanager
    def generating(self):
        """(generation thread) Holds the engines while a rollout is generated."""
        self._wait(lambda: not (self._updating or self._evaluating or self._generating))
        self._set(generating=True)
        try:
            yield
        finally:
            self._set(generating=False)

    @contextlib.contextmanager
    def engine_use(self):
        """(generation thread, partial rollouts) Requests on the engines: not during a push."""
        self._wait(lambda: not self._updating)
        self._count_users(+1)
        try:
            yield
        finally:
            self._count_users(-1)

    def _count_users(self, delta: int) -> None:
        with self._cond:
            self._engine_users += delta
            self._cond.notify_all()

    @contextlib.contextmanager
    def update(self, new_version: int):
        """(training thread) A weight push: waits for the rollout in flight, or interrupts it
        with partial rollouts; the engines then serve ``new_version``."""
        with self._hold("updating", interrupt=self.interrupt is not None):
            yield
            self.version = new_version

    @contextlib.contextmanager
    def exclusive(self):
        """(training thread) The engines to itself (evaluation): after the rollout in flight."""
        with self._hold("evaluating", interrupt=False):
            yield

    def close(self) -> None:
        self._set(closed=True)

    @contextlib.contextmanager
    def _hold(self, flag: str, interrupt: bool):
        self._set(**{flag: True})
        try:
            self._drain(interrupt)
            yield
        finally:
            self._set(**{flag: False})

    def _drain(self, interrupt: bool) -> None:
        """Until the engines are quiet: the whole rollout in flight, or (interrupting) only its
        requests, aborted again every ``_ABORT_EVERY`` s (a batch sent meanwhile ends too)."""
        with self._cond:
            if not interrupt:
                self._cond.wait_for(lambda: not self._generating)
                return
            if self._engine_users:
                self.interruptions += 1
            while self._engine_users:
                self.interrupt()
                self._cond.wait(_ABORT_EVERY)

    def _wait(self, ready: Callable[[], bool]) -> None:
        with self._cond:
            while not ready():
                if self._closed:
                    raise Closed()
                self._cond.wait()

    def _set(self, **flags) -> None:
        with self._cond:
            for name, value in flags.items():
                setattr(self, f"_{name}", value)
            self._cond.notify_all()


class AsyncRollouts:
    """The generation thread: ``generate(rollout_id)`` for each rollout in order, each when the
    gate allows, results handed over in order (an error is re-raised by ``get``)."""

    def __init__(self, generate: Callable[[int], object], gate: WeightGate, rollout_ids: range):
        self.generate, self.gate, self.rollout_ids = generate, gate, rollout_ids
        self._results: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="rollout-generator", daemon=True)

    def start(self) -> "AsyncRollouts":
        self._thread.start()
        return self

    def get(self, rollout_id: int):
        got, out = self._results.get()
        if isinstance(out, BaseException):
            raise RuntimeError(f"generating rollout {got} failed: {out}") from out
        if got != rollout_id:
            raise RuntimeError(f"expected rollout {rollout_id}, the generator produced {got}")
        return out

    def close(self, timeout: float = 60.0) -> None:
        self.gate.close()
        self._thread.join(timeout)

    def _loop(self) -> None:
        for rollout_id in self.rollout_ids:
            try:
                self.gate.wait_for_turn(rollout_id)
                with self.gate.generating():
                    out = self.generate(rollout_id)
            except Closed:
                return
            except BaseException as e:  # noqa: BLE001 - handed to the training thread
                self._results.put((rollout_id, e))
                return
            self._results.put((rollout_id, out))


def memory_safe(cfg: AsyncConfig, engines_cfg) -> AsyncConfig:
    """The overlap this placement can afford. Rollout n+1 generates while update n runs on
    engines that keep their memory apart from the trainer's: servers, engine processes
    (``--rollout-engine-process``), ``--rollout-num-gpus``. A colocated in-process engine that
    releases its KV pool while training (``--offload-rollout``, the GPU default) would bring the
    pool back next to the update's activations, sized without it: such a run keeps the
    synchronous schedule (bound 0) and says so at startup."""
    if not cfg.max_staleness or engines_cfg.generates_beside_training():
        return cfg
    if _rank0():
        print(f"--max-staleness {cfg.max_staleness}: the colocated in-process engine releases its "
              "KV pool while training (--offload-rollout), so generating during the update could "
              "run out of memory: rollouts stay synchronous (staleness 0). To overlap them, add "
              "--rollout-engine-process (the engine keeps its pool in a process of its own) or "
              "--no-offload-rollout", flush=True)
    return dataclasses.replace(cfg, max_staleness=0)


def _rank0() -> bool:
    import torch.distributed as dist

    return not dist.is_initialized() or dist.get_rank() == 0


def weight_gate(cfg: AsyncConfig, version: int, engines) -> WeightGate | None:
    """The gate of a run whose engines serve ``version`` now (None: synchronous). With partial
    rollouts a push interrupts generation: ``abort_request`` (all requests) on this rank's
    engine(s) (``Engines.abort_all``; nothing where it hosts none)."""
    if not cfg.enabled:
        return None
    return WeightGate(version, cfg.max_staleness,
                      engines.abort_all if cfg.partial_rollout else None)
