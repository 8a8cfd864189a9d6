"""Exact scoring of the synthetic and numeric tasks (the trainer's ``gsm8k``, ``countdown``,
``arithmetic`` and ``chain`` rewards); ``math`` goes through :mod:`.equivalence`.

    score_countdown("... \\\\boxed{(1 + 2) * 3}", '{"target": 9, "numbers": [1, 2, 3]}')  # -> 1.0
    score_gsm8k("... #### 1,000", "1000")                                           # -> 1.0

Every scorer is bounded (length caps, integer literals only, no ``eval``) and cannot hang, so
they run in-process. A malformed *label* raises ``ValueError`` (the data is wrong); a malformed
*response* scores 0.
"""

from __future__ import annotations

import ast
import json
import re
from fractions import Fraction

from .extract import extract_answer, gsm8k_answer

_MAX_ANSWER_CHARS = 1000  # longer "answers" to countdown/arithmetic score 0 without parsing


def exact_number(text: str | None) -> Fraction | None:
    """An exact decimal/integer/``a/b`` number from an answer string, or None.

    Drops the decorations models write around numbers (``$``, thousands commas, ``\\\\!``,
    spaces, a trailing period). Units (``5 \\\\text{cm}``) are not stripped: such answers give None.
    """
    if text is None:
        return None
    s = str(text).strip()
    if not s or len(s) > 100:
        return None
    s = s.replace("\\!", "").replace("\\,", "").replace("$", "").replace(",", "").replace(" ", "")
    s = s.rstrip(".")
    frac = re.fullmatch(r"\\[dt]?frac\{(-?\d+)\}\{(-?\d+)\}", s)
    if frac:
        s = f"{frac.group(1)}/{frac.group(2)}"
    if not re.fullmatch(r"[-+]?(\d+(\.\d*)?|\.\d+)(/[-+]?\d+)?", s):
        return None  # Fraction() would also take "1e9999" or "nan": not answers here
    try:
        return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None


def countdown_spec(label) -> tuple[list[int], int]:
    """``(numbers, target)`` of a countdown label: ``{"target": T, "numbers": [...]}`` or its JSON."""
    spec = label
    if isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except json.JSONDecodeError as exc:
            raise ValueError(f"countdown label is not JSON: {label!r} ({exc})") from None
    if not (isinstance(spec, dict) and "numbers" in spec and "target" in spec):
        raise ValueError(f"countdown label must be {{\"target\": T, \"numbers\": [...]}} "
                         f"(dict or JSON string), got {label!r}")
    return [int(n) for n in spec["numbers"]], int(spec["target"])


def _countdown_value(node, used: list[int]) -> Fraction:
    """Exact value of an AST of integer literals and ``+ - * /``; anything else is refused."""
    if isinstance(node, ast.BinOp) and type(node.op) in (ast.Add, ast.Sub, ast.Mult, ast.Div):
        a, b = _countdown_value(node.left, used), _countdown_value(node.right, used)
        if isinstance(node.op, ast.Div):
            if b == 0:
                raise ZeroDivisionError
            return a / b
        return {ast.Add: a + b, ast.Sub: a - b, ast.Mult: a * b}[type(node.op)]
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        used.append(node.value)
        return Fraction(node.value)
    raise ValueError("not allowed")


def check_countdown(expression: str, numbers: list[int], target: int) -> bool:
    """Whether ``expression`` uses exactly ``numbers`` (each once) with ``+ - * /`` and equals ``target``."""
    expression = expression.replace("\\times", "*").replace("\\cdot", "*").replace("\\div", "/")
    expression = expression.split("=")[0].strip()
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError:
        return False
    used: list[int] = []
    try:
        result = _countdown_value(tree.body, used)
    except (ValueError, ZeroDivisionError):
        return False
    return sorted(used) == sorted(numbers) and result == target


def score_countdown(response: str, label) -> float:
    """1.0 when the response's answer (last box, else :func:`extract_answer`) reaches the
    label's target with each of its numbers once, else 0.0."""
    numbers, target = countdown_spec(label)
    answer = extract_answer(response)
    if answer is None or len(answer) > _MAX_ANSWER_CHARS:
        return 0.0
    # Cheap pre-check: the answer's integer literals must be the given numbers. This also
    # bounds the expression tree that check_countdown walks recursively.
    if sorted(int(d) for d in re.findall(r"\d+", answer.split("=")[0])) != sorted(numbers):
        return 0.0
    try:
        return 1.0 if check_countdown(answer, numbers, target) else 0.0
    except (RecursionError, MemoryError, OverflowError, TypeError):
        return 0.0


