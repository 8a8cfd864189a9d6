"""The engine's per-request compression counters (``meta["compression"]``): how several
requests' counters combine into one sample's (a multi-turn episode's turns), and the rollout's
KV metrics over its samples. One place knows which counters add up and which peak."""

from __future__ import annotations

SUMMED = ("num_compressions", "tokens_evicted")  # over a sample's requests: they add up
PEAKS = ("peak_kv_slots",)  # over a sample's requests: the largest


def combined(comps: list[dict]) -> dict:
    """One sample's counters from those of its requests (e.g. the turns of one episode)."""
    out = {k: sum(c.get(k, 0) for c in comps) for k in SUMMED}
    out.update({k: max(c.get(k, 0) for c in comps) for k in PEAKS})
    return out


def compression_stats(gens) -> dict:
    """Per-sample means of the counters, the largest peak, and the replay's exactness."""
    comp = [g.meta["compression"] for g in gens if g.meta.get("compression")]
    if not comp:
        return {}
    mean = lambda key: sum(c.get(key, 0) for c in comp) / len(comp)  # noqa: E731
    return {"kv_compressions_per_sample": mean("num_compressions"),
            "kv_tokens_evicted_per_sample": mean("tokens_evicted"),
            "kv_peak_slots_per_sample": mean("peak_kv_slots"),
            "kv_peak_slots_max": float(max(c.get("peak_kv_slots", 0) for c in comp)),
            **replay_stats(gens)}


def replay_stats(gens) -> dict:
    """Eviction replay: the fraction of records the engine could not make exact (a sample
    preempted after an eviction is recomputed densely; its replay is then approximate)."""
    flags = [g.meta.get("eviction_record_exact") for g in gens if g.eviction_record is not None]
    return {"eviction_records_inexact": sum(not f for f in flags) / len(flags)} if flags else {}
