"""Where a multi-turn rollout's host time goes, outside the engine's steps: the split that
``benchmarks/engine/multiturn_throughput.py`` prints next to the engine thread's own."""

from __future__ import annotations

import dataclasses
import time


@dataclasses.dataclass
class HostTimes:
    """Seconds on the episode loop's thread unless said otherwise."""

    open_s: float = 0.0  # opening the episodes' sessions, before the first turn
    submit_s: float = 0.0  # handing turns to the engine (each wake-up's in one call)
    wait_s: float = 0.0  # blocked until a turn or an environment step comes back
    handle_s: float = 0.0  # taking turns and observations in (tokenizing them)
    close_s: float = 0.0  # closing ended episodes' sessions (on the closing thread)
    close_calls: int = 0  # engine round trips that closed them (each closes a batch)
    finish_s: float = 0.0  # at the end, waiting for the last sessions to close
    wakeups: int = 0  # times the loop woke; each takes every completion in by then

    def add(self, field: str, begin: float) -> float:
        """``field`` += the seconds since ``begin``; returns now (the next span's begin)."""
        now = time.perf_counter()
        setattr(self, field, getattr(self, field) + now - begin)
        return now

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
