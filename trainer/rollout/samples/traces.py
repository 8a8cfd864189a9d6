"""What a rollout hands the learner: traces of LM calls.

A *call* is one request to the engine: its prompt tokens, the generated tokens and their
sampler log-probs. It is what gets trained. A *trace* is what gets a reward and an advantage:
one call by default (a sample), several with a generate plug-in (APR: a parent thread and its
children; all of them get the trace's advantage). Traces are compared within their *group*
(GRPO's baseline): by default the samples of one prompt.
"""

from __future__ import annotations

import dataclasses

from ..engines.interface import Generation


@dataclasses.dataclass
class Call:
    prompt_ids: list[int]
    gen: Generation
    loss_weight: float = 1.0  # APR: 1 / calls of the trace, so every trace weighs the same
    kl_coef: float | None = None  # None = --kl-loss-coef (RC: thinking vs summary tokens)
    role: str = "sample"  # what the call was for (reasoning, summary, parent, child, ...)


@dataclasses.dataclass
class Trace:
    calls: list[Call]
    text: str  # what the reward reads
    prompt_index: int  # the rollout's prompt it answers (global index)
    group: object = None  # advantage group label; None = the prompt
    reward: float | None = None  # set by a plug-in that scores itself; else the reward model
    final: bool = True  # counts as the answer in eval scores (RC: the last round only)
    meta: dict = dataclasses.field(default_factory=dict)

    @property
    def group_label(self) -> object:
        return ("prompt", self.prompt_index) if self.group is None else self.group


def sample_traces(prompt_ids: list[list[int]], gens: list[Generation], n: int) -> list[Trace]:
    """The default: each of the ``n`` samples of a prompt is a one-call trace."""
    return [Trace([Call(prompt_ids[i // n], g)], g.text, i // n) for i, g in enumerate(gens)]
