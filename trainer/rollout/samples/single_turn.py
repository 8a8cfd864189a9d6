"""The default generate plug-in: ``n`` samples of each prompt, all in one engine batch, each a
one-call trace. Its siblings: a user's ``--custom-generate-function-path`` and the multi-turn
episodes of ``--env-path`` (``multiturn/loop.py``)."""

from __future__ import annotations

from .data import Prompt
from .plugin_base import GeneratePlugin
from .traces import Trace, sample_traces


class SingleTurn(GeneratePlugin):
    """One call per sample; the engines seed sample ``k`` of the shard ``seed + k``."""

    def __call__(self, ctx, prompts: list[Prompt], n: int) -> list[Trace]:
        ids = [p.input_ids for p in prompts]
        return sample_traces(ids, ctx.backend.generate(ids, n, ctx.cfg), n)
