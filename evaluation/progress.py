"""Progress bars that suit where they are written: tqdm's bar on a terminal; in a log file (or a
pipe), one plain line per redraw, at most every ``PLAIN_EVERY_S`` seconds, with no carriage
returns or cursor codes (a quickstart log held 154 lines of them).

    for item in progress_bar(items, desc="grading", unit="pair"): ...

Here, not in the trainer, because the grader, the evaluation and the trainer all draw bars and
the trainer may import evaluation (not the other way round).
"""

from __future__ import annotations

import io
import re
import sys

from tqdm import tqdm

PLAIN_EVERY_S = 30.0  # a log line per bar at most this often (a refresh the caller asks for, more)
PLAIN_FORMAT = "{desc}: {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}{postfix}]"
_CONTROL = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")  # cursor moves, line clears


class PlainLines(io.TextIOBase):
    """A stream for tqdm off a terminal: each status it draws (tqdm flushes after each) becomes
    one line; cursor codes, padding and blank redraws are dropped."""

    def __init__(self, out):
        self.out, self.pending, self.last = out, "", None

    def write(self, s: str) -> int:
        *done, self.pending = re.split(r"[\r\n]", self.pending + _CONTROL.sub("", s))
        for line in done:
            self._emit(line.strip())
        return len(s)

    def flush(self) -> None:
        self._emit(self.pending.strip())
        self.pending = ""
        self.out.flush()

    def _emit(self, line: str) -> None:
        if line and line != self.last:
            self.out.write(line + "\n")
            self.last = line


class PlainBar(tqdm):
    """tqdm off a terminal: a postfix set between lines shows in the next one (a redraw per
    call would repeat the line, with a count that lags while iterating)."""

    def set_postfix(self, ordered_dict=None, refresh=True, **kwargs):
        super().set_postfix(ordered_dict, refresh=False, **kwargs)


def is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # replaced or closed streams
        return False


def progress_bar(*args, **kwargs) -> tqdm:
    """``tqdm(*args, **kwargs)`` on a terminal; plain lines elsewhere (see the module)."""
    stream = kwargs.pop("file", None) or sys.stderr
    if is_terminal(stream):
        return tqdm(*args, file=stream, **kwargs)
    if kwargs.get("leave") is False:  # a transient bar: nothing worth a line in a log
        kwargs["disable"] = True
    kwargs["mininterval"] = max(kwargs.get("mininterval", 0.1), PLAIN_EVERY_S)
    kwargs.setdefault("bar_format", PLAIN_FORMAT)
    return PlainBar(*args, file=PlainLines(stream), **kwargs)


def write(line: str) -> None:
    """A line on stdout that does not land inside a bar being drawn (``tqdm.write``)."""
    tqdm.write(line, file=sys.stdout)
    sys.stdout.flush()
