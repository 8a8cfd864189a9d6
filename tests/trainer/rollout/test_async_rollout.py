"""The generation thread and the weight gate: the staleness bound, pushes that wait for (or
interrupt) generation, errors handed to the training thread."""

from __future__ import annotations

import threading
import time

import pytest

from trainer.rollout.async_rollout import AsyncRollouts, WeightGate


def _loop(bound: int, steps: int, train_seconds: float = 0.05):
    """A training loop over a producer that records the engines' version at each start."""
    gate, started = WeightGate(0, bound), {}

    def generate(r):
        started[r] = gate.version
        return f"rollout {r}"

    producer = AsyncRollouts(generate, gate, range(steps)).start()
    trained = []
    for r in range(steps):
        trained.append(producer.get(r))
        time.sleep(train_seconds)  # training: the producer may run ahead meanwhile
        with gate.update(r + 1):
            pass
    producer.close()
    return started, trained


@pytest.mark.parametrize("bound", [0, 1, 2])
def test_rollout_r_starts_under_version_r_minus_bound_at_the_oldest(bound):
    started, trained = _loop(bound, 6)
    assert trained == [f"rollout {r}" for r in range(6)]
    for r, version in started.items():
        assert r - bound <= version <= r
    if bound == 0:  # the synchronous schedule: every rollout under the weights it trains
        assert all(v == r for r, v in started.items())
    else:  # training is slow here, so the producer runs as far ahead as the bound allows
        assert all(v == max(0, r - bound) for r, v in started.items())


def test_push_waits_for_the_rollout_in_flight_without_partial_rollouts():
    gate, events = WeightGate(0, 1), []
    release = threading.Event()

    def generate(r):
        events.append(f"start {r}")
        release.wait(5)
        events.append(f"end {r}")
        return r

    producer = AsyncRollouts(generate, gate, range(1)).start()
    time.sleep(0.1)
    threading.Timer(0.2, release.set).start()
    with gate.update(1):
        events.append("push")
    assert events == ["start 0", "end 0", "push"]
    assert producer.get(0) == 0 and gate.interruptions == 0
    producer.close()


def test_push_interrupts_with_partial_rollouts():
    aborted = threading.Event()
    gate = WeightGate(0, 1, interrupt=aborted.set)
    versions = []

    def generate(r):
        with gate.engine_use():
            aborted.wait(5)  # the engine's requests end when aborted ...
        with gate.engine_use():  # ... and are continued once the push is done
            versions.append(gate.version)
        return r

    producer = AsyncRollouts(generate, gate, range(1)).start()
    time.sleep(0.1)
    with gate.update(1):
        assert aborted.is_set()
    assert producer.get(0) == 0 and versions == [1] and gate.interruptions == 1
    producer.close()


def test_generation_errors_reach_the_training_thread():
    def generate(r):
        raise ValueError("engine gone")

    producer = AsyncRollouts(generate, WeightGate(0, 1), range(2)).start()
    with pytest.raises(RuntimeError, match="generating rollout 0 failed: engine gone"):
        producer.get(0)
    producer.close()


@pytest.mark.parametrize("gate,engine,holds", [(True, True, True), (False, True, False),
                                               (True, False, False)],
                         ids=["async-in-process", "sync", "async-remote"])
def test_training_thread_holds_the_capture_gate_with_an_in_process_async_engine(gate, engine, holds):
    """Async with the engine in this process: the training thread's GPU work (recompute, update,
    push, save) holds sglang-kvc's CAPTURE_GATE, so the engine thread never captures a decode
    graph meanwhile (a device sync during a capture fails both). Synchronous runs and remote
    engines never overlap a capture in this process and take nothing."""
    from sglang_kvc.engine.cuda_graph import CAPTURE_GATE
    from trainer.rollout.engines.inprocess import device_work

    with device_work(asynchronous=gate, engine=object() if engine else None):
        free = CAPTURE_GATE.try_capture()
        if free:
            CAPTURE_GATE.end_capture()
    assert free != holds
