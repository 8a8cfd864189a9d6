"""One engine lifecycle, wherever the engine runs: in the trainer's process (``manager.py``), as
a child process (``fleet.py``), behind an external URL (``backends.py``) or in a Ray actor
(``ray/engines.py``, ``ray/supervisor.py``).

Every kind of engine goes through the same five steps, each written once:

    start    -> a URL (or the in-process ``Engine``) that answers ``/health``
    health   -> ``healthy(url)``: an HTTP engine is up when ``GET /health`` answers 200
    restart  -> ``hook(dead_url) -> new_url | None`` (``failover.RestartHook``): a replacement
                that answers ``/health``, or None (the engine stays down)
    re-sync  -> ``WeightSync.resync(new_url)``: the replacement gets the last pushed weights
                and version before the hook returns its URL
    stop     -> ``stop()`` / ``close()``: every process and its port released

An engine that listens picks its port with ``free_port`` (one implementation,
``checkpoint_tools.cpu_megatron.free_port``); a restarted child process keeps its old port when
``port_free`` says it still can.
"""

from __future__ import annotations

import socket
from typing import Protocol

import requests

from checkpoint_tools.cpu_megatron import free_port

__all__ = ["EngineGroup", "free_port", "healthy", "port_free"]


class EngineGroup(Protocol):
    """Engines someone else started and will stop: ``fleet.EngineFleet`` (child processes) and
    ``ray.supervisor.EngineSupervisor`` (Ray actors) are two. The in-process engine is owned by
    its ``RolloutManager`` (``close()``) and has no restart: a dead one ends the run."""

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


def port_free(host: str, port: int) -> bool:
    """Whether an engine could listen on ``host:port`` now (as uvicorn binds: SO_REUSEADDR)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True