_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def score_countdown_r1(response: str, label, format_score: float = 0.1) -> float:
    """R1-style Countdown (TinyZero's rule, our parser): the last complete ``<answer>...</answer>``
    holds the equation. No such tag (none, or unbalanced): 0.0. A tag whose equation is not the
    given numbers each used once, does not parse, divides by zero or misses the target:
    ``format_score``. The target reached exactly: 1.0."""
    numbers, target = countdown_spec(label)
    tags = _ANSWER_TAG.findall(response or "")
    if not tags:
        return 0.0
    answer = tags[-1].strip()
    if len(answer) > _MAX_ANSWER_CHARS or not re.fullmatch(r"[\d+\-*/().\s=]*", answer):
        return format_score
    if sorted(int(d) for d in re.findall(r"\d+", answer.split("=")[0])) != sorted(numbers):
        return format_score
    try:
        return 1.0 if check_countdown(answer, numbers, target) else format_score
    except (RecursionError, MemoryError, OverflowError, TypeError):
        return format_score


def score_gsm8k(response: str, label) -> float:
    """1.0 when the response's number (after ``####``, else its last) equals the label's."""
    gold_text = str(label)
    gold = gsm8k_answer(gold_text) if "####" in gold_text else gold_text
    gold_value = exact_number(gold)
    if gold_value is None:
        raise ValueError(f"gsm8k label is not a number (or a solution ending in '#### N'): {label!r}")
    pred = exact_number(gsm8k_answer(response))
    return 1.0 if pred is not None and pred == gold_value else 0.0


def score_arithmetic(response: str, label) -> float:
    """1.0 when the response's extracted answer equals the label's number exactly."""
    gold = exact_number(str(label))
    if gold is None:
        raise ValueError(f"arithmetic label is not a number: {label!r}")
    pred = exact_number(extract_answer(response))
    return 1.0 if pred is not None and pred == gold else 0.0


def chain_spec(label) -> tuple[int, list[int]]:
    """``(start, steps)`` of a chain label: ``{"start": S, "steps": [a, -b, ...]}`` or its JSON."""
    spec = label
    if isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except json.JSONDecodeError as exc:
            raise ValueError(f"chain label is not JSON: {label!r} ({exc})") from None
    if not (isinstance(spec, dict) and isinstance(spec.get("steps"), list) and spec["steps"]
            and "start" in spec):
        raise ValueError(f"chain label must be {{\"start\": S, \"steps\": [...]}} with steps, got {label!r}")
    return int(spec["start"]), [int(x) for x in spec["steps"]]


# ``12 + 5 = 17`` anywhere in the text. The lookarounds read whole numbers only ("112 + 5" is not
# "12 + 5", "= 17.5" is not "= 17"); the dashes models write for a minus count as one.
_CHAIN_LINE = re.compile(r"(?<![\d.])(\d{1,9})\s*([+\-\u2212\u2013])\s*(\d{1,9})\s*=\s*(\d{1,9})(?!\d|\.\d)")
_MAX_CHAIN_TEXT = 50_000  # characters read; a full answer is ~15 per step


def chain_equations(text: str) -> list[tuple[int, int, int]]:
    """Every ``a + b = c`` / ``a - b = c`` in the text, in order, as ``(a, signed b, c)``."""
    return [(int(a), int(b) if op == "+" else -int(b), int(c))
            for a, op, b, c in _CHAIN_LINE.findall((text or "")[:_MAX_CHAIN_TEXT])]


def score_chain(response: str, label) -> float:
    """Fraction of the chain's steps done right, errors carried forward (as an examiner marks).

    The response's chain is its equations that continue it: the first that starts from the
    label's start, then each that starts from the previous one's result (others -- a copied
    example, prose -- are skipped). Its i-th equation is the attempt at step i and earns 1/N when
    it adds the i-th number and its sum is right. A wrong sum loses that step only (the next step
    continues from the written total); a skipped or extra step shifts the numbers off. Only a
    full chain scores 1, and a response can earn at most (equations written) / N: the length is
    what the task asks for.
    """
    total, steps = chain_spec(label)
    credit = i = 0
    for a, b, c in chain_equations(response):
        if i == len(steps):
            break
        if a != total:
            continue
        credit += b == steps[i] and c == a + b
        total, i = c, i + 1
    return credit / len(steps)


def math_gold(label) -> str | None:
    """The gold answer string of a math label (string/number, list = first, or a dict holding it)."""
    if isinstance(label, dict):
        for key in ("answer", "ground_truth", "label", "gold"):
            if key in label:
                return math_gold(label[key])
        raise ValueError(f"math label dict has none of answer/ground_truth/label/gold: {label!r}")
    if isinstance(label, (list, tuple)):
        return math_gold(label[0]) if label else None
    return None if label is None else str(label)
