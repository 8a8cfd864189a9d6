"""Calls as JSON between tags, the format of Qwen2.5's, Qwen3's and Hermes' chat templates:

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "37 * 91"}}
    </tool_call>
"""

from __future__ import annotations

import dataclasses
import json

from .body import parse_body
from .call import ToolCall


def _pending_prefix(text: str, marker: str) -> int:
    """How many characters at the end of ``text`` could be the start of ``marker``."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-k:]):
            return k
    return 0


@dataclasses.dataclass(frozen=True)
class TaggedFormat:
    name: str
    open_tag: str = "<tool_call>"
    close_tag: str = "</tool_call>"

    def opening(self, text: str, pos: int, _first: bool) -> tuple[int, int] | None:
        i = text.find(self.open_tag, pos)
        return None if i < 0 else (i, i + len(self.open_tag))

    def closing(self, text: str, body_start: int) -> tuple[int, int] | None:
        j = text.find(self.close_tag, body_start)
        return None if j < 0 else (j, j + len(self.close_tag))

    def pending(self, text: str, pos: int, _first: bool) -> int:
        return _pending_prefix(text[pos:], self.open_tag)

    def parse(self, body: str) -> ToolCall:
        return parse_body(body)

    def unclosed(self) -> ToolCall:
        return ToolCall(None, {}, f"the tool call is not closed with {self.close_tag}")

    def prefill(self, name: str | None) -> str:
        """The opening a forced call starts with (a named one: up to its arguments)."""
        head = f"{self.open_tag}\n" + '{"name": "'
        return head if name is None else head + f'{_escaped(name)}", "arguments": '

    def render(self, name: str, arguments: dict) -> str:
        """A call as the model writes it (for chat templates that do not render tool_calls)."""
        call = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
        return f"{self.open_tag}\n{call}\n{self.close_tag}"


def _escaped(name: str) -> str:
    return json.dumps(name, ensure_ascii=False)[1:-1]
