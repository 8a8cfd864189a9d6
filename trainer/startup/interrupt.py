"""Ctrl-C and SIGTERM on a training run: one line on rank 0, no traceback, a non-zero exit.

    interrupt.install()                      # main thread, before the run starts
    with interrupt.doing("rollout 3 of 10"):   # what the line will say was interrupted
        ...
    except interrupt.Interrupted / after interrupt.received(): print(interrupt.report(...))

The first SIGINT or SIGTERM raises :class:`Interrupted` in the main thread, wherever it is (startup,
a rollout, a save). A launcher forwards the terminal's Ctrl-C a second time (torchrun sends its
own SIGINT to every worker the terminal already signalled), so a repeat within
``REPEAT_GRACE_S`` is ignored; one after it ends the process at once (a user pressing Ctrl-C again
on a stuck exit). Once interrupted, threads that die of it (engine threads, collectives whose peer
left) die silently, and the entry point prints :func:`report`: what was interrupted, the last
complete checkpoint and the command that resumes (the same command: ``--save`` resumes itself).

Entry points that wrap others (``scripts/*.sh``, ``trainer.quickstart``, ``trainer.ray_job``,
``trainer.startup.torchrun``) name themselves in ``SPARSE_RL_COMMAND`` (:func:`set_command`), so the line
and the trainer's flag errors show the command the user typed, not the inner ``trainer.train``.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import sys
import threading
import time
from pathlib import Path

COMMAND_ENV = "SPARSE_RL_COMMAND"  # the command the user typed, set by the outermost entry point
REPEAT_GRACE_S = 3.0
SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(BaseException):
    """SIGINT / SIGTERM (a BaseException, so ``except Exception`` in the loop lets it through)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum  # the shell's convention: 130 for SIGINT, 143 for SIGTERM


_state = {"signum": None, "at": 0.0, "doing": "startup"}


def install() -> None:
    """Handle SIGINT and SIGTERM in this (main) thread from now on."""
    for sig in SIGNALS:
        signal.signal(sig, _handler)


def _handler(signum, frame) -> None:
    if _state["signum"] is not None:
        if time.monotonic() - _state["at"] > REPEAT_GRACE_S:  # again, later: stop waiting
            os._exit(128 + signum)
        return
    _state.update(signum=signum, at=time.monotonic())
    threading.excepthook = _quiet_thread_death
    raise Interrupted(signum)


def _quiet_thread_death(args) -> None:
    """After an interrupt, threads that fail because of it do so without a traceback."""


def received() -> int | None:
    """The signal this process got, or None."""
    return _state["signum"]


def exit_code() -> int:
    return 128 + (_state["signum"] or signal.SIGINT)


@contextlib.contextmanager
def doing(what: str):
    """Name what the run is doing, for the line an interrupt prints."""
    before, _state["doing"] = _state["doing"], what
    try:
        yield
    finally:
        if _state["signum"] is None:  # an interrupt keeps naming where it struck
            _state["doing"] = before


def set_command(default: list[str]) -> str:
    """The command the user typed: ``SPARSE_RL_COMMAND`` when an outer entry point set it, else
    ``default`` (this entry point's own), which is then exported for the ones it runs."""
    if not os.environ.get(COMMAND_ENV):
        os.environ[COMMAND_ENV] = shlex.join(default)
    return os.environ[COMMAND_ENV]


def command(default: list[str]) -> str:
    """``SPARSE_RL_COMMAND``, or ``default`` when no entry point set it."""
    return os.environ.get(COMMAND_ENV) or shlex.join(default)


def prog(default: str) -> str:
    """How error messages name the command: the typed command's program (``quickstart.sh``,
    ``python -m trainer.quickstart``), or ``default``."""
    words = shlex.split(os.environ.get(COMMAND_ENV, ""))
    if not words:
        return default
    if len(words) > 2 and words[1] == "-m":
        return f"python -m {words[2]}"
    return Path(words[0]).name


def last_checkpoint(save_dir: str | Path | None) -> str:
    """The last complete checkpoint under ``save_dir``, in words."""
    from checkpoint_tools.torch_dist import iteration_dir_name, read_tracker

    if save_dir is None:
        return "no --save, so no checkpoint"
    it = read_tracker(save_dir)
    if it is None:
        return f"no complete checkpoint in {save_dir} yet"
    return f"the last complete checkpoint is iteration {it} ({Path(save_dir) / iteration_dir_name(it)})"


def report(save_dir: str | Path | None, resume_command: str) -> str:
    """The one line: what was interrupted, the last complete checkpoint, how to go on."""
    name = signal.Signals(_state["signum"] or signal.SIGINT).name
    resumable = save_dir is not None and _tracker(save_dir) is not None
    how = "to resume from it" if resumable else "to start over"
    return (f"{prog('python -m trainer.train')}: interrupted ({name}) during {_state['doing']}; "
            f"{last_checkpoint(save_dir)}; rerun the same command {how}: {resume_command}")


def _tracker(save_dir):
    from checkpoint_tools.torch_dist import read_tracker

    return read_tracker(save_dir)


def say(line: str) -> None:
    """``line`` on stderr, on rank 0 only (every rank got the signal)."""
    if os.environ.get("RANK", "0") == "0":
        print(line, file=sys.stderr, flush=True)


def exit(code: int) -> None:  # noqa: A001 - the entry points' ``raise SystemExit`` after a signal
    """End the process with ``code``. After an interrupt, without waiting for the threads it left
    behind (joining them would hang or print); the run's own cleanup ran in its ``finally``."""
    if received() is not None:
        _stop_children()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    raise SystemExit(code)


def _stop_children() -> None:
    """multiprocessing's children end with this process: ``os._exit`` skips the atexit hook that
    stops them (Megatron's checkpoint writer keeps a Manager process, which would outlive the
    run and hold its output pipe open)."""
    import multiprocessing

    children = multiprocessing.active_children()
    for child in children:
        child.terminate()
    for child in children:
        child.join(timeout=5)
