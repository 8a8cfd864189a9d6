"""A multi-turn rollout's metrics, from its traces' ``meta`` (``Episode.stats``)."""

from __future__ import annotations


def episode_stats(traces) -> dict:
    """``rollout/turns_per_sample``, tool calls and errors per sample, the share of calls that
    failed, the environment's seconds (tools included) per sample, observation tokens per sample, and the share of the context (prompt, turns and
    observations) that the model wrote. Empty when no trace is an episode."""
    eps = [t.meta for t in traces if "turns" in t.meta]
    if not eps:
        return {}
    total = lambda key: float(sum(m[key] for m in eps))  # noqa: E731
    context = total("prompt_tokens") + total("model_tokens") + total("observation_tokens")
    return {"rollout/turns_per_sample": total("turns") / len(eps),
            "rollout/tool_calls_per_sample": total("tool_calls") / len(eps),
            "rollout/tool_errors_per_sample": total("tool_errors") / len(eps),
            "rollout/tool_error_fraction": total("tool_errors") / max(total("tool_calls"), 1.0),
            "rollout/env_s_per_sample": total("env_seconds") / len(eps),
            "rollout/observation_tokens_per_sample": total("observation_tokens") / len(eps),
            "rollout/model_token_share": total("model_tokens") / max(context, 1.0)}
