"""Tool calls in a model's text, one module per format, shared by the OpenAI server
(``--tool-call-parser``) and the trainer's multi-turn loop (``--tool-parser``).

- ``call.py``: what a parse yields (``ToolCall``, ``Segment``); ``body.py``: a call's JSON read;
- ``json_scan.py``: where a JSON object ends in growing text, a call's name and arguments text;
- ``tagged.py``: ``<tool_call>{json}</tool_call>`` (``qwen25``, ``hermes``);
- ``llama3.py``: a bare JSON object, optionally after ``<|python_tag|>`` (``llama3``);
- ``scan.py``: the one walk over a text that every format shares (complete or still growing);
- ``stream.py``: OpenAI's streamed deltas from that walk;
- ``registry.py``: the formats by SGLang's names.
"""

from .call import Segment, ToolCall
from .registry import FORMATS, PARSERS, get_format

__all__ = ["FORMATS", "PARSERS", "Segment", "ToolCall", "get_format"]
