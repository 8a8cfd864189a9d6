"""What the engine thread does in each prefill step, for benchmarks/engine/multiturn_throughput.py.

`StepProbe` wraps one engine's step loop (`_iterate`, `_take`, `finish`), scheduler
(`schedule`) and model runner (`launch`) on the instance (the engine's code is unchanged) and
records every prefill step while enabled: its rows (computed, continuing a session), new
tokens, longest new run and held KV, and its milliseconds: the whole engine-thread iteration
(what StepStats.prefill_s adds up); the launch alone (host: layouts, forward, sampling); the
thread's CPU time (wall minus CPU = blocked: the interpreter lock, a sleep; a CUDA sync that
spins counts as CPU); the wait for the step before it and, once read, for its own outputs (the
GPU's share); the requests taken in from the inbox (a continuation's session adoption); the
scheduler's batch building; the requests finished (parking, final outputs and their
callbacks: the step before's); and the rest of the iteration (``other_ms``: output
processing, compression). Each iteration is a profiler range, ``engine_step``, and each
prefill launch inside it ``prefill_launch:continuation`` (a row continues a session) or
``prefill_launch:fresh``, so a profile can be cut to the prefill steps of each kind.

`profiled` runs a function under torch.profiler started on the engine thread (its CPU
callbacks are per thread: started on the caller's thread, it would see none of the engine's
ops) and writes the top CUDA kernels and CPU ops by self time, and the CPU ops inside prefill
steps with their share of those steps (multiturn_profile.py).
"""

from __future__ import annotations

import cProfile
import io
import pstats
import statistics
import time
from dataclasses import asdict, dataclass

from torch.profiler import record_function


@dataclass
class PrefillStep:
    rows: int
    computed_rows: int  # not followers sharing a leader's prefill
    continuations: int  # rows continuing a session on its held KV
    tokens: int  # new tokens computed
    max_new: int
    max_held: int  # KV slots already in the longest-held row
    wall_ms: float = 0.0
    launch_ms: float = 0.0
    thread_cpu_ms: float = 0.0
    prev_wait_ms: float = 0.0  # waiting for the step launched before it (the GPU)
    take_ms: float = 0.0  # requests taken in from the inbox (sessions' adoption)
    schedule_ms: float = 0.0  # the scheduler building the batch (admission, prefix matching)
    finish_ms: float = 0.0  # requests finished (park, final output, callback)
    other_ms: float = 0.0  # the rest of the iteration
    own_wait_ms: float = 0.0  # waiting for its own outputs, in the next iteration

    @classmethod
    def of(cls, seqs) -> "PrefillStep":
        computed = [s for s in seqs if s.leader is None]
        new = [s.num_tokens - s.num_computed for s in computed]
        return cls(len(seqs), len(computed), sum(s.adopted_kv for s in seqs), sum(new),
                   max(new, default=0), max((s.kv_len for s in computed), default=0))


class StepProbe:
    def __init__(self, loop):
        self.loop, self.enabled = loop, False
        self.steps: list[PrefillStep] = []
        self._pending: list = []  # (PrefillStep, PendingStep): own wait known once read
        self._launched = None
        self.python_profile: cProfile.Profile | None = None  # set: prefill launches under cProfile
        self._take_s = self._finish_s = self._schedule_s = 0.0
        self._iterate, self._launch = loop._iterate, loop.runner.launch
        self._take, self._finish = loop._take, loop.finish
        self._schedule = loop.scheduler.schedule
        loop._iterate, loop.runner.launch = self.iterate, self.launch
        loop._take, loop.finish = self.take_one, self.finish
        loop.scheduler.schedule = self.schedule

    def schedule(self):
        t0 = time.perf_counter()
        try:
            return self._schedule()
        finally:
            self._schedule_s += time.perf_counter() - t0

    def take_one(self, seq) -> None:
        t0 = time.perf_counter()
        self._take(seq)
        self._take_s += time.perf_counter() - t0

    def finish(self, seq, reason) -> None:
        t0 = time.perf_counter()
        self._finish(seq, reason)
        self._finish_s += time.perf_counter() - t0

    def iterate(self) -> None:
        t0, c0, w0 = time.perf_counter(), time.thread_time(), self.loop._waited_s
        self._launched, self._take_s, self._finish_s, self._schedule_s = None, 0.0, 0.0, 0.0
        with record_function("engine_step"):
            self._iterate()
        if self._launched is None or not self.enabled:
            return
        rec = self._launched
        rec.wall_ms = 1e3 * (time.perf_counter() - t0)
        rec.thread_cpu_ms = 1e3 * (time.thread_time() - c0)
        rec.prev_wait_ms = 1e3 * (self.loop._waited_s - w0)
        rec.take_ms, rec.finish_ms = 1e3 * self._take_s, 1e3 * self._finish_s
        rec.schedule_ms = 1e3 * self._schedule_s
        rec.other_ms = (rec.wall_ms - rec.launch_ms - rec.prev_wait_ms - rec.take_ms
                        - rec.finish_ms - rec.schedule_ms)
        self.steps.append(rec)

    def launch(self, batch):
        if not (batch.is_prefill and self.enabled):
            return self._launch(batch)
        rec = PrefillStep.of(batch.seqs)
        t0 = time.perf_counter()
        kind = "continuation" if rec.continuations else "fresh"
        with record_function(f"prefill_launch:{kind}"):
            step = self._profiled_launch(batch)
        rec.launch_ms = 1e3 * (time.perf_counter() - t0)
        self._launched = rec
        self._pending.append((rec, step))
        return step

    def _profiled_launch(self, batch):
        # cProfile counts the engine thread only when enabled on it: this is that thread. Where a
        # launch's host milliseconds go by Python function (torch.profiler names only ops).
        if self.python_profile is None:
            return self._launch(batch)
        self.python_profile.enable()
        try:
            return self._launch(batch)
        finally:
            self.python_profile.disable()

    def take(self) -> list[dict]:
        """The prefill steps recorded since the last take (own waits filled in)."""
        for rec, step in self._pending:
            rec.own_wait_ms = 1e3 * step.wait_s
        out = [asdict(s) for s in self.steps]
        self.steps, self._pending = [], []
        return out


