"""Environments (``--env-path``): what answers a model turn in a multi-turn rollout.

    class MyEnv:                                   # or a function step(conversation) -> Step
        def __init__(self, **options): ...         # --env-args key=value ...
        def step(self, conversation: Conversation) -> Step: ...

After every model turn the loop (``loop.py``) hands the environment the conversation so far; it
returns the next observation (text the model reads, e.g. a tool's output), or ``done`` with the
trace's reward. A reward of ``None`` leaves scoring to the run's reward (``--rm-type`` /
``--custom-rm-path``, reading the last model turn). ``tool_calls`` / ``tool_errors`` feed the
rollout's metrics. ``ToolEnvironment`` is the usual base: it parses the turn's tool calls
(``--tool-parser``), runs each named tool under a time limit and answers with their outputs;
a turn without a call ends the episode.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Callable

from ..samples.data import Prompt
from ..samples.plugins import build_plugin, load_dotted
from .parser import ToolCall, qwen25
from .tools import ToolError, run_tool

FLAG = "--env-path"


@dataclasses.dataclass
class Conversation:
    """One sample's episode so far: the prompt, then model turns and observations alternating
    (``turns[k]`` is answered by ``observations[k]`` when there is one)."""

    prompt: Prompt
    turns: list[str]  # the model's turns, decoded
    observations: list[str]  # what the environment answered
    sample_index: int = 0  # which of the prompt's n samples

    @property
    def last_turn(self) -> str:
        return self.turns[-1]


@dataclasses.dataclass
class Step:
    observation: str | None = None  # the next turn's input; None (or done) ends the episode
    done: bool = False
    reward: float | None = None  # the episode's reward when done (None: the run's reward)
    tool_calls: int = 0  # calls made in this turn (metrics)
    tool_errors: int = 0  # of which malformed or failed

    @property
    def finished(self) -> bool:
        return self.done or self.observation is None


class ToolEnvironment:
    """Tool use: each ``<tool_call>`` of a turn runs its tool (``tools``: name -> function of
    keyword arguments) and the outputs, one ``<tool_response>`` each, are the observation; a
    malformed call or a failing tool answers with its error. A turn without a call is the final
    answer: ``reward(conversation)`` scores it (None: the run's reward)."""

    tools: dict[str, Callable] = {}
    time_limit: float = 5.0  # seconds per tool call

    def __init__(self, parser: Callable[[str], list[ToolCall]] = qwen25):
        self.parser = parser

    def step(self, conversation: Conversation) -> Step:
        calls = self.parser(conversation.last_turn)
        if not calls:
            return Step(done=True, reward=self.reward(conversation))
        outputs = [self.call(c) for c in calls]
        errors = sum(isinstance(o, ToolError) for o in outputs)
        return Step("\n".join(self.format_output(o) for o in outputs),
                    tool_calls=len(calls), tool_errors=errors)

    def call(self, call: ToolCall) -> "str | ToolError":
        if not call.ok:
            return ToolError(call.error)
        if call.name not in self.tools:
            return ToolError(f"unknown tool {call.name!r}; tools: {', '.join(sorted(self.tools))}")
        try:
            return run_tool(self.tools[call.name], call.arguments, self.time_limit)
        except ToolError as e:
            return e

    @staticmethod
    def format_output(output: "str | ToolError") -> str:
        text = f"Error: {output}" if isinstance(output, ToolError) else output
        return f"<tool_response>\n{text}\n</tool_response>"

    def reward(self, conversation: Conversation) -> float | None:
        return None


def load_environment(path: str, options: dict, parser=None):
    """The environment's ``step`` callable: a function, or a class built with ``options`` (and
    the ``--tool-parser`` when its constructor takes ``parser``)."""
    obj = load_dotted(path, FLAG)
    env = build_plugin(obj, f"{FLAG} {path!r}", options, "--env-args", parser=parser)
    if not inspect.isclass(obj):
        return env
    if not callable(getattr(env, "step", None)):
        raise ValueError(f"{FLAG} {path!r}: the class has no step(conversation) method")
    _check_reward(obj, path)
    return env.step


def _check_reward(cls: type, path: str) -> None:
    """A tool environment without its own ``reward`` used to run to the end (exit 0), every
    final answer scored by the run's reward, by default ``--rm-type math``, which knows nothing
    of the task: refused at load time, naming the class. ``return None`` in a ``reward`` of its
    own still hands scoring to the run's reward, on purpose."""
    if issubclass(cls, ToolEnvironment) and cls.reward is ToolEnvironment.reward:
        raise ValueError(f"{FLAG} {path!r}: {cls.__name__} defines no reward(conversation): a "
                         f"turn without a tool call is the final answer and must be scored; "
                         f"define reward (return None to score with --rm-type / --custom-rm-path)")
