"""The engine's tool-call parsers (``sglang_kvc``'s ``--tool-call-parser`` formats), for the
multi-turn loop's ``--tool-parser``: the server and the trainer read calls with one parser.
Only engines/ talks to sglang_kvc; the loop imports them from here."""

from __future__ import annotations

from sglang_kvc import TOOL_CALL_PARSERS as PARSERS
from sglang_kvc import ToolCall

__all__ = ["PARSERS", "ToolCall"]