def step_summary(steps: list[dict]) -> dict:
    """Medians of the continuation prefill steps (rows continuing a session) and of the fresh
    ones, and each kind's count and total wall seconds."""
    out = {}
    for kind, pick in (("continuation", lambda s: s["continuations"] > 0),
                       ("fresh", lambda s: s["continuations"] == 0)):
        chosen = [s for s in steps if pick(s)]
        out[f"{kind}_steps"] = len(chosen)
        if not chosen:
            continue
        out[f"{kind}_wall_s"] = sum(s["wall_ms"] for s in chosen) / 1e3
        for key in ("rows", "tokens", "max_held", "wall_ms", "launch_ms", "thread_cpu_ms",
                    "prev_wait_ms", "own_wait_ms", "take_ms", "schedule_ms", "finish_ms",
                    "other_ms"):
            out[f"{kind}_{key}_median"] = statistics.median(s[key] for s in chosen)
    return out


def one_look(s: dict, kind: str = "continuation") -> str:
    """One line: where a median prefill step of `kind` goes (step_summary's medians)."""
    if not s.get(f"{kind}_steps"):
        return f"no {kind} prefill steps"
    m = lambda key: s[f"{kind}_{key}_median"]  # noqa: E731
    return (f"{s[f'{kind}_steps']} {kind} prefill steps ({s[f'{kind}_wall_s']:.2f} s), median "
            f"{m('rows'):.0f} rows / {m('tokens'):.0f} tokens: {m('wall_ms'):.1f} ms: launch "
            f"{m('launch_ms'):.1f} + wait for the step before {m('prev_wait_ms'):.1f} + take in "
            f"{m('take_ms'):.1f} + schedule {m('schedule_ms'):.1f} + finish "
            f"{m('finish_ms'):.1f} + other {m('other_ms'):.1f} "
            f"(medians, not additive); thread CPU {m('thread_cpu_ms'):.1f} ms; its own GPU wait "
            f"after {m('own_wait_ms'):.1f} ms")


def python_profile_text(prof: cProfile.Profile, top: int = 45) -> str:
    """The prefill launches' Python functions: by cumulative time, then by own time."""
    buf = io.StringIO()
    stats = pstats.Stats(prof, stream=buf).strip_dirs()
    for key in ("cumulative", "tottime"):
        buf.write(f"== prefill launches, by {key} ==\n")
        stats.sort_stats(key).print_stats(top)
    return buf.getvalue()


def profiled(loop, fn, out_dir, cuda: bool):
    """fn() under torch.profiler started and stopped on the engine thread; writes the tables
    (multiturn_profile.write_tables) into out_dir and returns (fn's result, their summary)."""
    from torch.profiler import ProfilerActivity, profile

    from benchmarks.engine.multiturn_profile import write_tables

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    prof = profile(activities=acts)
    loop.call(prof.start)
    try:
        result = fn()
    finally:
        loop.call(prof.stop)
    return result, write_tables(prof, out_dir)
