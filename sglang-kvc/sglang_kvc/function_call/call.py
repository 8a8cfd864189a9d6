"""What parsing a model's text yields: the calls, and the text around them."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class ToolCall:
    name: str | None
    arguments: dict
    error: str | None = None  # why the call is malformed (None: well-formed)

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclasses.dataclass
class Segment:
    """One piece of a scanned text: plain text (``call`` None) or a call with its source.

    A call still being generated has ``complete`` False; ``name`` and ``arguments_text`` are
    what is known of it so far (for streaming). A complete, well-formed call's
    ``arguments_text`` is the arguments as a JSON string: the model's own text for them when
    that is one JSON object, else their JSON dump."""

    text: str  # the source text of this piece
    call: ToolCall | None = None
    name: str | None = None
    arguments_text: str = ""
    complete: bool = True
