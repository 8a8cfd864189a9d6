"""Tools on /v1/chat/completions, as SGLang's and vLLM's OpenAI servers take them.

Requests: ``tools`` (rendered by the chat template), ``tool_choice`` (auto, none, required or a
named function), ``parallel_tool_calls``, and the conversation's tool turns (assistant
``tool_calls``, ``role: "tool"`` answers). Responses: with ``--tool-call-parser``, the calls the
model wrote become ``tool_calls`` (the parsers: ``sglang_kvc/function_call``).

Forcing a call (``required`` or a named function) writes the call's opening after the
generation prompt (``<tool_call>\\n{"name": "`` or up to the named call's arguments): the model
continues from there. That is a prefix, not the constrained decoding of SGLang and vLLM: the
model may still write a malformed call, which then comes back as text.
"""

from __future__ import annotations

import dataclasses
import json

from ..function_call import get_format
from ..function_call.scan import scan
from ..function_call.stream import CallStream, call_id, is_text
from .openai_fields import OpenAIError


@dataclasses.dataclass
class ToolPlan:
    fmt: object | None = None  # the call format parsed out of the answer; None: no parsing
    prefill: str = ""  # the forced call's opening, written after the generation prompt
    parallel: bool = True  # False: only the first call is returned


def template_tools(body: dict) -> list | None:
    """The tools the template renders: none with ``tool_choice`` none (SGLang's rule)."""
    tools = body.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(_is_tool(t) for t in tools)):
        raise OpenAIError('tools must be a list of {"type": "function", "function": {"name": ...}}')
    return None if _choice(body) == "none" else tools


def _is_tool(t) -> bool:
    return (isinstance(t, dict) and t.get("type", "function") == "function"
            and isinstance(t.get("function"), dict) and isinstance(t["function"].get("name"), str))


def _choice(body: dict):
    """``tool_choice`` checked: auto, none, required or {"type": "function", "function":
    {"name": ...}} naming one of ``tools``."""
    choice = body.get("tool_choice")
    if choice is None or choice in ("auto", "none", "required"):
        return choice
    name = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
    if not isinstance(name, str) or choice.get("type", "function") != "function":
        raise OpenAIError('tool_choice must be "auto", "none", "required" or {"type": "function", '
                          '"function": {"name": ...}}')
    names = [t["function"]["name"] for t in body.get("tools") or []]
    if name not in names:
        raise OpenAIError(f"tool_choice names {name!r}, which is not among tools ({names})")
    return choice


def tool_plan(parser: str | None, body: dict) -> ToolPlan:
    """How the answer's calls are read: parsed only when the server has a parser, the request
    has tools and ``tool_choice`` is not none."""
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise OpenAIError("parallel_tool_calls must be a boolean")
    choice, tools = _choice(body), template_tools(body)
    forced = choice == "required" or isinstance(choice, dict)
    if forced and not tools:
        raise OpenAIError(f"tool_choice={choice!r} needs a non-empty tools list")
    if forced and parser is None:
        raise OpenAIError(f"tool_choice={choice!r} needs the server started with "
                          f"--tool-call-parser (the format the model writes its calls in)")
    if parser is None or not tools:
        return ToolPlan(parallel=parallel is not False)
    fmt = get_format(parser)
    prefill = fmt.prefill(choice["function"]["name"] if isinstance(choice, dict) else None) \
        if forced else ""
    return ToolPlan(fmt, prefill, parallel is not False)

# ------------------------------------------------------------ the conversation's tool turns


def template_messages(messages: list, parser: str | None, template: str) -> list:
    """The messages as the chat template takes them: assistant calls' arguments as objects
    (Qwen2.5's template dumps them), no None content. A template that does not render
    ``tool_calls`` (SmolLM2's plain ChatML) gets the calls written into the content, in the
    parser's format, as the model would have written them."""
    fmt = get_format(parser) if parser is not None and "tool_calls" not in template else None
    return [_template_message(i, m, fmt) for i, m in enumerate(messages)]


def _template_message(i: int, m, fmt) -> dict:
    if not isinstance(m, dict) or not isinstance(m.get("role"), str):
        raise OpenAIError(f"messages[{i}] must be an object with a role")
    if m["role"] == "tool" and not isinstance(m.get("tool_call_id"), str):
        raise OpenAIError(f"messages[{i}]: a tool message needs tool_call_id, the id of the call "
                          f"it answers")
    if m["role"] != "assistant" or not m.get("tool_calls"):
        return m
    if not isinstance(m["tool_calls"], list):
        raise OpenAIError(f"messages[{i}].tool_calls must be a list")
    calls = [_template_call(f"messages[{i}].tool_calls[{k}]", c) for k, c in enumerate(m["tool_calls"])]
    content = m.get("content") or ""
    if fmt is not None:
        written = [fmt.render(c["function"]["name"], c["function"]["arguments"]) for c in calls]
        content = "\n".join([content, *written] if content else written)
    return {**m, "content": content, "tool_calls": calls}


def _template_call(where: str, c) -> dict:
    fn = c.get("function") if isinstance(c, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise OpenAIError(f'{where} must be {{"id": ..., "type": "function", "function": '
                          f'{{"name": ..., "arguments": "<JSON object>"}}}}')
    args = fn.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as e:
            raise OpenAIError(f"{where}.function.arguments is not valid JSON ({e.msg})") from e
    if not isinstance(args, dict):
        raise OpenAIError(f"{where}.function.arguments must be a JSON object")
    return {**c, "type": "function", "function": {**fn, "arguments": args}}

# ------------------------------------------------------------ the answer's calls


def _finish_reason(reason: str | None, called: bool) -> str | None:
    return "tool_calls" if called and reason == "stop" else reason


def answer_message(plan: ToolPlan, text: str, reason: str | None) -> tuple[dict, str | None]:
    """(the assistant message, the finish reason) of a complete answer: its well-formed calls
    as ``tool_calls``, the text around them as ``content`` (None when there is none)."""
    text = plan.prefill + text
    if plan.fmt is None:
        return {"role": "assistant", "content": text, "tool_calls": None}, reason
    segments = scan(plan.fmt, text)
    calls = [s for s in segments if not is_text(s)][:None if plan.parallel else 1]
    if not calls:
        return {"role": "assistant", "content": text, "tool_calls": None}, reason
    content = "".join(s.text for s in segments if is_text(s)).strip() or None
    tool_calls = [{"id": call_id(), "type": "function",
                   "function": {"name": s.name, "arguments": s.arguments_text}} for s in calls]
    return {"role": "assistant", "content": content, "tool_calls": tool_calls}, \
        _finish_reason(reason, True)


class AnswerStream:
    """One streamed choice: its content and tool-call deltas from the text so far."""

    def __init__(self, plan: ToolPlan):
        self.plan = plan
        self.calls = CallStream(plan.fmt, plan.parallel) if plan.fmt is not None else None
        self.sent = 0  # characters of the text sent as content (no parsing)

    def delta(self, text: str, reason: str | None) -> tuple[dict, str | None]:
        """(the delta, the finish reason) for the text so far; ``reason`` set: the last one."""
        text = self.plan.prefill + text
        if self.calls is None:
            piece, self.sent = text[self.sent:], len(text)
            return {"content": piece}, reason
        d = self.calls.feed(text, final=reason is not None)
        if not d.tool_calls:
            return {"content": d.content}, _finish_reason(reason, self.calls.called)
        return {"content": d.content or None, "tool_calls": d.tool_calls}, \
            _finish_reason(reason, True)
