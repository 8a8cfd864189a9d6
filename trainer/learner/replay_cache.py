"""One rollout's eviction masks, built once and shared by every pass that packs them alike.

A rollout replays the same samples up to three times: the reference's forward (KL), the π_old
recompute and the update, and on-policy (one optimizer step) the three pack the same
micro-batches (same samples, order, padding and device). Within ``shared_replay_masks`` such
packs share one ``EvictionMasks``: the records are copied to the device, and every layer's block
tiles classified, once. Leaving the scope drops them all (the loop opens one per rollout), so
nothing outlives its rollout; outside a scope every pack builds its own, as before.

Only the compact, per-pack state is kept (the pack's evict tensor and its tiles at KV-head
granularity, int16: ~10 MB for a 16k-token pack of the 0.5B shape); the per-layer ``BlockMask``
tensors expanded to query heads (~90 MB there) live with one pass's ``PackedBatch`` only.
"""

from __future__ import annotations

import contextlib
from typing import Callable

_active: dict | None = None  # key -> (the pack's samples and records, EvictionMasks)
stats = {"built": 0, "reused": 0}  # over the process's life (tests, benchmarks)


@contextlib.contextmanager
def shared_replay_masks():
    """Packs of the same samples share their eviction masks until the scope ends (a nested
    scope is the outer one's)."""
    global _active
    if _active is not None:
        yield
        return
    _active = {}
    try:
        yield
    finally:
        _active = None


def _identity(sample) -> tuple:
    """What a sample's part of a pack depends on: the object, its length, its record and where
    the engine recomputed it densely (pack order: the key is a tuple of these)."""
    return id(sample), sample.length, id(sample.eviction_record), sample.eviction_dense_from


def cached_masks(samples: list, extra: tuple, build: Callable):
    """``build()``, or the masks an earlier pack of the same ``samples`` (in this order, with
    the same ``extra``: padding, device) built in this scope."""
    if _active is None:
        stats["built"] += 1
        return build()
    key = (tuple(_identity(s) for s in samples), extra)
    entry = _active.get(key)
    if entry is None:  # the entry holds the samples and records: their ids stay theirs
        entry = _active[key] = ([(s, s.eviction_record) for s in samples], build())
        stats["built"] += 1
    else:
        stats["reused"] += 1
    return entry[1]
