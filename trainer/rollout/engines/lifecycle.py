"""One engine lifecycle, wherever the engine runs: in the trainer's process (``inprocess.py``),
as a child process (``fleet.py``), behind an external URL (``servers.py``) or in a Ray actor
(``ray/engines.py``, ``ray/supervisor.py``).

Every kind of engine goes through the same five steps, each written once:

    start    -> a URL (or the in-process ``Engine``) that answers ``/health``
    health   -> ``healthy(url)``: an HTTP engine is up when ``GET /health`` answers 200
    restart  -> ``hook(dead_url) -> new_url | None`` (``failover.RestartHook``): a replacement
                that answers ``/health``, or None (the engine stays down); which report
                restarts, how often, and the re-sync are ``restarts.SlotRestarts``'s, the one
                restart owner of the fleet and the Ray supervisor
    re-sync  -> ``WeightSync.resync(new_url)``: the replacement gets the last pushed weights
                and version before the hook returns its URL
    stop     -> ``stop()`` / ``close()``: every process and its port released

Written once for every kind: ``wait_healthy`` (the one health wait: a child process, a Ray actor,
a restarted engine), ``die_with_parent`` (the one parent-death guard of every process the trainer
or a Ray actor spawns: engine processes, the router). An engine that listens picks its port with
``free_port`` (``trainer.launch.free_port``); a restarted child process keeps its old port when
``port_free`` says it still can.
"""

from __future__ import annotations

import ctypes
import signal
import socket
import sys
import time
from typing import Callable, Protocol

import requests

from ...launch import free_port

__all__ = ["EngineGroup", "die_with_parent", "free_port", "healthy", "port_free", "wait_healthy"]

_PR_SET_PDEATHSIG = 1
_PRCTL = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None


class EngineGroup(Protocol):
    """Engines someone else started and will stop: ``fleet.EngineFleet`` (child processes) and
    ``ray.supervisor.EngineSupervisor`` (Ray actors) are two. The in-process engine is owned by
    its ``EngineRollout`` (``close()``) and has no restart: a dead one ends the run."""

    def restart(self, dead_url: str) -> str | None:
        """A replacement for the engine at ``dead_url`` that answers ``/health`` (None: down)."""

    def stop(self) -> None:
        """Every engine of the group ended, its port released; safe to call twice."""


def healthy(url: str, timeout: float = 2.0) -> bool:
    """Whether the engine at ``url`` answers ``GET /health`` with 200 within ``timeout`` s."""
    try:
        return requests.get(url + "/health", timeout=timeout).status_code == 200
    except requests.RequestException:
        return False


def wait_healthy(urls: list[str], timeout: float, *, poll: float = 0.25,
                 health_timeout: float = 2.0, check: Callable[[], None] | None = None
                 ) -> list[str]:
    """Until every engine of ``urls`` answers ``/health``, at most ``timeout`` seconds; the URLs
    still silent then ([]: all up). ``check()`` runs before each round and may raise (a process
    that exited while starting)."""
    deadline = time.monotonic() + timeout
    waiting = list(urls)
    while True:
        if check is not None:
            check()
        waiting = [u for u in waiting if not healthy(u, health_timeout)]
        if not waiting or time.monotonic() > deadline:
            return waiting
        time.sleep(poll)


def die_with_parent() -> None:
    """In a child, before exec: SIGTERM when the process that spawned it dies, even by SIGKILL
    (Linux ``PR_SET_PDEATHSIG``; it follows the spawning thread). Elsewhere a no-op."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGTERM)


def port_free(host: str, port: int) -> bool:
    """Whether an engine could listen on ``host:port`` now (as uvicorn binds: SO_REUSEADDR)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True
