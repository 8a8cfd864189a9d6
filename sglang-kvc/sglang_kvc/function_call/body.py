"""A call's JSON body -> ``ToolCall`` (well-formed, or the reason it is not)."""

from __future__ import annotations

import json

from .call import ToolCall

SHAPE = 'a tool call is {"name": ..., "arguments": {...}}'


def parse_body(body: str, argument_keys: tuple[str, ...] = ("arguments",)) -> ToolCall:
    """The call a JSON body states. Arguments sent as a JSON string (some models do) are read
    as the object they encode."""
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as e:
        return ToolCall(None, {}, f"the tool call is not valid JSON ({e.msg})")
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return ToolCall(None, {}, SHAPE)
    key = next((k for k in argument_keys if k in obj), argument_keys[0])
    args = obj.get(key, {})
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            pass
    if not isinstance(args, dict):
        return ToolCall(obj["name"], {}, "the tool call's arguments must be a JSON object")
    return ToolCall(obj["name"], args)
