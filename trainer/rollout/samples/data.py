"""Prompt data for rollouts: ``--prompt-data file.jsonl[@[a:b]]`` with ``--input-key``/``--label-key``.

Rows are read once, validated with the file and line named on any problem, tokenized (applying
the tokenizer's chat template to message lists, or to strings with ``--apply-chat-template``),
and served in epochs shuffled by a seeded generator. The position (epoch, offset) is part of the
checkpoint, so a resumed run sees exactly the prompts an uninterrupted run would.
"""

from __future__ import annotations

import dataclasses
import random
import re
from pathlib import Path

from dataset.formats import iter_rows

_SLICE = re.compile(r"^(?P<path>.+?)@\[(?P<start>-?\d*):(?P<stop>-?\d*)\]$")


class DataError(ValueError):
    """Bad prompt data; the message names the file (and line)."""


@dataclasses.dataclass
class Prompt:
    text: str  # what the model sees (chat template applied)
    input_ids: list[int]
    label: object
    metadata: dict
    source: object = None  # the row's input before the chat template (plug-ins rebuild prompts)


def parse_data_spec(spec: str) -> tuple[Path, slice]:
    """``path`` or ``path@[a:b]`` (python slice of the rows, like slime's)."""
    m = _SLICE.match(spec)
    if not m:
        return Path(spec), slice(None)
    to_int = lambda s: int(s) if s not in ("", None) else None  # noqa: E731
    return Path(m["path"]), slice(to_int(m["start"]), to_int(m["stop"]))


def load_prompts(spec: str, tokenizer, *, input_key: str = "prompt", label_key: str = "label",
                 apply_chat_template: bool = False, max_prompt_len: int | None = None
                 ) -> list[Prompt]:
    path, rows_slice = parse_data_spec(spec)
    if not path.is_file():
        raise DataError(f"--prompt-data {path}: file not found")
    try:
        rows = list(iter_rows(path))
    except ValueError as e:  # broken JSON line: iter_rows names file and line
        raise DataError(str(e)) from None
    rows = rows[rows_slice]
    if not rows:
        raise DataError(f"{path}: no rows{'' if rows_slice == slice(None) else ' in ' + spec}")
    prompts = []
    for lineno, row in rows:
        where = f"{path}:{lineno}"
        if not isinstance(row, dict):
            raise DataError(f"{where}: expected a JSON object")
        if input_key not in row:
            raise DataError(f"{where}: missing key {input_key!r} (--input-key)")
        if label_key not in row:
            raise DataError(f"{where}: missing key {label_key!r} (--label-key)")
        text = _render(row[input_key], tokenizer, apply_chat_template, where)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if not ids:
            raise DataError(f"{where}: the prompt is empty")
        if max_prompt_len and len(ids) > max_prompt_len:
            ids = ids[-max_prompt_len:]  # keep the end, where the question and template are
        meta = {k: v for k, v in row.items() if k not in (input_key, label_key)}
        prompts.append(Prompt(text, ids, row[label_key], meta, row[input_key]))
    return prompts


def _render(prompt, tokenizer, apply_chat_template: bool, where: str) -> str:
    if isinstance(prompt, list):
        if not all(isinstance(m, dict) and "role" in m and "content" in m for m in prompt):
            raise DataError(f"{where}: a message list needs objects with 'role' and 'content'")
        return tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    if not isinstance(prompt, str) or not prompt.strip():
        raise DataError(f"{where}: the prompt must be a non-empty string or a message list")
    if apply_chat_template:
        return tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                             add_generation_prompt=True)
    return prompt


class PromptStream:
    """Endless seeded epochs over the prompts; ``state()``/``load_state()`` for exact resume."""

    def __init__(self, prompts: list[Prompt], seed: int = 1234, shuffle: bool = True):
        self.prompts, self.seed, self.shuffle = prompts, seed, shuffle
        self.epoch, self.offset = 0, 0
        self._order = self._epoch_order()

    def _epoch_order(self) -> list[int]:
        order = list(range(len(self.prompts)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        return order

    def next_batch(self, n: int) -> list[Prompt]:
        out = []
        while len(out) < n:
            if self.offset == len(self._order):
                self.epoch, self.offset = self.epoch + 1, 0
                self._order = self._epoch_order()
            out.append(self.prompts[self._order[self.offset]])
            self.offset += 1
        return out

    def state(self) -> dict:
        return {"epoch": self.epoch, "offset": self.offset}

    def load_state(self, state: dict) -> None:
        self.epoch, self.offset = int(state["epoch"]), int(state["offset"])
        self._order = self._epoch_order()
