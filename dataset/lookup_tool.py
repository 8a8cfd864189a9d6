"""``lookup-tool``: a shop's prices that the prompt does not show, a ``lookup`` tool that reads
them, and a ``calculator`` to total an order.

    python -m dataset.lookup_tool --n 2000 --out data/lookup_tool.jsonl [--style chat|tiny] [--demos]

Each row asks what an order of two to four items costs ("3 pears, 7 plums and 2 kiwis"); its
``table`` (the row's price list: the ordered items and two others) is read only by the
environment (``recipes.lookup_tool:LookupToolEnv``), so the model must call ``lookup`` for every
item, then the calculator on the quantities times the prices it read (the calls depend on each
other's results), then box the total (the label). The intended episode: one turn of ``lookup``
calls, one ``calculator`` call, the answer; ``solution_turns`` and ``observations`` hold it, as
in ``dataset.arith_tool``.

``--demos`` writes the warm-up's rows (``trainer.warmup``): orders of one or two items at
three-digit prices. They show the whole format (several lookups in one turn, a sum of products
in one calculator call) on other values than the training and held-out rows (two to four
items, two-digit prices), so the warm-up teaches the calls, not the answers.

Why this split (issue 66 item 4: start at reward ~0.2-0.5, then a gain RL can make). On
2026-11-28 the warm-up showed one-item orders only and the rows had one to three items: greedy
held-out accuracy was exactly 46/128 = 0.359 at every evaluation for 60 rollouts, and 46 is the
number of one-item orders among those 128 prompts. The model solved the warm-up's shape and no
other, and at temperature 1 a multi-item success was too rare for GRPO to find (groups all 0).
Now the warm-up's two-item orders make a longer order a small step from what the model does
(one more lookup in the turn, one more product in the sum), so sampling reaches successes on
every shape, and what RL has to learn is doing it reliably: on a CPU check (HF greedy, 24
held-out orders of 1-4 items after this 12-step warm-up) SmolLM2 solved 5, all three-item
orders done as intended, while shorter orders looked an item up again instead of calling the
calculator and four-item ones repeated one item (docs/environments.md). ``tiny`` rows are the CPU quickstart's short
ChatML strings (one or two items, one-digit prices; warm-up one item).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
from pathlib import Path

from .arith_tool import tool_call
from .formats import write_rows

ITEMS = ("apple", "pear", "plum", "lemon", "melon", "kiwi", "orange", "banana", "onion", "carrot",
         "candle", "pencil", "marker", "ticket", "sticker", "towel", "bottle", "cookie", "napkin", "button")
SYSTEM = ("You help at a shop. Its prices are not shown: to read an item's price, write exactly\n"
          '<tool_call>\n{"name": "lookup", "arguments": {"item": "apple"}}\n</tool_call>\n'
          "To compute, write exactly\n"
          '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2 * 3"}}\n</tool_call>\n'
          "Each call is answered in a <tool_response>. Then give the total as \\boxed{value}.")
QUESTION = "What do {order} cost in all?"
TINY_PROMPT = "<|im_start|>user\nprice {order}<|im_end|>\n<|im_start|>assistant\n"


@dataclasses.dataclass(frozen=True)
class Shape:
    """How large an order is and what things cost."""

    items: tuple[int, int]  # items an order, inclusive
    quantity: tuple[int, int]
    price: tuple[int, int]


SHAPES = {("chat", False): Shape((2, 4), (2, 9), (11, 99)),
          ("chat", True): Shape((1, 2), (2, 9), (100, 999)),  # the warm-up: the format only
          ("tiny", False): Shape((1, 2), (2, 9), (2, 9)),
          ("tiny", True): Shape((1, 1), (2, 9), (2, 9))}
DISTRACTORS = 2  # table entries not ordered: a lookup must name the right item


def plural(item: str) -> str:
    return item + "s"


def order_text(order: list[tuple[str, int]], style: str) -> str:
    if style == "tiny":
        return " ".join(f"{q} {item}" for item, q in order)
    words = [f"{q} {plural(item)}" for item, q in order]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def lookup_call(item: str) -> str:
    """The model turn's call of the lookup tool, in Qwen2.5's format."""
    args = json.dumps({"name": "lookup", "arguments": {"item": item}})
    return f"<tool_call>\n{args}\n</tool_call>"


def response(text: str) -> str:
    return f"<tool_response>\n{text}\n</tool_response>"


def one_row(rng: random.Random, shape: Shape, style: str) -> dict:
    k = rng.randint(*shape.items)
    names = rng.sample(ITEMS, k + DISTRACTORS)
    table = {name: rng.randint(*shape.price) for name in names}
    order = [(name, rng.randint(*shape.quantity)) for name in names[:k]]
    expr = " + ".join(f"{q} * {table[item]}" for item, q in order)
    total = sum(q * table[item] for item, q in order)
    text = order_text(order, style)
    prompt = TINY_PROMPT.format(order=text) if style == "tiny" else [
        {"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION.format(order=text)}]
    return {"prompt": prompt, "label": str(total), "table": table,
            "solution_turns": ["\n".join(lookup_call(item) for item, _ in order), tool_call(expr),
                               f"\\boxed{{{total}}}"],
            "observations": ["\n".join(response(str(table[item])) for item, _ in order), response(str(total))]}


def lookup_tool_rows(n: int, seed: int, style: str = "chat", demos: bool = False) -> list[dict]:
    """``n`` rows of ``style``; ``demos``: the warm-up's shape (one item, other prices)."""
    rng = random.Random(seed)
    shape = SHAPES[style, demos]
    return [one_row(rng, shape, style) for _ in range(n)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m dataset.lookup_tool", description=__doc__.split("\n\n")[0],
                                allow_abbrev=False)
    p.add_argument("--n", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--style", choices=["chat", "tiny"], default="chat")
    p.add_argument("--demos", action="store_true", help="the warm-up's rows (one or two items, three-digit prices)")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    if a.n < 1:
        p.error("--n must be >= 1")
    write_rows(Path(a.out), lookup_tool_rows(a.n, a.seed, a.style, a.demos))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
