"""Tool calls in a model turn: ``--tool-parser`` (a name below or ``pkg.module:func``).

A parser takes the turn's text and returns its ``ToolCall``s: every call it found, each either
well-formed (a name and a dict of arguments) or carrying the reason it is not (``error``), so a
malformed call becomes an error observation for the model, never an exception in the loop.

The default, ``qwen25``, reads Qwen2.5's (and Hermes') format, as its chat template asks for:

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "37 * 91"}}
    </tool_call>
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Callable

from ..samples.plugins import load_dotted

FLAG = "--tool-parser"


@dataclasses.dataclass
class ToolCall:
    name: str | None
    arguments: dict
    error: str | None = None  # why the call is malformed (None: well-formed)

    @property
    def ok(self) -> bool:
        return self.error is None


_QWEN = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.DOTALL)


def qwen25(text: str) -> list[ToolCall]:
    """Every ``<tool_call>{json}</tool_call>`` of ``text``, in order (an unclosed last one is
    malformed)."""
    return [_qwen_call(body, closed) for body, closed in _QWEN.findall(text)]


def _qwen_call(body: str, closed: str) -> ToolCall:
    if not closed:
        return ToolCall(None, {}, "the tool call is not closed with </tool_call>")
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as e:
        return ToolCall(None, {}, f"the tool call is not valid JSON ({e.msg})")
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return ToolCall(None, {}, 'a tool call is {"name": ..., "arguments": {...}}')
    args = obj.get("arguments", {})
    if isinstance(args, str):  # some models send the arguments as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            pass
    if not isinstance(args, dict):
        return ToolCall(obj["name"], {}, "the tool call's arguments must be a JSON object")
    return ToolCall(obj["name"], args)


PARSERS: dict[str, Callable[[str], list[ToolCall]]] = {"qwen25": qwen25, "hermes": qwen25}


def load_parser(spec: str) -> Callable[[str], list[ToolCall]]:
    """A parser by name (``PARSERS``) or dotted path."""
    if spec in PARSERS:
        return PARSERS[spec]
    if ":" not in spec and "." not in spec:
        raise ValueError(f"{FLAG} {spec!r}: expected one of {sorted(PARSERS)} or 'pkg.module:func'")
    return load_dotted(spec, FLAG)
