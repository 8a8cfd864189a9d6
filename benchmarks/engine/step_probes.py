"""Probes of an engine's decode steps for engine/throughput.py: the GPU time of each replayed
step graph (CUDA events around the replay: the stream runs a graph without host gaps, so the
pair's elapsed time is the step's own GPU time, whatever the host did around it), and the
device syncs the engine thread makes per step beyond the one read of each step's outputs
(``torch.cuda.set_sync_debug_mode``: every synchronizing torch call warns once; counted)."""

from __future__ import annotations

import contextlib
import statistics
import warnings

import torch


class GraphTimer:
    """CUDA events around every graph replay of `engine` while active."""

    def __init__(self, engine):
        self.graphs = engine.runner.graphs
        self.pairs: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []

    @contextlib.contextmanager
    def active(self):
        if self.graphs is None:
            yield self
            return
        replay = self.graphs._replay

        def timed(graph):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            replay(graph)
            end.record()
            self.pairs.append((start, end))
        self.graphs._replay = timed
        try:
            yield self
        finally:
            del self.graphs._replay  # the class's method again

    def ms_per_step(self) -> float | None:
        """Median GPU milliseconds of a replayed step (None: no step replayed)."""
        if not self.pairs:
            return None
        torch.cuda.synchronize()
        return statistics.median(s.elapsed_time(e) for s, e in self.pairs)


@contextlib.contextmanager
def count_syncs():
    """Counts synchronizing torch calls on any thread while active: yields a one-item list."""
    seen = [0]
    shown = warnings.showwarning

    def counting(message, category, *a, **kw):
        if "synchroniz" in str(message):
            seen[0] += 1
            return
        shown(message, category, *a, **kw)
    warnings.filterwarnings("always", message=".*synchroniz.*")
    warnings.showwarning = counting
    torch.cuda.set_sync_debug_mode("warn")
    try:
        yield seen
    finally:
        torch.cuda.set_sync_debug_mode("default")
        warnings.showwarning = shown
        warnings.filterwarnings("ignore", message=".*synchroniz.*")
