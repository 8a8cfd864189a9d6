"""A dead rollout engine in a disaggregated Ray job is replaced, and the job goes on.

Who does what:

    trainer rank 0   generates over the engine URLs itself (``HTTPRollout``): a request that fails
                     on an engine that no longer answers ``/health`` goes to a live engine with its
                     index and seed (``trainer/rollout/engines/failover.py``), and the engine's URL goes to
                     the restart hook, in a background thread:
    SupervisorHook   asks the supervisor actor for a replacement, then re-sends it the last pushed
                     weights (``WeightSync.resync``) before the trainer sends it requests again
    EngineSupervisor a named actor that owns the engine actors: kills what is left of the dead
                     one, starts another on the same GPU bundle, waits for ``/health``, swaps the
                     URLs in sglang-router (kept for clients besides the trainer), returns the URL

The seam into the trainer: ``job.py`` names the supervisor (``TRAINER_RAY_ENGINE_SUPERVISOR``) and
its restart bound in the trainer ranks' environment; ``trainer_actor.py`` hands
:func:`restart_hook_from_env` to ``trainer.train.main``, which calls it once the weight sync
exists. It returns None outside such a job (a dead engine stays down).
A trainer rank's death still ends the job (``job.py``).
The engines' start, health, restart, re-sync and stop are the steps every engine takes
(``trainer/rollout/engines/lifecycle.py``); ``EngineSupervisor`` is its ``EngineGroup`` for Ray actors,
with the fleet's restart policy (``trainer/rollout/engines/restarts.py``): only the replacement differs.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable

from ..rollout.engines.restarts import SlotRestarts
from .engines import new_engine, wait_healthy
from .router import add_worker, remove_worker

SUPERVISOR_ENV = "TRAINER_RAY_ENGINE_SUPERVISOR"  # the actor's name (in the job's namespace)
TIMEOUT_ENV = "TRAINER_RAY_ENGINE_RESTART_TIMEOUT"  # seconds the trainer waits for one restart
ACTOR_NAME = "engine-supervisor"
MAX_RESTARTS = 3  # per engine: one that keeps dying stays down (the others carry the rollouts)
ROUTE_TIMEOUT = 60.0  # seconds for the router to drop or take one worker


def _say(line: str) -> None:
    print(f"[ray] {line}", flush=True)


def restart_bound(start_timeout: float) -> float:
    """The longest one restart may take: an engine start plus both router changes."""
    return start_timeout + 2 * ROUTE_TIMEOUT + 30


class EngineSupervisor:
    def __init__(self, engines: list, urls: list[str], reservation, server_args,
                 router: str | None, start_timeout: float):
        self.engines = list(engines)  # slot -> current actor
        self.reservation, self.server_args = reservation, server_args
        self.router, self.start_timeout = router, start_timeout
        self.restarts = SlotRestarts(urls, self._replace, MAX_RESTARTS, say=_say)

    def __repr__(self) -> str:  # the prefix of its output: (EngineSupervisor pid=...)
        return "EngineSupervisor"

    def ready(self) -> bool:
        return True

    def restart(self, dead_url: str) -> str | None:
        """The replacement's URL once it answers ``/health`` (and the router has it); None when
        the URL is unknown or its engine died too often (``SlotRestarts``: the trainer's
        ``SupervisorHook`` re-syncs it)."""
        return self.restarts.restart(dead_url)

    def _replace(self, slot: int) -> str:
        import ray

        old, begin = self.restarts.urls[slot], time.monotonic()
        _say(f"rollout engine {slot} ({old}) is down: starting another on its GPU bundle "
             f"(restart {self.restarts.counts[slot]} of at most {MAX_RESTARTS})")
        self._route(remove_worker, old)
        ray.kill(self.engines[slot], no_restart=True)  # a hung process must free its GPU
        self.engines[slot] = new_engine(self.reservation, slot, self.server_args)
        url = self._start(slot)
        self._route(add_worker, url)
        _say(f"rollout engine {slot} is back at {url} after {time.monotonic() - begin:.0f}s")
        return url

    def _start(self, slot: int) -> str:
        import ray

        try:
            return self._serving(self.engines[slot])
        except Exception:
            ray.kill(self.engines[slot], no_restart=True)  # a half-started engine holds the GPU
            raise

    def _serving(self, engine) -> str:
        """The engine's URL once it answers ``/health``, within the engines' start timeout."""
        import ray

        deadline = time.monotonic() + self.start_timeout
        try:
            url = ray.get(engine.start.remote(), timeout=self.start_timeout)
        except ray.exceptions.GetTimeoutError:
            raise TimeoutError(f"a replacement engine did not start within "
                               f"{self.start_timeout:.0f}s (--engine-start-timeout)") from None
        wait_healthy([url], max(1.0, deadline - time.monotonic()))
        return url

    def _route(self, change, url: str) -> None:
        """The router follows (when there is one); a router that lags is reported, not fatal:
        the trainer does not generate through it."""
        if self.router is None:
            return
        try:
            change(self.router, url, ROUTE_TIMEOUT)
        except Exception as e:  # noqa: BLE001 - the trainer's rollouts do not depend on it
            print(f"[ray] warning: sglang-router did not {change.__name__.replace('_', ' ')} "
                  f"{url}: {e}", flush=True)

    def report(self) -> list[tuple[int, str, dict, int]]:
        """(slot, URL, requests served by path, restarts) of each engine serving now."""
        import ray

        counts = ray.get([e.requests_served.remote() for e in self.engines], timeout=30)
        return list(zip(range(len(self.engines)), self.restarts.urls, counts, self.restarts.counts))

    def stop(self) -> None:
        """Kill every engine (replacements included: the job's driver only knows the first ones)."""
        import ray

        self.restarts.close()
        for engine in self.engines:
            try:
                ray.kill(engine, no_restart=True)
            except Exception:  # noqa: BLE001 - already dead is fine
                pass


@dataclasses.dataclass
class SupervisorHook:
    """``HTTPRollout.on_engine_failure`` in a trainer rank: the supervisor's replacement,
    brought to the current weights before it is handed back."""

    actor_name: str
    timeout: float  # seconds for the supervisor's answer
    resync: Callable[[str], None] | None = None  # WeightSync.resync

    def __call__(self, dead_url: str) -> str | None:
        import ray

        supervisor = ray.get_actor(self.actor_name)
        try:
            url = ray.get(supervisor.restart.remote(dead_url), timeout=self.timeout)
        except ray.exceptions.GetTimeoutError:
            raise TimeoutError(f"the engine supervisor did not replace {dead_url} within "
                               f"{self.timeout:.0f}s") from None
        if url and self.resync is not None:
            self.resync(url)  # before any request: it must serve the version the trainer checks
        return url


def restart_hook_from_env(resync: Callable[[str], None] | None = None) -> SupervisorHook | None:
    """The restart hook when this process is a rank of a disaggregated Ray job, else None."""
    name = os.environ.get(SUPERVISOR_ENV)
    if not name:
        return None
    return SupervisorHook(name, float(os.environ.get(TIMEOUT_ENV, restart_bound(900.0))), resync)


def supervisor_env(start_timeout: float) -> dict[str, str]:
    """What ``job.py`` puts in the trainer ranks' environment."""
    return {SUPERVISOR_ENV: ACTOR_NAME, TIMEOUT_ENV: str(restart_bound(start_timeout))}
