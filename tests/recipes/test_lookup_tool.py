"""recipes.lookup_tool: the lookup tool reads the conversation's own price list, the calculator
totals, and the boxed total is scored against hand-computed answers."""

from __future__ import annotations

import pytest

from dataset.arith_tool import tool_call
from dataset.lookup_tool import lookup_call, lookup_tool_rows
from recipes.lookup_tool import LookupToolEnv
from trainer.rollout.multiturn.environment import Conversation
from trainer.rollout.samples.data import Prompt

TABLE = {"pear": 23, "plum": 41, "kiwi": 57}


def _conversation(turns, table=TABLE, label="356"):  # 3 pears and 7 plums: 3 * 23 + 7 * 41 = 356
    return Conversation(Prompt("", [1], label, {"table": table}), list(turns), [])


def test_lookups_read_this_rows_table():
    step = LookupToolEnv().step(_conversation([lookup_call("pear") + "\n" + lookup_call("Plums")]))
    assert step.observation == "<tool_response>\n23\n</tool_response>\n<tool_response>\n41\n</tool_response>"
    assert (step.tool_calls, step.tool_errors, step.done) == (2, 0, False)
    other = LookupToolEnv().step(_conversation([lookup_call("pear")], table={"pear": 88}))
    assert other.observation == "<tool_response>\n88\n</tool_response>"


def test_unknown_items_and_tools_are_errors_the_model_reads():
    step = LookupToolEnv().step(_conversation([lookup_call("apple") + tool_call("3 * 23")]))
    assert step.observation.startswith("<tool_response>\nError: no item 'apple' on the price list")
    assert step.observation.endswith("<tool_response>\n69\n</tool_response>") and step.tool_errors == 1
    bad = LookupToolEnv().step(_conversation(['<tool_call>\n{"name": "search", "arguments": {}}\n</tool_call>']))
    assert "unknown tool 'search'; tools: calculator, lookup" in bad.observation


@pytest.mark.parametrize("answer, reward", [("\\boxed{356}", 1.0), ("\\boxed{355}", 0.0), ("I cannot tell.", 0.0)])
def test_the_answer_turn_is_scored(answer, reward):
    step = LookupToolEnv().step(_conversation([lookup_call("pear"), tool_call("3 * 23 + 7 * 41"), answer]))
    assert step.done and step.reward == reward


def test_the_worked_episodes_reach_full_reward():
    """Replaying a row's solution turns: the environment answers each with the row's own
    observations (prices from the table, the total from the calculator) and scores 1.0."""
    env = LookupToolEnv()
    for row in lookup_tool_rows(20, seed=5):
        prompt = Prompt("", [1], row["label"], {"table": row["table"]})
        turns = row["solution_turns"]
        for k in range(len(turns)):
            step = env.step(Conversation(prompt, turns[: k + 1], []))
            if k < len(turns) - 1:
                assert step.observation == row["observations"][k]
        assert step.done and step.reward == 1.0


def test_a_row_without_a_table_is_a_clear_error():
    with pytest.raises(ValueError, match="no 'table'"):
        LookupToolEnv().step(Conversation(Prompt("", [1], "1", {}), [lookup_call("pear")], []))
