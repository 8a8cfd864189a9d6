"""Weight versions of samples: which versions generated each token, how far a trained sample
lags the weights it trains (its staleness), and the bound on it.

The trainer pushes weights as ``rollout-<k>`` after k updates; an engine reports the version of
each response in ``meta_info.weight_version`` and a resumed partial rollout carries one version
per token (``Generation.token_versions``). A sample trained at step r (the trainer then holds
version r) has staleness r - (the oldest version among its tokens), AReaL's head
off-policyness.
"""

from __future__ import annotations

from collections import Counter

from ..engines.interface import Generation

PREFIX = "rollout-"


def version_number(version: str | None, default: int) -> int:
    """``rollout-<k>`` -> k; an engine's own initial version (e.g. ``default``) -> ``default``."""
    if version and version.startswith(PREFIX) and version[len(PREFIX):].isdigit():
        return int(version[len(PREFIX):])
    return default


def token_versions(gen: Generation, default: int) -> list[int]:
    """The version behind each response token (one version unless the sample was resumed)."""
    if gen.token_versions is not None:
        return list(gen.token_versions)
    return [version_number(gen.weight_version, default)] * len(gen.response_ids)


def head_version(gen: Generation, default: int) -> int:
    """The version the sample started under (its oldest; a resumed sample interrupted before
    its first token keeps the version it was submitted under in ``meta['start_version']``)."""
    if "start_version" in gen.meta:
        return int(gen.meta["start_version"])
    versions = token_versions(gen, default)
    return min(versions) if versions else version_number(gen.weight_version, default)


def staleness(gens: list[Generation], trained_at: int, default: int) -> list[int]:
    return [trained_at - head_version(g, default) for g in gens]


def check_bound(lags: list[int], bound: int, rollout_id: int) -> None:
    """A sample beyond the bound is a bug in the scheduling, never silently trained."""
    worst = max(lags, default=0)
    if worst > bound:
        raise RuntimeError(f"rollout {rollout_id}: a sample lags {worst} weight versions, "
                           f"beyond --max-staleness {bound}")


def staleness_metrics(gens: list[Generation], lags: list[int], default: int) -> dict:
    """Mean, max and the distribution (fraction of samples at each lag), resumed samples."""
    n = max(1, len(lags))
    out = {"rollout/staleness_mean": sum(lags) / n, "rollout/staleness_max": float(max(lags, default=0)),
           "rollout/partial_samples": float(sum(len(set(token_versions(g, default))) > 1
                                                for g in gens))}
    for lag, count in sorted(Counter(lags).items()):
        out[f"rollout/staleness_{lag}"] = count / n
    return out


def rollout_staleness(gens: list[Generation], rollout_id: int, bound: int, default: int) -> dict:
    """The metrics of a rollout trained at version ``rollout_id``, after checking the bound."""
    lags = staleness(gens, rollout_id, default)
    check_bound(lags, bound, rollout_id)
    return staleness_metrics(gens, lags, default)
