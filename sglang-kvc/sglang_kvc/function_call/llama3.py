"""Llama 3.x's JSON tool calls: a JSON object ``{"name": ..., "parameters": {...}}`` (or
``"arguments"``), the whole answer or after ``<|python_tag|>``; several are separated by ``;``.
A leading object that is not a call stays text."""

from __future__ import annotations

import dataclasses
import json

from .body import parse_body
from .call import ToolCall
from .json_scan import object_end
from .tagged import _escaped, _pending_prefix

PYTHON_TAG = "<|python_tag|>"


def _skip(text: str, pos: int, chars: str) -> int:
    while pos < len(text) and text[pos] in chars:
        pos += 1
    return pos


@dataclasses.dataclass(frozen=True)
class Llama3Format:
    name: str = "llama3"

    def opening(self, text: str, pos: int, first: bool) -> tuple[int, int] | None:
        """A call opens at the start of the answer or right after another call (past ``;``),
        with or without ``<|python_tag|>``; a tag later in the text opens one too."""
        if not first:
            return None
        j = _skip(text, pos, " \t\r\n;")
        if text.startswith(PYTHON_TAG, j):
            return pos, j + len(PYTHON_TAG)
        if text[j:j + 1] == "{":
            return pos, j
        i = text.find(PYTHON_TAG, pos) if pos == 0 else -1
        return None if i < 0 else (i, i + len(PYTHON_TAG))

    def closing(self, text: str, body_start: int) -> tuple[int, int] | None:
        j = _skip(text, body_start, " \t\r\n")
        if j == len(text):
            return None
        if text[j] != "{":  # not JSON: the rest is text (the call is malformed)
            return len(text), len(text)
        end = object_end(text, j)
        return None if end is None else (end, end)

    def pending(self, text: str, pos: int, first: bool) -> int:
        rest = text[pos:]
        if first and _skip(rest, 0, " \t\r\n;") == len(rest):
            return len(rest)  # only blanks so far: a call may still open
        return _pending_prefix(rest, PYTHON_TAG)

    def parse(self, body: str) -> ToolCall:
        return parse_body(body, ("parameters", "arguments"))

    def unclosed(self) -> ToolCall:
        return ToolCall(None, {}, "the tool call's JSON object is not closed")

    def prefill(self, name: str | None) -> str:
        head = '{"name": "'
        return head if name is None else head + f'{_escaped(name)}", "parameters": '

    def render(self, name: str, arguments: dict) -> str:
        return json.dumps({"name": name, "parameters": arguments}, ensure_ascii=False)
