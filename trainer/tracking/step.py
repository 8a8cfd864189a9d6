"""One rollout's metrics, gathered where each part arises and merged once: the loop adds what it
learns as it goes, top to bottom, and the merge keeps one order (a later part's key wins):

    rollout  the samples, engines, staleness, generation speed and fidelity (``rollout/``)
    rewards  the shaped rewards;  prepare  advantages, π_old, correction;  train  ``train/<k>``
    sync     the weight push;  time  ``time_<phase>``;  speed  ``perf/``;  memory  ``memory/``

then ``time_total``, the step's seconds until the merge.

    m = StepMetrics()                     # the step's clock starts
    m.add("rollout", result.stats())
    with m.timed("time_update"):
        ...
    metrics = m.merged()
"""

from __future__ import annotations

import contextlib
import time

PARTS = ("rollout", "rewards", "prepare", "train", "sync", "time", "speed", "memory")


class StepMetrics:
    def __init__(self, clock=time.perf_counter):
        self.clock = clock
        self.start = clock()
        self.parts: dict[str, dict] = {part: {} for part in PARTS}

    def add(self, part: str, *metrics: dict) -> None:
        for m in metrics:
            self.parts[part].update(m)

    def elapsed(self) -> float:
        return self.clock() - self.start

    def time(self, key: str, seconds: float) -> float:
        """A phase's seconds, measured elsewhere (``time_<phase>``)."""
        self.parts["time"][key] = seconds
        return seconds

    @contextlib.contextmanager
    def timed(self, key: str):
        start = self.clock()
        yield
        self.time(key, self.clock() - start)

    def add_train(self, steps: list[dict]) -> None:
        """The optimizer steps' metrics, each averaged over the steps, as ``train/<name>``."""
        self.add("train", {f"train/{k}": sum(s[k] for s in steps) / len(steps) for k in steps[0]})

    def merged(self) -> dict:
        out = {}
        for part in PARTS:
            out.update(self.parts[part])
        return {**out, "time_total": self.elapsed()}
