"""``python -m trainer.startup.torchrun [torchrun's flags] -m trainer.train ...``: torchrun, quiet on Ctrl-C.

torchrun itself answers SIGINT / SIGTERM by forwarding the signal to every worker and then dying
of it: two warnings per worker and a 30-line traceback of its own agent, after the trainer's line
saying what was interrupted and how to resume. This runs the same launcher (same flags, same
rendezvous) in this process and ends it with the signal's exit code (130, 143) and no traceback;
a job whose first failed worker ended on a signal (it printed its line) ends with that
worker's code, not torchrun's ``ChildFailedError`` banner. Any other failure is torchrun's own report, unchanged.
"""

from __future__ import annotations

import logging
import sys

from . import interrupt

SIGNAL_EXIT_CODES = (130, 143)  # a worker that ended on SIGINT / SIGTERM (train.py's exit)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    interrupt.set_command(["python", "-m", "trainer.startup.torchrun", *argv])
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun_main

    # "Received 2 death signal, shutting down workers", "Sending process N closing signal"
    for name in list(logging.root.manager.loggerDict):  # each sets its own level
        if name.startswith("torch.distributed.elastic"):
            logging.getLogger(name).setLevel(logging.ERROR)
    try:
        torchrun_main(argv)
    except SignalException as e:  # the workers got it too (forwarded) and printed the line
        return 128 + int(e.sigval)
    except ChildFailedError as e:  # a worker got the signal (not torchrun) and said so
        _, first = e.get_first_failure()
        if first.exitcode in SIGNAL_EXIT_CODES:
            return first.exitcode
        raise
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
