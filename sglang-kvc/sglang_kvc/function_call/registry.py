"""The call formats by SGLang's ``--tool-call-parser`` names."""

from __future__ import annotations

from .llama3 import Llama3Format
from .scan import calls
from .tagged import TaggedFormat

FORMATS = {"qwen25": TaggedFormat("qwen25"), "hermes": TaggedFormat("hermes"),
           "llama3": Llama3Format()}


def get_format(name: str):
    """The format named ``name``; ValueError listing the names otherwise."""
    if name not in FORMATS:
        raise ValueError(f"unknown tool-call parser {name!r}: expected one of {', '.join(FORMATS)}")
    return FORMATS[name]


def _text_parser(fmt):
    def parse(text: str) -> list:
        return calls(fmt, text)

    parse.__name__ = parse.__qualname__ = fmt.name
    parse.__doc__ = f"Every {fmt.name} call of a model's text, in order, well-formed or not."
    return parse


# name -> text -> every ToolCall, well-formed or not (the trainer's multi-turn loop)
PARSERS = {name: _text_parser(fmt) for name, fmt in FORMATS.items()}
