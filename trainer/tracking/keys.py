"""Which metric is which, by its key: the groups the plots and the summary draw (the package's
text lists them) and the time phases; a key's series over the logged rows."""

from __future__ import annotations

import math

REWARD_KEYS = ("reward_mean", "raw_reward_mean", "accuracy")
RESPONSE_LENGTH_PREFIXES = ("response_length", "response_len")
MISMATCH_KEYS = ("train_rollout_logprob_abs_diff", "kl_sparse_old", "kl", "k3_kl", "log_ppl_abs_diff")
TIME_PHASES = ("rollout", "recompute", "update", "sync")


def base_name(key: str) -> str:
    return key.rsplit("/", 1)[-1]


def is_eval(key: str) -> bool:
    return key.startswith("eval/")


def is_reward(key: str) -> bool:
    return base_name(key) in REWARD_KEYS and not is_eval(key)


def is_response_length(key: str) -> bool:
    return base_name(key).startswith(RESPONSE_LENGTH_PREFIXES) and not is_eval(key)


def is_mismatch(key: str) -> bool:
    return base_name(key) in MISMATCH_KEYS


def is_fraction(key: str) -> bool:
    return "fraction" in key


# a multi-turn rollout's shape (trainer/rollout/multiturn/stats.py): what the tool task learns
EPISODE_KEYS = ("turns_per_sample", "tool_calls_per_sample", "tool_errors_per_sample")


def is_episode(key: str) -> bool:
    return base_name(key) in EPISODE_KEYS and not is_eval(key)


def is_kv(key: str) -> bool:
    return base_name(key).startswith("kv_")


# whole-step timers: summing them with the phases would count the same seconds twice
_NOT_PHASES = ("total", "step", "wall", "elapsed", "iteration")


def time_phase(key: str) -> str | None:
    """The phase a timing key measures (``time/rollout``, ``time_rollout``, ``rollout_time``)."""
    base = base_name(key)
    if key.startswith("time/"):
        phase = key[len("time/"):]
    elif base.startswith("time_"):
        phase = base[len("time_"):]
    elif base.endswith("_time"):
        phase = base[:-len("_time")]
    else:
        return None
    return phase if phase and phase not in _NOT_PHASES else None


def key_series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for row in rows:
        v = row.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            xs.append(row["step"])
            ys.append(float(v))
    return xs, ys
