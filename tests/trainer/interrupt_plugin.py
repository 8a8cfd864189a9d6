"""A reward for interrupt tests (``--custom-rm-path tests/trainer/interrupt_plugin.py:reward``):
deterministic, and, as ``INTERRUPT_AT`` says, it sends SIGINT to the run's process group the way
a terminal's Ctrl-C does (to torchrun under torchrun): ``rollout:N`` while scoring rollout N, ``save:N`` in the middle of the
N-th save (the model written, the optimizer and the tracker not yet). Rank 0 only."""

from __future__ import annotations

import os
import signal
import time

_calls = {"reward": 0, "save": 0}
SAMPLES_PER_ROLLOUT = int(os.environ.get("INTERRUPT_SAMPLES_PER_ROLLOUT", "16"))


def _at() -> tuple[str, int] | None:
    spec = os.environ.get("INTERRUPT_AT", "")
    if not spec or os.environ.get("RANK", "0") != "0":
        return None
    what, n = spec.split(":")
    return what, int(n)


def _ctrl_c() -> None:
    """Ctrl-C reaches torchrun (its workers run in sessions of their own), which forwards it to
    every worker; a plain run gets it in its own process group. Then wait here for it: the
    interrupt strikes exactly at this point."""
    if "TORCHELASTIC_RUN_ID" in os.environ:
        os.kill(os.getppid(), signal.SIGINT)
    else:
        os.killpg(os.getpgrp(), signal.SIGINT)
    time.sleep(60)


def reward(sample) -> float:
    """1 when the response holds the label, else 0 (the same in every run)."""
    _calls["reward"] += 1
    if _at() == ("rollout", (_calls["reward"] - 1) // SAMPLES_PER_ROLLOUT + 1):
        _ctrl_c()
    return float(str(sample.label) in sample.response)


def _patch_save() -> None:
    from trainer.learner import checkpoint

    write_optimizer = checkpoint._optimizer_state

    def optimizer_state(optimizer):  # between the model's files and the optimizer's
        _calls["save"] += 1
        if _at() == ("save", _calls["save"]):
            _ctrl_c()
        return write_optimizer(optimizer)

    checkpoint._optimizer_state = optimizer_state


_patch_save()
