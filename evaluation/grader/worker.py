"""Entry point of one grader worker process (started by :class:`evaluation.grader.GraderPool`).

Protocol over two inherited pipe descriptors: the parent first sends the ``GradeOptions``; the
worker imports the grader (sympy, latex2sympy2) and answers ``"ready"``; then each message, a
list of ``(index, pred, gold)``, is answered item by item with ``(index, GradeResult)``; ``None`` stops the worker.
"""

from __future__ import annotations

import signal
import sys
from multiprocessing.connection import Connection


def main(argv: list[str]) -> int:
    # Ctrl-C is the parent's to handle (it stops the pool): a worker that took the terminal's
    # SIGINT too would print its own KeyboardInterrupt traceback beside the parent's one line.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if len(argv) != 2:
        print("usage: python -m evaluation.grader.worker READ_FD WRITE_FD "
              "(started by evaluation.grader.GraderPool, not by hand)", file=sys.stderr)
        return 2
    recv = Connection(int(argv[0]), writable=False)
    send = Connection(int(argv[1]), readable=False)
    options = recv.recv()
    from evaluation.grader.pool import grade_one
    from evaluation.grader.symbolic import _latex2sympy

    try:
        _latex2sympy("1")  # warm the ANTLR parser before reporting ready
    except Exception:  # noqa: BLE001 - a grader without LaTeX parsing still grades
        pass
    send.send("ready")
    while True:
        try:
            task = recv.recv()
        except (EOFError, OSError):
            return 0
        if task is None:
            return 0
        for index, pred, gold in task:
            send.send((index, grade_one(pred, gold, options)))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
