"""Keep requests running by construction: tests of clients that leave, aborts and shutdowns need
a request still generating when they act. A long `max_new_tokens` does not guarantee that (the
tiny models' context caps it at a few hundred tokens, under 1.5 s on a fast machine), so the
engine's own thread pauses its scheduler at the first step after `n` requests are running: no
decode step runs until the test lets go, whatever the machine's speed."""

from __future__ import annotations

import contextlib
import socket
import time
from urllib.parse import urlparse


@contextlib.contextmanager
def hold_when(engine, cond):
    """Within the block, from the first step at which `cond(scheduler)` holds, no further step
    runs; aborts and other commands still do (they run between steps). Generation continues on
    exit."""
    sch = engine.scheduler

    def schedule():  # runs on the engine thread, so no step can slip in before the pause
        if cond(sch):
            sch.paused = True
        return type(sch).schedule(sch)

    sch.schedule = schedule
    try:
        yield
    finally:
        del sch.schedule
        engine.continue_generation()


def hold_when_running(engine, n: int = 1):
    """Held once `n` requests run (after their prefill, with their first token)."""
    return hold_when(engine, lambda sch: len(sch.running) >= n)


def hold_after_decode_steps(engine, steps: int):
    """Held once the engine has scheduled `steps` more decode steps."""
    start = engine.scheduler.decode_steps
    return hold_when(engine, lambda sch: sch.decode_steps >= start + steps)


def wait_until(cond, timeout: float = 60.0, what: str = "condition") -> None:
    """Poll `cond` until it holds; the timeout only bounds a failing test, no result depends on it."""
    deadline = time.time() + timeout
    while not cond():
        assert time.time() < deadline, f"{what} never held within {timeout:.0f} s"
        time.sleep(0.02)


def raw_post(url: str, path: str, body: bytes, declared: int | None = None,
             headers: dict | None = None) -> socket.socket:
    """A POST over a bare socket, so the test decides when the client leaves (close it)."""
    u = urlparse(url)
    s = socket.create_connection((u.hostname, u.port))
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    head = (f"POST {path} HTTP/1.1\r\nHost: {u.hostname}\r\nContent-Type: application/json\r\n"
            f"{extra}Content-Length: {declared if declared is not None else len(body)}\r\n\r\n")
    s.sendall(head.encode() + body)
    return s


def num_requests(engine) -> int:
    """Requests the engine holds, running or waiting."""
    info = engine.get_server_info()
    return info["num_running_reqs"] + info["num_waiting_reqs"]
