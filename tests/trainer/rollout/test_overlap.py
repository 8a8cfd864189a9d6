"""Issue 68: with one step off-policy (``--max-staleness 1``) rollout n+1 generates while update n
runs, shown by construction: each update waits, inside the training thread's device work, for
the next rollout to have started (a synchronous schedule would never start it and the wait would
fail); the batch trained at step n+1 carries staleness 1. A colocated in-process engine that
releases its KV pool while training keeps the synchronous schedule and says so."""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from types import SimpleNamespace

import pytest

from trainer.rollout.async_rollout import AsyncConfig, WeightGate, memory_safe
from trainer.rollout.engines.config import EngineConfig
from trainer.rollout.engines.interface import Generation
from trainer.rollout.source import AsyncRolloutSource

STEPS = 4


class Engines:
    def device_work(self, asynchronous: bool):
        return contextlib.nullcontext()


class Sync:
    def __init__(self, gate: WeightGate, log: list):
        self.gate, self.log = gate, log

    def push(self, trainer, version: str) -> dict:
        self.log.append(f"push {version}")
        return {}


def _run(bound: int):
    """The loop's calls on the source, as trainer/train.py makes them; what happened, in order."""
    log, started = [], {r: threading.Event() for r in range(STEPS + 1)}
    gate = WeightGate(0, bound)
    manager = SimpleNamespace(engines=Engines(), version=None)

    def generate(r):
        started[r].set()
        log.append(f"start rollout {r} under rollout-{gate.version}")
        gen = Generation([1, 2], [-0.1, -0.2], "", "stop", f"rollout-{gate.version}", {})
        return [f"prompt {r}"], SimpleNamespace(gens=[gen], shards=[SimpleNamespace(seconds=1.0)]), {}

    source = AsyncRolloutSource(manager, Sync(gate, log), generate, gate, 0, STEPS)
    stale = {}
    try:
        for n in range(STEPS):
            _, result, _ = source.get(n)
            stale[n] = source.staleness(result, n)["rollout/staleness_max"]
            with source.device_work():
                log.append(f"update {n} begins")
                if n + 1 < STEPS:
                    # the update ends only once rollout n+1 has begun; the timeout only bounds a
                    # failing (synchronous) schedule
                    assert started[n + 1].wait(timeout=30), f"rollout {n + 1} never started"
                log.append(f"update {n} ends")
            source.push(None, f"rollout-{n + 1}")
    finally:
        source.close()
    return log, stale


def test_rollout_n_plus_1_generates_while_update_n_runs():
    log, stale = _run(bound=1)
    for n in range(STEPS - 1):
        ends = log.index(f"update {n} ends")
        start = next(i for i, e in enumerate(log) if e.startswith(f"start rollout {n + 1} "))
        assert start < ends, log  # before update n ends (it may start before update n begins)
        assert log[start] == f"start rollout {n + 1} under rollout-{n}", log  # one version behind
        assert log.index(f"push rollout-{n + 1}") > start, log
    assert stale == {0: 0.0, 1: 1.0, 2: 1.0, 3: 1.0}


def _engines(**kw) -> EngineConfig:
    return EngineConfig(model_path="m", engine_flags={}, **kw)


@pytest.mark.parametrize("place, overlaps", [
    (dict(offload=True), False),  # colocated, the pool released while training
    (dict(offload=False), True),  # colocated, the pool kept (memory split up front)
    (dict(offload=True, engine_process=True), True),
    (dict(offload=True, server_urls=["http://s"]), True),
    (dict(offload=True, num_gpus=1), True),
])
def test_the_overlap_each_placement_affords(place, overlaps, capsys):
    cfg = memory_safe(AsyncConfig(max_staleness=1), _engines(**place))
    assert cfg == AsyncConfig(max_staleness=1 if overlaps else 0)
    said = capsys.readouterr().out
    assert ("rollouts stay synchronous" in said) == (not overlaps)
    assert memory_safe(AsyncConfig(), _engines(**place)) == AsyncConfig()  # synchronous run
    assert dataclasses.replace(cfg, partial_rollout=True).max_staleness == cfg.max_staleness
