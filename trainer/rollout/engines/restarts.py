"""The one restart owner: which report of a dead engine starts a replacement, how many times, and
what the replacement must do before its URL is handed back.

Both engine groups that restart use it: ``fleet.EngineFleet`` (child processes; ``replace``
ends the old process and spawns another on the same port when it is free) and
``ray.supervisor.EngineSupervisor`` (Ray actors; ``replace`` kills the actor and starts another on
the same GPU bundle). Only *how* an engine is replaced differs; the policy is this class's:

- an engine is a *slot* (its index); every URL a slot ever had maps back to it;
- restarts of different slots overlap, of one slot never (a lock per slot);
- the same death reported twice (two threads whose requests failed on it) starts one
  replacement: a report for a URL the slot no longer serves gets the current URL back;
- a slot that died more than ``max_restarts`` times stays down (the others carry the rollouts);
- ``resync(url)`` (``WeightSync.resync``: the last pushed weights and version) runs before the
  URL is returned, where the group knows the weights (the fleet, in the trainer's process; in a
  Ray job the trainer's ``SupervisorHook`` re-syncs, since the supervisor holds no weights).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

ReplaceFn = Callable[[int], str]  # slot -> the replacement's URL once it answers /health


class SlotRestarts:
    def __init__(self, urls: list[str], replace: ReplaceFn, max_restarts: int,
                 say: Callable[[str], None] = print):
        self.urls = [u.rstrip("/") for u in urls]  # slot -> the URL serving now
        self.replace, self.max_restarts, self.say = replace, max_restarts, say
        self.counts = [0] * len(urls)
        self.slot_of = {u: i for i, u in enumerate(self.urls)}  # every URL a slot ever had
        self.locks = [threading.Lock() for _ in urls]
        self.closed = False

    def restart(self, dead_url: str, resync: Callable[[str], None] | None = None) -> str | None:
        """The replacement's URL (re-synced when ``resync`` is given), the current URL when the
        slot was replaced already, or None: unknown URL, closed group, or died too often."""
        slot = self.slot_of.get(dead_url.rstrip("/"))
        if slot is None:
            self.say(f"no rollout engine was ever at {dead_url}: nothing to restart")
            return None
        with self.locks[slot]:
            if self.closed:
                return None
            if self.urls[slot] != dead_url.rstrip("/"):
                return self.urls[slot]  # replaced already (an earlier report of the same death)
            return self._replace(slot, resync)

    def _replace(self, slot: int, resync: Callable[[str], None] | None) -> str | None:
        if self.counts[slot] >= self.max_restarts:
            self.say(f"rollout engine {slot} died {self.counts[slot] + 1} times: left down")
            return None
        self.counts[slot] += 1
        url = self.replace(slot).rstrip("/")
        self.urls[slot], self.slot_of[url] = url, slot
        if resync is not None:
            resync(url)  # before any request: it must serve the version the trainer checks
        return url

    def close(self) -> None:
        """No restart starts from now on (the group is stopping)."""
        self.closed = True
