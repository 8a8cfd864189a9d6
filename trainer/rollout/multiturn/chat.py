"""Observations as tokens: what goes into the context between two model turns, rendered by the
tokenizer's own chat template so a multi-turn sample reads exactly as a chat would.

A model turn ends with the template's end-of-turn token (``<|im_end|>``); the observation is the
rest of that turn's closing (``\\n``), the observation message (``<|im_start|>user\\n...<|im_end|>\\n``)
and the next turn's header (``<|im_start|>assistant\\n``). Token ids are concatenated, never
re-tokenised, so the trainer sees the very tokens the sampler saw.
"""

from __future__ import annotations

import dataclasses

_TURN, _OBS = "\x00TURN\x00", "\x00OBSERVATION\x00"  # markers no template produces itself


@dataclasses.dataclass(frozen=True)
class ObservationFormat:
    turn_closer: str  # what the template puts after an assistant message's content
    before: str  # the observation message up to its content
    after: str  # after its content, with the next assistant turn's header

    def render(self, turn_text: str, observation: str) -> str:
        """The text between the model turn ``turn_text`` and the next one: the part of the
        closer the model did not write itself (it usually ends with the end-of-turn token)."""
        return self._rest_of_closer(turn_text) + self.before + observation + self.after

    def _rest_of_closer(self, turn_text: str) -> str:
        for k in range(len(self.turn_closer), 0, -1):
            if turn_text.endswith(self.turn_closer[:k]):
                return self.turn_closer[k:]
        return self.turn_closer


PLAIN = ObservationFormat("\n", "", "\n")  # a tokenizer without a chat template


def observation_format(tokenizer, role: str = "user") -> ObservationFormat:
    """The template's rendering of an observation message of ``role`` after an assistant turn."""
    if not getattr(tokenizer, "chat_template", None):
        return PLAIN
    chat = [{"role": "user", "content": "question"}, {"role": "assistant", "content": _TURN}]
    base = tokenizer.apply_chat_template(chat, tokenize=False)
    full = tokenizer.apply_chat_template(chat + [{"role": role, "content": _OBS}], tokenize=False,
                                         add_generation_prompt=True)
    if not full.startswith(base) or _OBS not in full[len(base):]:
        raise ValueError("the tokenizer's chat template does not render a conversation as the "
                         "prefix of its continuation; multi-turn rollouts need one that does")
    before, after = full[len(base):].split(_OBS)
    return ObservationFormat(base[base.rindex(_TURN) + len(_TURN):], before, after)
