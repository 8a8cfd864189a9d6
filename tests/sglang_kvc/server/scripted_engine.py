"""An engine stand-in that answers from a script, for the tool-call tests: the HTTP server, the
chat template (the real tokenizer's) and the parsers run for real; only the model is replaced
by a conversation -> answer table, since no random tiny model writes a tool call.

The answer streams token by token (the real tokenizer's tokens, the text re-decoded at each
one, as the engine's detokenizer does). When the rendered prompt already ends with the start of
the scripted answer (a forced call's opening, written by the server), the rest follows."""

from __future__ import annotations

import concurrent.futures
import json
from pathlib import Path

from sglang_kvc.server_args import ServerArgs

TOOLS = [{"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                   "required": ["expression"]}}}]

# Qwen2.5's layout (tools in the system turn, calls as <tool_call> JSON, answers as a user turn
# in <tool_response>), without its whitespace control so that it reads as written.
QWEN_STYLE_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nYou are a helpful assistant.\n\n# Tools\n\n<tools>"
    "{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags.<|im_end|>\n"
    "{% else %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "{% for message in messages %}"
    "{% if message.role == 'user' %}<|im_start|>user\n{{ message.content }}<|im_end|>\n"
    "{% elif message.role == 'assistant' %}<|im_start|>assistant"
    "{% if message.content %}\n{{ message.content }}{% endif %}"
    "{% for call in message.tool_calls or [] %}\n<tool_call>\n"
    "{\"name\": \"{{ call.function.name }}\", \"arguments\": {{ call.function.arguments | tojson }}}"
    "\n</tool_call>{% endfor %}<|im_end|>\n"
    "{% elif message.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ message.content }}"
    "\n</tool_response><|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def call_text(expression: str) -> str:
    return ('<tool_call>\n{"name": "calculator", "arguments": {"expression": "'
            + expression + '"}}\n</tool_call>')


ASK = "What is 37 * 91?"
# the last turn of the conversation -> the model's answer
SCRIPT = {
    ASK: "I will compute.\n" + call_text("37 * 91"),
    "Call the calculator on 2 + 2.": call_text("2 + 2"),
    "Add 1 + 1 and 2 + 2.": call_text("1 + 1") + "\n" + call_text("2 + 2"),
    "Break the call.": '<tool_call>\n{"name": calculator}\n</tool_call>',
    "Say hello.": "Hello there.",
    "<tool_response>\n3367\n</tool_response>": "The answer is 3367.",
}
ASSISTANT = "<|im_start|>assistant\n"


class ScriptedEngine:
    """What the routes use of an Engine: args, tokenizer, submit, abort_requests."""

    def __init__(self, model_dir: Path, tool_call_parser: str | None, template: str | None = None):
        from transformers import AutoTokenizer

        self.args = ServerArgs(model_path=str(model_dir), tool_call_parser=tool_call_parser)
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        if template is not None:
            self.tokenizer.chat_template = template
        self.sampling_defaults: dict = {}
        self.context_length = self.max_seq_len = 4096
        self.prompts: list[str] = []  # every prompt as the server rendered it

    def submit(self, items, on_update=None) -> list:
        futures = []
        for it in items:
            for j in range(it.params.n):
                rid = it.rid if it.params.n == 1 else f"{it.rid}-{j}"
                futures.append(self._answer(rid, it.input_ids, on_update))
        return futures

    def abort_requests(self, rids) -> None:
        pass

    def _answer(self, rid: str, ids: list[int], on_update) -> concurrent.futures.Future:
        prompt = self.tokenizer.decode(ids)
        self.prompts.append(prompt)
        toks = self.tokenizer.encode(self._script(prompt), add_special_tokens=False)
        out = None
        for k in range(1, len(toks) + 1):
            done = k == len(toks)
            out = {"text": self.tokenizer.decode(toks[:k]), "output_ids": toks[:k], "meta_info": {
                "id": rid, "prompt_tokens": len(ids), "completion_tokens": k,
                "finish_reason": {"type": "stop", "matched": self.tokenizer.eos_token_id} if done else None}}
            if on_update is not None:
                on_update(out, done)
        fut: concurrent.futures.Future = concurrent.futures.Future()
        fut.set_result(out)
        return fut

    def _script(self, prompt: str) -> str:
        head, _, started = prompt.rpartition(ASSISTANT)
        turn = head.rsplit("<|im_start|>", 1)[-1].split("\n", 1)[-1].removesuffix("<|im_end|>\n")
        answer = SCRIPT.get(turn, "I have no script for this.")
        return answer[len(started):] if answer.startswith(started) else answer


def as_template_messages(messages: list[dict]) -> list[dict]:
    """Call arguments as objects, as transformers' chat templates take them (the reference)."""
    out = []
    for m in messages:
        calls = [{**c, "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])}}
                 for c in m.get("tool_calls") or []]
        out.append({**m, "tool_calls": calls} if calls else m)
    return out
