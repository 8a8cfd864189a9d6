"""Prompt templates of the evaluation harness (the reference's names, eval.md section 1.3).

A template turns a question into either a raw prompt string (for ``/generate`` and
``/v1/completions``) or chat messages (for ``/v1/chat/completions``), and names the stop
strings that end an answer. ``chat`` renders the model's own chat template through its tokenizer.
"""

from __future__ import annotations

import dataclasses

BOXED_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
DEFAULT_SYSTEM = "You are a helpful assistant."
CHATML_STOPS = ["<|im_end|>", "<|endoftext|>"]
R1_INSTRUCTION = (
    "A conversation between User and Assistant. The User asks a question and the Assistant solves "
    "it. The Assistant first thinks through the reasoning process and then gives the User the "
    "answer. The reasoning process and the answer are enclosed within <think> </think> and "
    "<answer> </answer> tags respectively, i.e., <think> reasoning process here </think> "
    "<answer> answer here </answer>."
)


def chatml(messages: list[dict]) -> str:
    """Messages written out as raw ChatML text ending with an open assistant turn."""
    body = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return body + "<|im_start|>assistant\n"


@dataclasses.dataclass(frozen=True)
class PromptTemplate:
    name: str
    stops: tuple[str, ...]

    def messages(self, question: str) -> list[dict]:
        if self.name == "qwen-boxed":
            return [{"role": "system", "content": DEFAULT_SYSTEM},
                    {"role": "user", "content": f"{question}\n{BOXED_INSTRUCTION}"}]
        if self.name == "qwen25-math-cot":
            return [{"role": "system", "content": BOXED_INSTRUCTION}, {"role": "user", "content": question}]
        if self.name == "abel":
            return [{"role": "user", "content": f"Question:\n{question}\nAnswer:\nLet's think step by step.\n"}]
        if self.name == "deepseek-r1":
            return [{"role": "user", "content": f"{R1_INSTRUCTION} User: {question}"}]
        if self.name == "chat":
            return [{"role": "user", "content": f"{question}\n{BOXED_INSTRUCTION}"}]
        raise ValueError(f"unknown prompt template {self.name!r}")

    def render(self, question: str, tokenizer=None) -> str:
        """The raw prompt string. ``chat`` needs ``tokenizer`` (a transformers tokenizer)."""
        if self.name in ("qwen-boxed", "qwen25-math-cot"):
            return chatml(self.messages(question))
        if self.name == "abel":
            return self.messages(question)[0]["content"]
        if self.name == "deepseek-r1":
            return f"{R1_INSTRUCTION} User: {question} Assistant: <think>"
        if self.name == "chat":
            if tokenizer is None:
                raise ValueError("prompt template 'chat' needs --tokenizer (a model or tokenizer path) "
                                 "unless the backend is openai-chat")
            return tokenizer.apply_chat_template(self.messages(question), tokenize=False,
                                                 add_generation_prompt=True)
        raise ValueError(f"unknown prompt template {self.name!r}")


TEMPLATES: dict[str, PromptTemplate] = {
    "qwen-boxed": PromptTemplate("qwen-boxed", tuple(CHATML_STOPS)),
    "qwen25-math-cot": PromptTemplate("qwen25-math-cot", tuple(CHATML_STOPS)),
    "abel": PromptTemplate("abel", ("Question:",)),
    "deepseek-r1": PromptTemplate("deepseek-r1", ("</answer>",)),
    "chat": PromptTemplate("chat", ()),
}


def get_template(name: str) -> PromptTemplate:
    if name not in TEMPLATES:
        raise ValueError(f"unknown prompt template {name!r}; choose from {sorted(TEMPLATES)}")
    return TEMPLATES[name]
