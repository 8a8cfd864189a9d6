"""Where a JSON value ends, on text that may still be growing (no full parse needed)."""

from __future__ import annotations

import json
import re

_HEADER = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"(?:arguments|parameters)"\s*:\s*')


def object_end(text: str, start: int) -> int | None:
    """The index just past the JSON object (or array) opening at ``text[start]``; None while
    it is not closed yet. Strings and escapes are skipped, so braces inside them do not count."""
    depth, in_string, escaped = 0, False, False
    for i in range(start, len(text)):
        c = text[i]
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
    return None


def header(body: str) -> tuple[str, int] | None:
    """(name, where the arguments begin) of a call body that starts ``{"name": "...",
    "arguments": `` (or ``"parameters"``); None when it does not (yet)."""
    m = _HEADER.match(body)
    if m is None:
        return None
    return json.loads(m.group(1)), m.end()


def arguments_text(body: str, args: dict) -> str:
    """A well-formed call's arguments as a JSON string: the model's own text when the body has
    the header form and that text is the arguments object, else their JSON dump."""
    head = header(body)
    if head is not None and body[head[1]:head[1] + 1] == "{":
        end = object_end(body, head[1])
        if end is not None:
            raw = body[head[1]:end]
            try:
                if json.loads(raw) == args:
                    return raw
            except json.JSONDecodeError:
                pass
    return json.dumps(args, ensure_ascii=False)


def partial_arguments(body: str) -> tuple[str, str] | None:
    """(name, arguments text so far) of a call still being generated, when its header is
    complete; the arguments stream only while they are an object being written."""
    head = header(body)
    if head is None:
        return None
    name, start = head
    if body[start:start + 1] != "{":
        return name, ""
    end = object_end(body, start)
    return name, body[start:end if end is not None else len(body)]
