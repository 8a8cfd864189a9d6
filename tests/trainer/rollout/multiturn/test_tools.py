"""The tool-call parser (well-formed, malformed, several calls) and the calculator (an AST
whitelist: names, attributes and calls refused; a time limit on every tool)."""

import threading
import time

import pytest

from trainer.rollout.multiturn.environment import Conversation, ToolEnvironment
from trainer.rollout.multiturn.parser import load_parser, qwen25
from trainer.rollout.multiturn.tools import ToolError, bounded, calculator, run_tool
from trainer.rollout.samples.data import Prompt


def test_parser_reads_a_well_formed_call():
    text = 'I will compute.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "2*3"}}\n</tool_call>'
    (call,) = qwen25(text)
    assert call.ok and call.name == "calculator" and call.arguments == {"expression": "2*3"}


def test_parser_reads_several_calls_in_order():
    text = ('<tool_call>{"name": "a", "arguments": {"x": 1}}</tool_call> and '
            '<tool_call>{"name": "b", "arguments": "{\\"y\\": 2}"}</tool_call>')
    calls = qwen25(text)
    assert [(c.name, c.arguments) for c in calls] == [("a", {"x": 1}), ("b", {"y": 2})]


@pytest.mark.parametrize("text, why", [
    ('<tool_call>{"name": "a", "arguments": {"x": 1}', "not closed"),
    ("<tool_call>{name: a}</tool_call>", "not valid JSON"),
    ('<tool_call>["a", 1]</tool_call>', '"name"'),
    ('<tool_call>{"name": "a", "arguments": [1]}</tool_call>', "JSON object"),
])
def test_parser_reports_malformed_calls(text, why):
    (call,) = qwen25(text)
    assert not call.ok and why in call.error


def test_no_call_is_no_call():
    assert qwen25("The answer is \\boxed{6}.") == []


def test_parser_flag():
    assert load_parser("qwen25") is qwen25
    with pytest.raises(ValueError, match="--tool-parser"):
        load_parser("nonesuch")


@pytest.mark.parametrize("expr, value", [("2 * 3 + 4", "10"), ("347 * 829 + 12", "287675"),
                                         ("7 / 2", "3.5"), ("8 / 2", "4"), ("-(3 - 5) ** 3", "8"),
                                         ("17 // 5 + 17 % 5", "5")])
def test_calculator_evaluates_arithmetic(expr, value):
    assert calculator(expr) == value


@pytest.mark.parametrize("expr", ["__import__('os').system('true')", "x + 1", "(1).real",
                                  "abs(-1)", "[1, 2]", "'a' * 3", "lambda: 1", "1 if 1 else 2"])
def test_calculator_refuses_anything_but_arithmetic(expr):
    with pytest.raises(ToolError):
        calculator(expr)


def test_calculator_bounds_its_work():
    with pytest.raises(ToolError, match="exponent"):
        calculator("9 ** 9 ** 9")
    with pytest.raises(ToolError, match="zero"):
        calculator("1 / 0")
    with pytest.raises(ToolError, match="longer"):
        calculator("1 + " * 100 + "1")


def test_a_tool_runs_under_a_time_limit():
    release = threading.Event()
    with pytest.raises(ToolError, match="longer than 0.05 s"):
        run_tool(lambda: release.wait(30), {}, seconds=0.05)
    release.set()
    with pytest.raises(ToolError, match="bad arguments"):
        run_tool(calculator, {"expr": "1"})


def test_a_bounded_tool_runs_on_the_callers_thread_under_the_same_limit():
    """``@bounded`` (the calculator): no thread hop, the same answers and errors, and a result
    that came after the limit is refused as the pool would refuse it."""
    threads = []

    @bounded
    def where(delay: float = 0.0) -> str:
        threads.append(threading.current_thread())
        time.sleep(delay)
        return "here"

    assert run_tool(where, {}) == "here" and threads == [threading.current_thread()]
    with pytest.raises(ToolError, match="longer than 0.001 s"):
        run_tool(where, {"delay": 0.05}, seconds=0.001)
    with pytest.raises(ToolError, match="bad arguments"):
        run_tool(where, {"nope": 1})
    assert run_tool(calculator, {"expression": "6 * 7"}) == "42"
    with pytest.raises(ToolError, match="division by zero"):
        run_tool(calculator, {"expression": "1 / 0"})


def test_concurrent_episodes_tools_run_at_once_not_queued():
    """As many episodes' tool calls as the environment runs at once each get a thread at once:
    32 calls that can only finish together (a barrier of 32) all answer, none spends its limit
    queued behind the others."""
    parties = 32
    barrier = threading.Barrier(parties)
    results: list = []

    def call():
        try:
            results.append(run_tool(lambda: barrier.wait(timeout=20) >= 0, {}, seconds=30))
        except ToolError as e:
            results.append(e)

    threads = [threading.Thread(target=call) for _ in range(parties)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == ["True"] * parties


class _Calc(ToolEnvironment):
    tools = {"calculator": calculator}


def _step(text):
    return _Calc().step(Conversation(Prompt("q", [1], "6", {}), [text], []))


def test_environment_answers_calls_and_errors_without_raising():
    ok = _step('<tool_call>{"name": "calculator", "arguments": {"expression": "2*3"}}</tool_call>')
    assert ok.observation == "<tool_response>\n6\n</tool_response>" and not ok.finished
    assert (ok.tool_calls, ok.tool_errors) == (1, 0)
    bad = _step('<tool_call>{"name": "calculator", "arguments": {"expression": "os.system(1)"}}'
                '</tool_call><tool_call>{"name": "search"}</tool_call><tool_call>oops')
    assert (bad.tool_calls, bad.tool_errors) == (3, 3) and not bad.finished
    assert bad.observation.count("<tool_response>\nError: ") == 3
    assert "unknown tool 'search'" in bad.observation and "not closed" in bad.observation
    done = _step("\\boxed{6}")
    assert done.finished and done.reward is None
