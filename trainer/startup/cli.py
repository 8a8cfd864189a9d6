"""``python -m trainer.train`` as a command: the flags parsed (early, before torch, for
``--help`` and flag errors), the parallel launch around the run, and what a user sees when it
ends: exit 0, one ``error:`` line (exit 1 for a wrong launch, 2 for wrong input), or
after Ctrl-C / SIGTERM the line that says where the run stands and the command that resumes it.

    if __name__ == "__main__":
        PARSED = parse_early()                   # before the heavy imports of trainer/train.py
    ...
    command = Command(argv, PARSED)              # trainer/train.py's main
    with command:
        train(run_config_from_args(command.start()), restart_hook)
    interrupt.exit(command.exit_code)
"""

from __future__ import annotations

import argparse
import os
import sys
import threading

from ..arguments import parse_args
from . import interrupt

ENTRY = "trainer.train"


def parse_early() -> argparse.Namespace:
    """The flags of ``python -m trainer.train``, parsed before torch, Megatron and the engine
    are imported: ``--help`` and a wrong flag answer at once."""
    interrupt.install()
    return parse_args(sys.argv[1:], prog=interrupt.prog(f"python -m {ENTRY}"))


class Command:
    """The command around one run: interrupts installed, the flags parsed (unless given), the
    parallel launch, and at the end the exit code and what the user reads:

        command = Command(argv, parsed)
        with command:
            train(run_config_from_args(command.start()), restart_hook)
        return command.exit_code
    """

    def __init__(self, argv=None, parsed: argparse.Namespace | None = None):
        self.argv = list(sys.argv[1:] if argv is None else argv)
        self.args, self.exit_code, self.launched = parsed, 0, False

    def __enter__(self) -> "Command":
        if threading.current_thread() is threading.main_thread():  # a Ray actor's may not be
            interrupt.install()
        return self

    def start(self) -> argparse.Namespace:
        """The flags, and this process in the parallel launch (torch and Megatron from here)."""
        from ..launch import init_parallel, parallel_config_from_args

        self.args = self.args or parse_args(self.argv, prog=interrupt.prog(f"python -m {ENTRY}"))
        init_parallel(parallel_config_from_args(self.args))
        self.launched = True
        return self.args

    def __exit__(self, kind, error, trace) -> bool:
        try:
            handled = error is None or self._message(error)
        finally:
            if self.launched:
                from ..launch import teardown

                teardown()
        return handled or self._interrupted(error)

    def _message(self, error: BaseException) -> bool:
        """A wrong launch (exit 1) or wrong input (exit 2) as one ``error:`` line."""
        if not isinstance(error, Exception):  # exit, Ctrl-C: not a message
            return False
        # here, not at the top: trainer/train.py imports this module before its early parse,
        # and these bring torch and Megatron
        from checkpoint_tools.model_config import CheckpointError

        from ..launch import RendezvousError
        from ..rollout.samples.data import DataError
        from ..rollout.side import ROLLOUT_ERRORS

        if isinstance(error, RendezvousError):  # the launch itself is wrong: say where
            self.exit_code = 1
        elif isinstance(error, (DataError, CheckpointError, *ROLLOUT_ERRORS)):
            self.exit_code = 2
        else:
            return False
        print(f"{_prog()}: error: {error}", file=sys.stderr, flush=True)
        return True

    def _interrupted(self, error: BaseException) -> bool:
        """After a signal, whatever it broke ends quietly: where the run stands, how to go on."""
        if interrupt.received() is None or isinstance(error, SystemExit):
            return False
        save = self.args.save if self.args is not None else None
        interrupt.say(interrupt.report(save, _resume_command(self.argv)))
        self.exit_code = interrupt.exit_code()
        return True


def _resume_command(argv: list[str]) -> str:
    """The command that goes on from the last checkpoint: the one the user typed."""
    if "TORCHELASTIC_RUN_ID" in os.environ and not os.environ.get(interrupt.COMMAND_ENV):
        return "the same torchrun command"
    return interrupt.command([sys.executable.rsplit("/", 1)[-1], "-m", ENTRY, *argv])


def _prog() -> str:
    return interrupt.prog(ENTRY)
