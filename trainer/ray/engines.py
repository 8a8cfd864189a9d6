"""A disaggregated rollout engine: the sglang-kvc HTTP server (its ``Engine`` and ``create_app``,
as ``python -m sglang_kvc.launch_server`` runs them) inside a Ray actor, so the server dies with
the actor and no process outlives the job. Ray gives the actor its GPU through
``CUDA_VISIBLE_DEVICES``, so the engine's ``auto`` device is that GPU.

The actor counts the requests it served by path (``/generate``, ``/update_weights_from_tensor``),
which the job reports at the end: every engine must have had its share. A dead engine does not end
the job: the trainer re-issues its requests and the engine supervisor (``supervisor.py``) starts
another on the same GPU bundle.

A fault drill for tests (and for trying a cluster): ``TRAINER_RAY_ENGINE_EXIT_AFTER=<engine>:<k>``
in the job's environment makes engine ``<engine>``'s first process SIGKILL itself when its
``<k>``-th ``/generate`` request arrives, with requests in flight, as a crash would;
``<engine>:<path>:<k>`` counts requests to ``/<path>`` instead (``0:update_weights_from_tensor:2``:
engine 0 dies in the middle of a weight push).
"""

from __future__ import annotations

import collections
import dataclasses
import os
import signal
import threading
import time

from ..rollout.engines.lifecycle import wait_healthy as wait_for_health
from .node import free_port, node_ip
from .options import RayJobError

FAULT_ENV = "TRAINER_RAY_ENGINE_EXIT_AFTER"


@dataclasses.dataclass(frozen=True)
class Drill:
    """Engine death at the ``k``-th request to ``path`` (k = 0: no drill)."""

    k: int = 0
    path: str = "/generate"

    def fires(self, path: str, count: int) -> bool:
        return bool(self.k) and path == self.path and count == self.k


def exit_after(index: int, spec: str | None) -> Drill:
    """The drill for engine ``index`` from ``TRAINER_RAY_ENGINE_EXIT_AFTER`` (none: ``Drill()``)."""
    if not spec:
        return Drill()
    parts = [p.strip() for p in spec.split(":")]
    engine, k, path = parts[0], parts[-1], parts[1] if len(parts) == 3 else "generate"
    if len(parts) not in (2, 3) or not (engine.isdigit() and k.isdigit() and int(k) > 0 and path):
        raise RayJobError(f"{FAULT_ENV}={spec!r}: expected <engine>:<k> or <engine>:<path>:<k>, "
                          f"e.g. 0:8 (engine 0 kills itself at its 8th /generate request) or "
                          f"0:update_weights_from_tensor:2")
    return Drill(int(k), "/" + path.lstrip("/")) if int(engine) == index else Drill()


def new_engine(reservation, position: int, server_args, exit_after: Drill = Drill()):
    """An engine actor on ``reservation``'s bundle for ``position``; ``.start`` serves it."""
    import ray

    return ray.remote(EngineServer).options(
        num_cpus=1, num_gpus=1, scheduling_strategy=reservation.strategy(position)
    ).remote(position, server_args, exit_after)


class EngineServer:
    def __init__(self, index: int, server_args, exit_after: Drill = Drill()):
        self.index, self.server_args, self.exit_after = index, server_args, exit_after
        self.counts: collections.Counter = collections.Counter()
        self.server = self.thread = self.engine = None

    def __repr__(self) -> str:  # the prefix of this engine's output: (RolloutEngine0 pid=...)
        return f"RolloutEngine{self.index}"

    def start(self) -> str:
        """Load the model, serve it on this node, return the URL (once uvicorn listens)."""
        import uvicorn
        from sglang_kvc import Engine, create_app

        host = node_ip()
        self.engine = Engine(server_args=dataclasses.replace(self.server_args, host=host))
        app = create_app(self.engine)
        app.middleware("http")(_counter(self.counts, self.exit_after))
        port = free_port(host)  # after the model loaded: the shortest window for another taker
        self.server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, name="engine-http", daemon=True)
        self.thread.start()
        self._wait_listening()
        return f"http://{host}:{port}"

    def _wait_listening(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"{self!r}: the HTTP server did not start listening")
            time.sleep(0.05)

    def requests_served(self) -> dict[str, int]:
        return dict(self.counts)


def _counter(counts: collections.Counter, drill: Drill = Drill()):
    """HTTP middleware counting requests by path (and running the fault drill). A function, not
    a method: an ``async def`` on the class would make Ray run the actor on one event loop."""

    async def count(request, call_next):
        path = request.url.path
        counts[path] += 1
        if drill.fires(path, counts[path]):
            os.kill(os.getpid(), signal.SIGKILL)  # the drill: no clean-up, requests in flight
        return await call_next(request)

    return count


def wait_healthy(urls: list[str], timeout: float) -> None:
    """Every engine answers ``/health`` within ``timeout`` seconds, or an error naming the silent."""
    waiting = wait_for_health(urls, timeout, poll=0.5, health_timeout=5)
    if waiting:
        raise RayJobError(f"rollout engine(s) {waiting} did not answer /health within "
                          f"{timeout:.0f}s (--engine-start-timeout)")
