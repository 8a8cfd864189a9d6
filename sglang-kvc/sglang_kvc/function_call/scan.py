"""The one walk over a model's text that every format shares: text pieces and calls, in order.

On a complete text (``final``) an unclosed call is malformed; on a text still being generated
it is a call in progress, and the characters that may begin a call are held back, so that a
stream never sends as content what turns out to be a call."""

from __future__ import annotations

from .call import Segment
from .json_scan import arguments_text, partial_arguments


def scan(fmt, text: str, final: bool = True) -> list[Segment]:
    segments: list[Segment] = []
    pos, first = 0, True
    while True:
        found = fmt.opening(text, pos, first)
        if found is None:
            keep = len(text) - pos if final else len(text) - pos - fmt.pending(text, pos, first)
            _add_text(segments, text[pos:pos + keep])
            return segments
        start, body_start = found
        _add_text(segments, text[pos:start])
        closed = fmt.closing(text, body_start)
        if closed is None:
            segments.append(_open_call(fmt, text, start, body_start, final))
            return segments
        body_end, end = closed
        segments.append(_closed_call(fmt, text[start:end], text[body_start:body_end]))
        pos, first = end, segments[-1].call.ok


def _add_text(segments: list[Segment], text: str) -> None:
    if text:
        segments.append(Segment(text))


def _closed_call(fmt, source: str, body: str) -> Segment:
    call = fmt.parse(body)
    args = arguments_text(body, call.arguments) if call.ok else ""
    return Segment(source, call, call.name, args)


def _open_call(fmt, text: str, start: int, body_start: int, final: bool) -> Segment:
    if final:
        return Segment(text[start:], fmt.unclosed())
    known = partial_arguments(text[body_start:])
    name, args = known if known is not None else (None, "")
    return Segment(text[start:], None, name, args, complete=False)


def calls(fmt, text: str) -> list:
    """Every call of a complete text, well-formed or not (the trainer's view)."""
    return [s.call for s in scan(fmt, text) if s.call is not None]
