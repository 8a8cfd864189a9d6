"""Probes of one rollout's wall time for studies/rollout_split.py: every decode step's host and
GPU-wait seconds and when it ended, every compression event's host and GPU time, every response
dict the engine thread built (its seconds, and when the last one was). They wrap an engine's
attributes for the probe's life and put them back after; none adds a device sync to the path
it times (the GPU times are CUDA events read after the rollout)."""

from __future__ import annotations

import contextlib
import dataclasses
import statistics
import time

import torch


def recording_stats(engine):
    """A StepStats that also keeps each decode step's (host s, GPU-wait s, end time) and each
    prefill step's seconds; set as the engine loop's counters."""
    base = type(engine.step_stats)

    class Recording(base):
        def __init__(self):
            super().__init__()
            self.steps: list[tuple[float, float, float]] = []
            self.prefills: list[float] = []

        def add(self, loop_s: float, wait_s: float) -> None:
            super().add(loop_s, wait_s)
            self.steps.append((loop_s - wait_s, wait_s, time.perf_counter()))

        def add_prefill(self, loop_s: float) -> None:
            super().add_prefill(loop_s)
            self.prefills.append(loop_s)

    stats = Recording()
    engine.loop.step_stats = stats
    return stats


@dataclasses.dataclass
class Timed:
    """Host seconds of each call of a wrapped method; CUDA event pairs around it on a GPU."""

    host_s: list[float] = dataclasses.field(default_factory=list)
    ends: list[float] = dataclasses.field(default_factory=list)  # when each call returned
    pairs: list = dataclasses.field(default_factory=list)

    def gpu_ms(self) -> list[float]:
        if not self.pairs:
            return []
        torch.cuda.synchronize()
        return [s.elapsed_time(e) for s, e in self.pairs]


@contextlib.contextmanager
def timing(obj, name: str, cuda: bool, keep=lambda out, before: True, state=None):
    """Wrap obj.name while active: each call's host seconds (and CUDA events when `cuda`) go to
    the yielded Timed when ``keep(result, state())`` holds (state() is read before the call)."""
    fn, timed, had = getattr(obj, name), Timed(), name in vars(obj)
    state = state or (lambda: None)

    def wrapped(*a, **kw):
        before, t = state(), time.perf_counter()
        events = _events() if cuda else None
        out = fn(*a, **kw)
        if keep(out, before):
            _record(timed, events, t)
        return out
    setattr(obj, name, wrapped)
    try:
        yield timed
    finally:
        if had:  # (an attribute of the instance: put back; else the class's method again)
            setattr(obj, name, fn)
        else:
            delattr(obj, name)


def _events():
    start = torch.cuda.Event(enable_timing=True)
    start.record()
    return start


def _record(timed: Timed, start, t: float) -> None:
    timed.ends.append(time.perf_counter())
    timed.host_s.append(timed.ends[-1] - t)
    if start is not None:
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        timed.pairs.append((start, end))


def spread(values: list[float]) -> dict | None:
    """min / median / max / sum of a list (None when empty)."""
    if not values:
        return None
    return {"min": min(values), "median": statistics.median(values), "max": max(values),
            "sum": sum(values), "count": len(values)}


@contextlib.contextmanager
def gc_pauses():
    """Seconds the garbage collector ran while active, by generation (any thread: the engine's
    included), and the number of collections: yields a dict filled on exit."""
    import gc

    out: dict = {"collections": [0, 0, 0], "seconds": [0.0, 0.0, 0.0]}
    began: list[float] = []

    def callback(phase: str, info: dict) -> None:
        if phase == "start":
            began.append(time.perf_counter())
        elif began:
            out["collections"][info["generation"]] += 1
            out["seconds"][info["generation"]] += time.perf_counter() - began.pop()
    gc.callbacks.append(callback)
    try:
        yield out
    finally:
        gc.callbacks.remove(callback)
        out["total_s"] = sum(out["seconds"])
