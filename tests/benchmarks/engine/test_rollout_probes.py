"""benchmarks.engine.rollout_probes: a wrapped method is timed only on the calls its predicate
keeps and is put back after; the recording step counters add up as the engine's own do."""

from __future__ import annotations

from benchmarks.engine import rollout_probes as probes
from sglang_kvc.engine.step_loop import StepStats


class Counter:
    def __init__(self):
        self.events = 0

    def step(self, n: int) -> int:
        self.events += n
        return n


def test_timing_keeps_only_the_calls_that_moved_the_counter_and_restores():
    c = Counter()
    with probes.timing(c, "step", False, keep=lambda out, before: c.events != before,
                       state=lambda: c.events) as timed:
        assert [c.step(n) for n in (0, 2, 0, 3)] == [0, 2, 0, 3]  # results pass through
    assert len(timed.host_s) == len(timed.ends) == 2 and timed.pairs == []
    assert "step" not in vars(c) and c.step(1) == 1  # the class's method again


def test_timing_puts_back_an_instance_attribute():
    c = Counter()
    c.step = lambda n: -n
    with probes.timing(c, "step", False) as timed:
        assert c.step(4) == -4
    assert c.step(5) == -5 and len(timed.host_s) == 1


class FakeLoop:
    pass


class FakeEngine:
    def __init__(self):
        self.loop = FakeLoop()
        self.loop.step_stats = StepStats()

    @property
    def step_stats(self):
        return self.loop.step_stats


def test_recording_stats_keep_each_step_and_the_engine_totals():
    engine = FakeEngine()
    stats = probes.recording_stats(engine)
    assert engine.step_stats is stats
    stats.add(0.010, 0.004)
    stats.add(0.020, 0.015)
    stats.add_prefill(0.5)
    assert [(round(h, 6), w) for h, w, _ in stats.steps] == [(0.006, 0.004), (0.005, 0.015)]
    assert stats.prefills == [0.5] and stats.decode_steps == 2 and stats.prefill_steps == 1
    assert abs(stats.host_s - 0.011) < 1e-12 and abs(stats.gpu_wait_s - 0.019) < 1e-12


def test_spread():
    assert probes.spread([]) is None
    assert probes.spread([3.0, 1.0, 2.0]) == {"min": 1.0, "median": 2.0, "max": 3.0, "sum": 6.0,
                                              "count": 3}
