"""The generation thread and the weight gate: the staleness bound, pushes that wait for (or
interrupt) generation, errors handed to the training thread."""

from __future__ import annotations

import threading
import time

import pytest

from trainer.rollout.async_rollout import AsyncRollouts, WeightGate


def _wait_until(cond, timeout: float = 30.0) -> None:
    """Poll `cond`; the timeout only bounds a failing test."""
    deadline = time.time() + timeout
    while not cond():
        assert time.time() < deadline, "the generation thread never got there"
        time.sleep(0.005)


def _loop(bound: int, steps: int):
    """A training loop over a producer that records the engines' version at each start.
    Training lasts until the producer has started every rollout the bound allows (it would
    hang, and fail, if the producer did not run ahead), not a fixed time a slow machine outlasts."""
    gate, started = WeightGate(0, bound), {}

    def generate(r):
        started[r] = gate.version
        return f"rollout {r}"

    producer = AsyncRollouts(generate, gate, range(steps)).start()
    trained = []
    for r in range(steps):
        trained.append(producer.get(r))
        _wait_until(lambda: max(started) >= min(r + bound, steps - 1))  # training
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
    else:  # training outlasts generation here, so the producer runs as far ahead as allowed
        assert all(v == max(0, r - bound) for r, v in started.items())


def test_push_waits_for_the_rollout_in_flight_without_partial_rollouts():
    gate, events = WeightGate(0, 1), []
    started, release = threading.Event(), threading.Event()

    def generate(r):
        events.append(f"start {r}")
        started.set()
        release.wait(30)
        events.append(f"end {r}")
        return r

    producer = AsyncRollouts(generate, gate, range(1)).start()
    assert started.wait(30)  # the rollout is in flight
    threading.Timer(0.2, release.set).start()
    with gate.update(1):
        events.append("push")
    assert events == ["start 0", "end 0", "push"]
    assert producer.get(0) == 0 and gate.interruptions == 0
    producer.close()


def test_push_interrupts_with_partial_rollouts():
    aborted, in_flight = threading.Event(), threading.Event()
    gate = WeightGate(0, 1, interrupt=aborted.set)
    versions = []

    def generate(r):
        with gate.engine_use():
            in_flight.set()
            aborted.wait(30)  # the engine's requests end when aborted ...
        with gate.engine_use():  # ... and are continued once the push is done
            versions.append(gate.version)
        return r

    producer = AsyncRollouts(generate, gate, range(1)).start()
    assert in_flight.wait(30)
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
