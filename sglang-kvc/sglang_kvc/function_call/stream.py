"""OpenAI's streamed view of one sample's calls: content deltas, then per call a first delta
with its index, id, type and name (arguments ""), then pieces of its arguments.

Each update rescans the whole text so far (``scan``, with held-back tag starts), and sends
what the scan knows beyond what was sent. Nothing sent is ever taken back: a call that turns
out malformed after its name went out stays a call (SGLang and vLLM do the same)."""

from __future__ import annotations

import dataclasses
import uuid

from .call import Segment
from .scan import scan


def is_text(s: Segment) -> bool:
    """A piece the client reads as content: plain text, or a complete malformed call."""
    return s.complete and (s.call is None or not s.call.ok)


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclasses.dataclass
class Delta:
    content: str = ""
    tool_calls: list[dict] = dataclasses.field(default_factory=list)


class CallStream:
    """The deltas of one sample; ``parallel`` False keeps only its first call."""

    def __init__(self, fmt, parallel: bool = True):
        self.fmt, self.parallel = fmt, parallel
        self.content_sent = ""
        self.args_sent: list[str] = []

    @property
    def called(self) -> bool:
        return bool(self.args_sent)

    def feed(self, text: str, final: bool) -> Delta:
        segments = scan(self.fmt, text, final=False)
        content = "".join(s.text for s in segments if is_text(s))
        if final:  # what was held back was not a call after all
            held = text[sum(len(s.text) for s in segments):]
            open_unnamed = segments and not segments[-1].complete and segments[-1].name is None
            content += (segments[-1].text if open_unnamed else "") + held
        calls = [s for s in segments if not is_text(s)]
        return Delta(self._content(content), self._calls(calls[:None if self.parallel else 1]))

    def _content(self, content: str) -> str:
        if not content.startswith(self.content_sent):
            return ""
        delta, self.content_sent = content[len(self.content_sent):], content
        return delta

    def _calls(self, calls: list[Segment]) -> list[dict]:
        out: list[dict] = []
        for k, s in enumerate(calls):
            if s.name is None:
                break
            if k == len(self.args_sent):
                out.append({"index": k, "id": call_id(), "type": "function",
                            "function": {"name": s.name, "arguments": ""}})
                self.args_sent.append("")
            sent = self.args_sent[k]
            if len(s.arguments_text) > len(sent) and s.arguments_text.startswith(sent):
                out.append({"index": k, "function": {"arguments": s.arguments_text[len(sent):]}})
                self.args_sent[k] = s.arguments_text
        return out
