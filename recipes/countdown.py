"""Countdown (TinyZero / single-file GRPO trainers) as ``--custom-rm-path`` plug-ins.

    --custom-rm-path recipes.countdown:reward          # base 0.0 / format 0.1 / correct 1.0
    --custom-rm-path recipes.countdown:reward_binary   # 0.0 / 1.0 (no format credit)

Data: ``python -m dataset.countdown_r1`` (``scripts/run-countdown.sh`` writes it when missing).
The scoring rule itself lives in ``evaluation.grader.score_countdown_r1``.
"""

from __future__ import annotations

from evaluation.grader import score_countdown_r1

FORMAT_SCORE = 0.1


def reward(sample) -> float:
    """A ``RewardInput``'s reward: 1.0 correct, 0.1 a well-tagged wrong answer, 0.0 no answer."""
    return score_countdown_r1(sample.response, sample.label, format_score=FORMAT_SCORE)


def reward_binary(sample) -> float:
    return score_countdown_r1(sample.response, sample.label, format_score=0.0)
