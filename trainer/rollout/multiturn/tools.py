"""Tools an environment calls, and the time limit every call runs under.

``run_tool(fn, arguments, seconds)`` returns the tool's text or raises ``ToolError`` (a bad
argument, a failure, or the time limit), which the environment turns into an error observation.
A tool runs on a thread of the tool pool, so that one that hangs is abandoned at its limit; a
tool marked ``@bounded`` (its work is bounded by its inputs' limits) runs on the caller's thread.
Model text is never ``exec``'d or ``eval``'d: the calculator walks the expression's syntax tree
through a whitelist of number literals and arithmetic operators.
"""

from __future__ import annotations

import ast
import concurrent.futures
import operator
import time

# A tool that overruns its limit is abandoned (a thread cannot be killed), so every tool here
# also bounds its own work (the calculator's operand sizes); the pool only keeps the loop going.
# As many workers as environment steps run at once (runner.ENV_WORKERS): a call queued behind
# other episodes' calls would spend its time limit waiting for a thread.
TOOL_WORKERS = 64
_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=TOOL_WORKERS, thread_name_prefix="tool")


class ToolError(Exception):
    """A tool call that gave no result; the message goes back to the model."""


def bounded(fn):
    """Marks a tool that bounds its own work (no argument makes it run long, e.g. the
    calculator's operand limits): ``run_tool`` calls it on the caller's thread, sparing the
    thread hop, and still refuses a result that came later than the limit."""
    fn.bounded_work = True
    return fn


def run_tool(fn, arguments: dict, seconds: float = 5.0) -> str:
    """``fn(**arguments)`` as text, within ``seconds``."""
    if getattr(fn, "bounded_work", False):
        return _inline(fn, arguments, seconds)
    future = _POOL.submit(fn, **arguments)
    try:
        return str(future.result(timeout=seconds))
    except concurrent.futures.TimeoutError:
        future.cancel()
        raise ToolError(f"the tool took longer than {seconds:g} s") from None
    except Exception as e:  # noqa: BLE001 - a tool's failure is the model's observation
        raise _as_tool_error(e) from None


def _inline(fn, arguments: dict, seconds: float) -> str:
    begin = time.perf_counter()
    try:
        out = str(fn(**arguments))
    except Exception as e:  # noqa: BLE001 - a tool's failure is the model's observation
        raise _as_tool_error(e) from None
    if time.perf_counter() - begin > seconds:
        raise ToolError(f"the tool took longer than {seconds:g} s")
    return out


def _as_tool_error(e: Exception) -> ToolError:
    if isinstance(e, ToolError):
        return e
    if isinstance(e, TypeError):  # wrong or missing argument names
        return ToolError(f"bad arguments: {e}")
    return ToolError(f"{type(e).__name__}: {e}")


_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
           ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
MAX_EXPRESSION_CHARS = 200
MAX_EXPONENT = 100
MAX_MAGNITUDE = 10 ** 30


@bounded
def calculator(expression: str) -> str:
    """The value of an arithmetic ``expression`` (numbers, + - * / // % **, parentheses);
    integers stay exact, a whole quotient prints without ``.0``."""
    if not isinstance(expression, str):
        raise ToolError("expression must be a string")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ToolError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise ToolError(f"not an arithmetic expression: {expression!r}") from None
    value = _evaluate(tree.body)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)


def _evaluate(node: ast.AST):
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ToolError(f"exponent larger than {MAX_EXPONENT}")
        return _bounded(_apply(_BINARY[type(node.op)], left, right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    raise ToolError(f"not allowed in an expression: {type(node).__name__}")


def _apply(op, left, right):
    try:
        return op(left, right)
    except ZeroDivisionError:
        raise ToolError("division by zero") from None


def _bounded(value):
    if isinstance(value, complex):
        raise ToolError("the result is not a real number")
    if abs(value) > MAX_MAGNITUDE:
        raise ToolError("result too large")
    return value
