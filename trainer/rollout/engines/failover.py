"""Which rollout servers are up, and what happens when one goes down (used by ``HTTPRollout``).

Engines sit in fixed slots (engine ``i`` = slot ``i``). A request goes to its slot's engine, or,
when that one is down, to the next engine up. When a request fails and the server does not answer
``/health``, the engine is marked down once, counted, and -- if a restart hook was given --
restarted in a background thread while its requests go elsewhere:

    hook(dead_url) -> new_url | None

The hook returns the URL of a replacement that already serves the current weights (it may be
the same URL: a new process on the same port), or None when it could not or would not restart
it. It runs in its own thread, may block (it should bound itself: a restart it abandons must
return None), and may raise (counted as no restart). ``trainer.rollout.engines.fleet.EngineFleet.restart``
is one such hook (child processes); a Ray launcher passes its own.

When no engine is up and no restart is pending, requests fail at once with ``AllEnginesDown``;
while restarts are pending they wait at most ``restart_wait`` seconds for one to come back.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Callable

log = logging.getLogger(__name__)

RestartHook = Callable[[str], "str | None"]


class AllEnginesDown(RuntimeError):
    pass


@dataclasses.dataclass
class FaultCounts:
    requests_reissued: int = 0  # requests sent again (to another engine) after a failed attempt
    engine_failures: int = 0  # engines found dead
    engine_restarts: int = 0  # replacements that came up

    def minus(self, other: "FaultCounts") -> "FaultCounts":
        return FaultCounts(*(getattr(self, f.name) - getattr(other, f.name)
                             for f in dataclasses.fields(self)))

    def metrics(self) -> dict[str, float]:
        return {f"rollout/{f.name}": float(getattr(self, f.name)) for f in dataclasses.fields(self)}


class EngineSet:
    def __init__(self, urls: list[str], on_failure: RestartHook | None = None,
                 restart_wait: float = 600.0):
        self.urls = list(urls)  # slot -> current URL (a replacement takes its predecessor's slot)
        self.up = [True] * len(urls)
        self.errors: dict[int, str] = {}
        self.on_failure = on_failure
        self.restart_wait = restart_wait
        self.counts = FaultCounts()
        self._reported = FaultCounts()
        self._restarting = 0
        self._cond = threading.Condition()

    @property
    def size(self) -> int:
        return len(self.urls)

    def live(self) -> list[str]:
        with self._cond:
            return [u for u, up in zip(self.urls, self.up) if up]

    def pick(self, slot: int, stop: threading.Event | None = None) -> tuple[int, str]:
        """The engine of ``slot`` if it is up, else the next one up (waiting for a pending
        restart, at most ``restart_wait`` seconds)."""
        deadline = time.monotonic() + self.restart_wait
        with self._cond:
            while True:
                found = self._first_up(slot)
                if found is not None:
                    return found
                left = deadline - time.monotonic()
                if not self._restarting or left <= 0 or (stop is not None and stop.is_set()):
                    raise AllEnginesDown(self._down_message(left <= 0))
                self._cond.wait(min(left, 1.0))  # wake up now and then to see `stop`

    def _first_up(self, slot: int) -> tuple[int, str] | None:
        for k in range(self.size):
            j = (slot + k) % self.size
            if self.up[j]:
                return j, self.urls[j]
        return None

    def _down_message(self, waited: bool) -> str:
        why = "; ".join(f"{self.urls[i]}: {e}" for i, e in sorted(self.errors.items()))
        tail = (f" and none came back within {self.restart_wait:.0f} s" if waited else
                " and no restart is pending" if self.on_failure else " (no restart hook)")
        return f"all {self.size} rollout engine(s) are down{tail}: {why}"

    def failed(self, slot: int, url: str, error: str) -> None:
        """Mark the engine of ``slot`` down (once per process) and start its restart."""
        with self._cond:
            if self.urls[slot] != url or not self.up[slot]:
                return  # already known, or already replaced
            self.up[slot] = False
            self.errors[slot] = error
            self.counts.engine_failures += 1
            if self.on_failure is None:
                return
            self._restarting += 1
        log.warning("rollout engine %s is down (%s); restarting it", url, error)
        threading.Thread(target=self._restart, args=(slot, url), daemon=True,
                         name=f"restart-engine{slot}").start()

    def _restart(self, slot: int, url: str) -> None:
        new, error = None, None
        try:
            new = self.on_failure(url)
        except Exception as e:  # noqa: BLE001 - a failed restart leaves the engine down
            log.exception("restarting rollout engine %s failed", url)
            error = f"restart failed: {e}"
        with self._cond:
            self._restarting -= 1
            if error:
                self.errors[slot] += f"; {error}"
            if new:
                self.urls[slot], self.up[slot] = new.rstrip("/"), True
                self.errors.pop(slot, None)
                self.counts.engine_restarts += 1
            self._cond.notify_all()
        log.warning("rollout engine %s %s", url, f"replaced by {new}" if new else "stays down")

    def wait_for_restarts(self, timeout: float | None = None) -> bool:
        """Block until no restart is pending; False if ``timeout`` ran out first."""
        with self._cond:
            return self._cond.wait_for(lambda: self._restarting == 0, timeout)

    def reissued(self) -> None:
        with self._cond:
            self.counts.requests_reissued += 1

    def take_counts(self) -> FaultCounts:
        """What happened since the last call (one rollout's share of the counts)."""
        with self._cond:
            delta = self.counts.minus(self._reported)
            self._reported = dataclasses.replace(self.counts)
            return delta
