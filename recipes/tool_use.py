"""Tool use: the ``arith-tool`` task's environment, a calculator behind Qwen2.5's tool calls.

    --env-path recipes.tool_use:ArithToolEnv --max-turns 3 [--env-args time_limit=2]

Data: ``python -m dataset.arith_tool`` (``a * b + c`` with three-digit ``a``, ``b``). The model
calls ``calculator`` with an expression (evaluated through an AST whitelist, never ``eval``);
the turn without a call is its answer, scored by ``evaluation.grader.score_arithmetic`` (the
boxed value against the label). Run: ``./scripts/quickstart.sh --task arith-tool`` (CPU, tiny
model) or ``scripts/run-smollm2-tool.sh`` (SmolLM2, GPU). Writing another environment:
docs/environments.md.
"""

from __future__ import annotations

from trainer.rollout.multiturn.environment import Conversation, ToolEnvironment
from trainer.rollout.multiturn.parser import qwen25
from trainer.rollout.multiturn.tools import calculator


class ArithToolEnv(ToolEnvironment):
    """A calculator; 1.0 for the right boxed value, else 0.0."""

    tools = {"calculator": calculator}

    def __init__(self, parser=qwen25, time_limit: float = 5.0):
        super().__init__(parser)
        self.time_limit = time_limit

    def reward(self, conversation: Conversation) -> float:
        from evaluation.grader import score_arithmetic

        return score_arithmetic(conversation.last_turn, conversation.prompt.label)
