"""Tool calls in a model turn: ``--tool-parser`` (a name below or ``pkg.module:func``).

A parser takes the turn's text and returns its ``ToolCall``s: every call it found, each either
well-formed (a name and a dict of arguments) or carrying the reason it is not (``error``), so a
malformed call becomes an error observation for the model, never an exception in the loop.

The parsers are the server's (``--tool-call-parser``, through ``engines/tool_calls.py``): one
parser for both.
The default, ``qwen25``, reads Qwen2.5's (and Hermes') format, as its chat template asks for:

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "37 * 91"}}
    </tool_call>
"""

from __future__ import annotations

from typing import Callable

from ..engines.tool_calls import PARSERS, ToolCall
from ..samples.plugins import load_dotted

FLAG = "--tool-parser"
qwen25 = PARSERS["qwen25"]
__all__ = ["FLAG", "PARSERS", "ToolCall", "load_parser", "qwen25"]


def load_parser(spec: str) -> Callable[[str], list[ToolCall]]:
    """A parser by name (``PARSERS``) or dotted path."""
    if spec in PARSERS:
        return PARSERS[spec]
    if ":" not in spec and "." not in spec:
        raise ValueError(f"{FLAG} {spec!r}: expected one of {sorted(PARSERS)} or 'pkg.module:func'")
    return load_dotted(spec, FLAG)
