"""Tool use with a hidden table: the ``lookup-tool`` task's environment.

    --env-path recipes.lookup_tool:LookupToolEnv --max-turns 5 [--env-args time_limit=2]

Data: ``python -m dataset.lookup_tool`` (an order of two to four items; each row's price list,
``table``, is in the row but not in the prompt). Two tools, in Qwen2.5's ``<tool_call>`` format:
``lookup(item)`` reads the row's price (a plural or another case of the name is accepted; an
item not on the list is an error the model reads) and ``calculator(expression)``. The turn
without a call is the answer, scored by ``evaluation.grader.score_arithmetic`` (the boxed
total against the label). Run: ``./scripts/quickstart.sh --task lookup-tool`` (CPU, tiny model)
or ``TASK=lookup_tool scripts/run-smollm2-tool.sh`` (SmolLM2, GPU). docs/environments.md.
"""

from __future__ import annotations

import functools

from trainer.rollout.multiturn.environment import Conversation, Step, ToolEnvironment
from trainer.rollout.multiturn.parser import ToolCall, qwen25
from trainer.rollout.multiturn.tools import ToolError, calculator, run_tool


def lookup(table: dict, item: str) -> str:
    """``item``'s price in ``table`` (case and a plural ``s`` forgiven)."""
    if not isinstance(item, str):
        raise ToolError("item must be a string")
    key = item.strip().lower()
    for name in (key, key[:-1] if key.endswith("s") else key):
        if name in table:
            return str(table[name])
    raise ToolError(f"no item {item!r} on the price list")


class LookupToolEnv(ToolEnvironment):
    """``lookup`` over the row's own price list and a calculator; 1.0 for the right boxed total."""

    tools = {"calculator": calculator, "lookup": None}  # lookup is bound to each row's table

    def __init__(self, parser=qwen25, time_limit: float = 5.0):
        super().__init__(parser)
        self.time_limit = time_limit

    def step(self, conversation: Conversation) -> Step:
        # reason: the base class's tools are shared by every episode; this one's lookup reads
        # the conversation's own table, so its calls are resolved here (nothing stored on self:
        # episodes may step concurrently)
        calls = self.parser(conversation.last_turn)
        if not calls:
            return Step(done=True, reward=self.reward(conversation))
        tools = {**self.tools, "lookup": functools.partial(lookup, price_table(conversation))}
        outputs = [self.run(call, tools) for call in calls]
        errors = sum(isinstance(o, ToolError) for o in outputs)
        return Step("\n".join(self.format_output(o) for o in outputs), tool_calls=len(calls), tool_errors=errors)

    def run(self, call: ToolCall, tools: dict) -> "str | ToolError":
        if not call.ok:
            return ToolError(call.error)
        if call.name not in tools:
            return ToolError(f"unknown tool {call.name!r}; tools: {', '.join(sorted(tools))}")
        try:
            return run_tool(tools[call.name], call.arguments, self.time_limit)
        except ToolError as e:
            return e

    def reward(self, conversation: Conversation) -> float:
        from evaluation.grader import score_arithmetic

        return score_arithmetic(conversation.last_turn, conversation.prompt.label)


def price_table(conversation: Conversation) -> dict:
    table = (conversation.prompt.metadata or {}).get("table")
    if not isinstance(table, dict):
        raise ValueError("lookup-tool: the prompt's row has no 'table' (write the data with "
                         "python -m dataset.lookup_tool)")
    return table
