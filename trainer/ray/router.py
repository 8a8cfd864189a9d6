"""sglang-router in front of the engines, in a Ray actor that owns its process.

The router is a process of its own (its Rust server blocks the thread that starts it); it is
started from the actor's main thread with a parent-death signal, so it ends with the actor.
Its health checks and circuit breaker are off, as slime runs it: an engine busy with a long
batch must not be dropped from the rotation. The engine supervisor (``supervisor.py``) keeps its
worker list right instead: a dead engine's URL is removed, its replacement's added
(``remove_worker`` / ``add_worker``: sglang-router 0.3.2 has no ``/add_worker?url=``; it takes
``POST /workers {"url"}`` and ``DELETE /workers/<id>``, both queued: answered 202, done later).
The trainer does not generate through it (it fails over between the engines itself); it serves
other clients (evaluations, people).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time

import requests

from ..rollout.engines.lifecycle import die_with_parent
from .node import free_port, node_ip
from .options import RayJobError


def router_available() -> bool:
    return importlib.util.find_spec("sglang_router") is not None


class RouterProcess:
    def __init__(self, worker_urls: list[str]):
        self.worker_urls = worker_urls
        self.proc = None

    def __repr__(self) -> str:
        return "Router"

    def start(self) -> str:
        host = node_ip()
        port = free_port(host)
        argv = [sys.executable, "-m", "sglang_router.launch_router", "--worker-urls",
                *self.worker_urls, "--policy", "round_robin", "--host", host, "--port", str(port),
                "--prometheus-host", host, "--prometheus-port", str(free_port(host)),
                "--disable-health-check", "--disable-circuit-breaker",
                "--request-timeout-secs", "3600", "--log-level", "error"]
        # the hook only calls prctl between fork and exec: safe in a process with threads
        self.proc = subprocess.Popen(argv, preexec_fn=die_with_parent)  # noqa: PLW1509
        return f"http://{host}:{port}"

    def wait(self) -> str:
        """Returns only when the router exits: the job watches this call."""
        return f"the router exited with code {self.proc.wait()}"

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()


def wait_routing(url: str, engines: list[str], timeout: float) -> None:
    """The router lists every engine as a healthy worker (it answers before it has registered
    them), within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    listed: set = set()
    while time.monotonic() < deadline:
        listed = _healthy_workers(url)
        if listed >= set(engines):
            return
        time.sleep(0.5)
    raise RayJobError(f"sglang-router at {url} did not register the engines within {timeout:.0f}s "
                      f"(registered: {sorted(listed)}, expected: {engines})")


def _healthy_workers(url: str) -> set:
    return {w.get("url") for w in _workers(url) if w.get("is_healthy", True)}


def _workers(url: str) -> list[dict]:
    try:
        return requests.get(url + "/workers", timeout=5).json().get("workers", [])
    except (requests.RequestException, ValueError, AttributeError):
        return []


def add_worker(router: str, engine: str, timeout: float) -> None:
    """``engine`` in the router's rotation, healthy, within ``timeout`` seconds."""
    r = requests.post(router + "/workers", json={"url": engine}, timeout=10)
    if r.status_code >= 400:
        raise RayJobError(f"sglang-router at {router} refused worker {engine}: HTTP "
                          f"{r.status_code}: {r.text[:200]}")
    wait_routing(router, [engine], timeout)


def remove_worker(router: str, engine: str, timeout: float) -> None:
    """``engine`` out of the router's rotation within ``timeout`` seconds (gone already: done)."""
    deadline = time.monotonic() + timeout
    for worker in [w for w in _workers(router) if w.get("url") == engine]:
        requests.delete(f"{router}/workers/{worker['id']}", timeout=10)
    while any(w.get("url") == engine for w in _workers(router)):
        if time.monotonic() > deadline:
            raise RayJobError(f"sglang-router at {router} still lists {engine} {timeout:.0f}s "
                              f"after its removal was asked for")
        time.sleep(0.5)
