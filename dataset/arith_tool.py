"""``arith-tool``: products too long to work out in the head, with a calculator to call.

    python -m dataset.arith_tool --n 2000 --out data/arith_tool.jsonl [--style chat|tiny]

Each row asks for ``a * b + c`` (three-digit ``a``, ``b``; two-digit ``c``; one-digit numbers in
the tiny style); the label is its value.
The intended answer takes two turns: a Qwen2.5-style ``<tool_call>`` to the ``calculator``,
then, after the tool's ``<tool_response>``, the value in ``\\boxed{}``. ``solution_turns`` holds
those two model turns (the worked examples of a warm-up, ``trainer.warmup``) and ``observations``
what the environment (``recipes.tool_use:ArithToolEnv``) answers between them. ``chat`` rows are message lists with
a system prompt that describes the tool (a real chat model); ``tiny`` rows are the quickstart's
short ChatML string for its tiny model.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from .formats import write_rows

SYSTEM = ("You can call a calculator. To use it, write exactly\n"
          '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2 * 3"}}\n</tool_call>\n'
          "and wait for its <tool_response>. Then give the final answer as \\boxed{value}.")
QUESTION = "What is {expr}? Use the calculator."
TINY_PROMPT = "<|im_start|>user\ncalc {expr}<|im_end|>\n<|im_start|>assistant\n"


def tool_call(expression: str) -> str:
    """The model turn that calls the calculator, in Qwen2.5's format."""
    args = json.dumps({"name": "calculator", "arguments": {"expression": expression}})
    return f"<tool_call>\n{args}\n</tool_call>"


def arith_tool_rows(n: int, seed: int, style: str = "chat", digits: int | None = None) -> list[dict]:
    """``digits`` of ``a`` and ``b`` (default 3; the tiny style 1, with a one-digit ``c``: the
    quickstart's tiny model must learn to copy the numbers into the call and out of the answer)."""
    digits = digits or (1 if style == "tiny" else 3)
    low, high = 10 ** (digits - 1) + (digits == 1), 10 ** digits - 1
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(low, high), rng.randint(low, high)
        c = rng.randint(1, 9) if digits == 1 else rng.randint(10, 99)
        expr = f"{a} * {b} + {c}"
        value = a * b + c
        prompt = TINY_PROMPT.format(expr=expr) if style == "tiny" else [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": QUESTION.format(expr=expr)}]
        rows.append({"prompt": prompt, "label": str(value),
                     "solution_turns": [tool_call(expr), f"\\boxed{{{value}}}"],
                     "observations": [f"<tool_response>\n{value}\n</tool_response>"]})
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m dataset.arith_tool", description=__doc__.split("\n\n")[0],
                                allow_abbrev=False)
    p.add_argument("--n", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--style", choices=["chat", "tiny"], default="chat")
    p.add_argument("--digits", type=int, default=None, help="of a and b (default 3; tiny: 1)")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    write_rows(Path(a.out), arith_tool_rows(a.n, a.seed, a.style, a.digits))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
