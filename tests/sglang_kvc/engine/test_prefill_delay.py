"""--schedule-prefill-delay-steps (engine/scheduler.py `_prefill_due`): a small prefill waits up
to N decode steps for more arrivals while other requests decode; with nothing running, with N
steps waited, or with half a prefill batch of tokens waiting, it goes at once. The rule against
hand-set scheduler states, and the engine: requests that arrive while one decodes are prefilled
together once it ends (a delay longer than its run), with the same greedy tokens as without."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from sglang_kvc.engine.scheduler import Scheduler, SchedulerConfig


def _scheduler(delay: int, max_prefill_tokens: int = 100) -> Scheduler:
    return Scheduler(SchedulerConfig(8, max_prefill_tokens, prefill_delay_steps=delay), kv=None)


def _seq(tokens: int):
    return SimpleNamespace(num_tokens=tokens, num_computed=0)


@pytest.mark.parametrize("delay", [0, 4])
def test_prefill_due_by_hand(delay):
    s = _scheduler(delay)
    assert s._prefill_due()  # nothing waits
    s.running = [_seq(10)]
    s.decode_steps = 7
    s.add(_seq(5))  # arrives at decode step 7
    assert s._prefill_due() == (delay == 0)
    s.decode_steps = 7 + 3
    assert s._prefill_due() == (delay == 0)
    s.decode_steps = 7 + 4  # the oldest has waited 4 decode steps
    assert s._prefill_due()
    s.decode_steps = 8
    s.add(_seq(44))  # 5 + 44 = 49 < 50 = half a batch: still held
    assert s._prefill_due() == (delay == 0)
    s.add(_seq(1))  # 50 tokens wait: a half batch goes at once
    assert s._prefill_due()
    s.running = []  # nothing decodes: never held back
    s.waiting.clear()
    s.add(_seq(1))
    assert s._prefill_due()


def test_a_later_arrival_keeps_the_oldest_wait():
    s = _scheduler(4)
    s.running = [_seq(10)]
    s.decode_steps = 2
    s.add(_seq(1))
    s.decode_steps = 5
    s.add(_seq(1))  # the queue was not empty: the wait still counts from step 2
    s.decode_steps = 6
    assert s._prefill_due()


def test_negative_delay_is_refused():
    from sglang_kvc.server_args import ServerArgs

    with pytest.raises(ValueError, match="--schedule-prefill-delay-steps"):
        ServerArgs(model_path="x", schedule_prefill_delay_steps=-1)


GREEDY_LONG = {"temperature": 0.0, "ignore_eos": True, "max_new_tokens": 48}
GREEDY_SHORT = {"temperature": 0.0, "ignore_eos": True, "max_new_tokens": 4}
FIRST = list(range(3, 12))
LATE = [list(range(20, 27)), list(range(40, 45))]


def _run(path, delay: int):
    """A long request, then two short ones submitted once it decodes (the engine paused meanwhile):
    (tokens, prefill steps, decode steps taken while a prefill was held back)."""
    from sglang_kvc import Engine

    with Engine(model_path=path, device="cpu", dtype="float32", random_seed=0,
                schedule_prefill_delay_steps=delay) as eng:
        long = eng.submit_generate({"input_ids": FIRST, "sampling_params": GREEDY_LONG})
        deadline = time.monotonic() + 60
        while eng.step_stats.decode_steps < 2:
            assert time.monotonic() < deadline, "the long request never decoded"
            time.sleep(0.001)
        # paused, the late requests reach the queue while the long one is mid-run however slow
        # this machine is: the inbox is FIFO, so both are taken in before the continue
        eng.pause_generation()
        late = [eng.submit_generate({"input_ids": ids, "sampling_params": GREEDY_SHORT})[0]
                for ids in LATE]
        eng.continue_generation()
        outs = [f.result(timeout=120) for f in long + late]
        return ([o["output_ids"] for o in outs], eng.step_stats.prefill_steps,
                eng.scheduler.delayed_steps)


def test_late_arrivals_wait_for_the_running_request(tiny_model_factory):
    path = str(tiny_model_factory("qwen2.5"))
    plain_tokens, _, plain_delayed = _run(path, 0)
    tokens, prefills, delayed = _run(path, 10_000)
    assert tokens == plain_tokens  # the delay changes when, not what, a request computes
    assert plain_delayed == 0
    # one prefill for the long request, one for both late ones, after it ended
    assert prefills == 2 and delayed > 0
