"""``python -m trainer.train`` as a command: the flags parsed (early, before torch, for
``--help`` and flag errors), the parallel launch, the engine processes, the loop, and what a user
sees when it ends: exit 0, one ``error:`` line (exit 1 for a wrong launch, 2 for wrong input), or
after Ctrl-C / SIGTERM the line that says where the run stands and the command that resumes it.

    if __name__ == "__main__":
        PARSED = parse_early()                   # before the heavy imports of trainer/train.py
    ...
    interrupt.exit(main(train, parsed=PARSED))   # train(cfg, restart_hook): the loop
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from typing import Callable

from ..arguments import parse_args
from . import interrupt

ENTRY = "trainer.train"


def parse_early() -> argparse.Namespace:
    """The flags of ``python -m trainer.train``, parsed before torch, Megatron and the engine
    are imported: ``--help`` and a wrong flag answer at once."""
    interrupt.install()
    return parse_args(sys.argv[1:], prog=interrupt.prog(f"python -m {ENTRY}"))


def main(train: Callable, argv=None, restart_hook=None,
         parsed: argparse.Namespace | None = None) -> int:
    """Run ``train(cfg, restart_hook)`` for ``argv``; ``parsed``: ``argv`` already parsed."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if threading.current_thread() is threading.main_thread():  # a Ray actor's may not be
        interrupt.install()
    args = parsed
    try:
        args = args or parse_args(argv, prog=interrupt.prog(f"python -m {ENTRY}"))
        return _run(train, args, restart_hook)
    except BaseException as e:  # noqa: BLE001 - after a signal, whatever it broke ends quietly
        if interrupt.received() is None or isinstance(e, SystemExit):
            raise
        save = args.save if args is not None else None
        interrupt.say(interrupt.report(save, _resume_command(argv)))
        return interrupt.exit_code()


def _resume_command(argv: list[str]) -> str:
    """The command that goes on from the last checkpoint: the one the user typed."""
    if "TORCHELASTIC_RUN_ID" in os.environ and not os.environ.get(interrupt.COMMAND_ENV):
        return "the same torchrun command"
    return interrupt.command([sys.executable.rsplit("/", 1)[-1], "-m", ENTRY, *argv])


def _run(train: Callable, args: argparse.Namespace, restart_hook) -> int:
    # here, not at the top: trainer/train.py imports this module before its early parse, and
    # these bring torch and Megatron
    from checkpoint_tools.model_config import CheckpointError

    from ..launch import RendezvousError, init_parallel, parallel_config_from_args, teardown
    from ..rollout.assembly import ROLLOUT_ERRORS
    from ..rollout.samples.data import DataError
    from ..run_config import run_config_from_args, with_engine_processes

    try:
        init_parallel(parallel_config_from_args(args))
    except RendezvousError as e:  # the launch itself is wrong: say where, do not hang
        print(f"{_prog()}: error: {e}", file=sys.stderr, flush=True)
        return 1
    launched = None
    try:
        launched, cfg = with_engine_processes(run_config_from_args(args))
        train(cfg, launched.restart_hook(restart_hook))
    except (DataError, CheckpointError, *ROLLOUT_ERRORS) as e:  # a message
        print(f"{_prog()}: error: {e}", file=sys.stderr)
        return 2
    finally:
        if launched is not None:
            launched.stop()
        teardown()
    return 0


def _prog() -> str:
    return interrupt.prog(ENTRY)
