"""The eviction record: which keys every query of a sample attended to, per layer and KV head.

A request that asks for it (`return_eviction_record`) gets back, when it finishes, one integer
tensor `evict_at` of shape [layers, kv_heads, length] (length = prompt + output tokens):

    query q sees key k (in layer l, KV head h)  iff  k <= q < evict_at[l, h, k]

`evict_at[l, h, k]` is the position of the first query that no longer sees key k: the position
fed by the first step after the compaction that dropped it (the prefill's queries always saw the
whole causal prompt; a prompt compressed at prefill is first seen compressed by the query at
position P, the first decode step). Keys never evicted hold `length`. The sampled token at
position t + 1 was drawn from the logits of query t, so this mask reproduces every decode step.

The engine tracks it cheaply: only at compactions. Between compactions a request's slot-table
row j holds (for every layer and head) `kept[l, h, j]` for j < k and the contiguous positions
`tail_start + (j - k)` after that, so the row -> position map is rebuilt from two facts.

A request preempted after an eviction (compressed requests are only preempted once they
stopped compressing after `</think>`, or by `pause_generation(mode="retract")`) is recomputed
densely when readmitted: from the query that samples its next token on (position `dense_from` =
prompt + tokens sampled - 1, meta_info `eviction_record_dense_from`) its tokens come from a
forward in which every earlier position's K/V was recomputed with full attention. No mask over
one forward reproduces both parts; the replay takes the masked forward for queries before
`dense_from` and a dense one after (the trainer packs such a sample twice). A request that
compresses again after that recompute (a retract while compressing) had kept sets this form
does not hold: its record is marked `exact = False` (meta_info `eviction_record_exact`).
"""

from __future__ import annotations

import base64
import dataclasses

import torch

from ..kvcache.host_copy import ints_to_device


@dataclasses.dataclass
class EvictionTracker:
    """One request's evictions, accumulated at each compaction (tensors on the pool's device)."""

    num_layers: int
    num_kv_heads: int
    kept: torch.Tensor | None = None  # [L, Hkv, k] logical positions of row[:k]
    tail_start: int = 0  # logical position held by row[k] (rows after it are contiguous)
    events: list = dataclasses.field(default_factory=list)  # (positions [L, Hkv, m], at)
    exact: bool = True
    dense_from: int | None = None  # first query that saw every earlier key again (preemption)

    def positions(self, n: int, device) -> torch.Tensor:
        """[L, Hkv, n] logical position held by each of the request's first n rows."""
        return _positions([self], n, device)[0]

    def on_compact(self, keep_idx: torch.Tensor, n: int, at: int) -> None:
        """Rows `keep_idx` [L, Hkv, k] of row[:n] were kept; the rest are gone for queries >= at."""
        on_compact_group([self], keep_idx[None], n, [at])

    def _record(self, dropped: torch.Tensor, kept: torch.Tensor, at: int) -> None:
        if self.dense_from is not None:  # kept sets chosen anew after the dense recompute
            self.exact = False
        self.events.append((dropped, at))
        self.kept, self.tail_start = kept, at

    def on_reset(self, resume_at: int) -> None:
        """The request lost its KV (preemption) and will be recomputed densely from position 0;
        `resume_at` is the first query of that recompute whose logits are used (it samples)."""
        if self.events and self.dense_from is None:
            self.dense_from = resume_at
        self.kept, self.tail_start = None, 0

    def finish(self, length: int) -> torch.Tensor:
        """The record [L, Hkv, length] on the CPU, int16 when positions fit, else int32."""
        out = torch.full((self.num_layers, self.num_kv_heads, length), length, dtype=torch.int32)
        if self.events:  # one device -> host copy for all compactions
            pos = torch.cat([p for p, _ in self.events], -1).cpu().long()
            at = torch.cat([torch.full((p.shape[-1],), min(a, length), dtype=torch.int32)
                            for p, a in self.events]).expand_as(pos)
            head = torch.arange(self.num_layers * self.num_kv_heads).view(*pos.shape[:2], 1)
            inside = pos < length  # positions past the sample (fed after a stop string): cut
            out.view(-1, length)[head.expand_as(pos)[inside], pos[inside]] = at[inside]
        return out.to(record_dtype(length))


def on_compact_group(trackers: list[EvictionTracker], keep_idx: torch.Tensor, n: int,
                     ats: list[int]) -> None:
    """`EvictionTracker.on_compact` for the R requests of one compaction (they all held n rows
    and kept the rows `keep_idx` [R, L, Hkv, k]; request i's dropped ones are gone for queries
    >= ats[i]), in a few batched ops per group of trackers with the same number of kept rows
    so far, instead of ~10 small ops per request: at batch 256 those were ~2,500 launches per
    compaction on the decode's path. Each tracker keeps views of the group's tensors."""
    groups: dict[int, list[int]] = {}
    for i, t in enumerate(trackers):
        groups.setdefault(0 if t.kept is None else t.kept.shape[-1], []).append(i)
    for idx in groups.values():
        rows = keep_idx if len(idx) == len(trackers) else keep_idx[idx]  # (all: no copy)
        dropped, kept = _dropped_and_kept([trackers[i] for i in idx], rows, n)
        for i, d, k in zip(idx, dropped.unbind(0), kept.unbind(0)):
            trackers[i]._record(d, k, ats[i])


def _dropped_and_kept(trackers: list[EvictionTracker], keep_idx: torch.Tensor, n: int):
    """[R, L, Hkv, n - k] positions dropped (int32) and [R, L, Hkv, k] positions kept, for
    trackers that all hold the same number of kept rows."""
    pos = _positions(trackers, n, keep_idx.device)
    dropped = torch.ones_like(pos, dtype=torch.int8).scatter_(-1, keep_idx, 0)
    # the n - k dropped rows of every (layer, head), without a boolean index (a host sync)
    rows = dropped.argsort(dim=-1, descending=True, stable=True)[..., :n - keep_idx.shape[-1]]
    return pos.gather(-1, rows).to(torch.int32), pos.gather(-1, keep_idx)


def _positions(trackers: list[EvictionTracker], n: int, device) -> torch.Tensor:
    """[R, L, Hkv, n]: `EvictionTracker.positions` of every tracker (same kept count), stacked."""
    first = trackers[0]
    k = 0 if first.kept is None else first.kept.shape[-1]
    start = ints_to_device([t.tail_start for t in trackers], device)
    tail = start[:, None] + torch.arange(n - k, device=device)
    tail = tail[:, None, None, :].expand(len(trackers), first.num_layers, first.num_kv_heads, n - k)
    if first.kept is None:
        return tail
    return torch.cat([torch.stack([t.kept for t in trackers]), tail], dim=-1)


def record_dtype(length: int) -> torch.dtype:
    return torch.int16 if length <= torch.iinfo(torch.int16).max else torch.int32


def record_bytes(num_layers: int, num_kv_heads: int, length: int) -> int:
    itemsize = torch.empty((), dtype=record_dtype(length)).element_size()
    return num_layers * num_kv_heads * length * itemsize


def encode(record: torch.Tensor) -> dict:
    """JSON form: base64 of the little-endian bytes, with dtype and shape."""
    data = record.contiguous().numpy().astype(record.numpy().dtype.newbyteorder("<")).tobytes()
    return {"dtype": str(record.dtype).removeprefix("torch."), "shape": list(record.shape),
            "data": base64.b64encode(data).decode("ascii")}


def decode(obj) -> torch.Tensor:
    """`encode`'s dict (HTTP) or a tensor (in-process) -> the record tensor."""
    if isinstance(obj, torch.Tensor):
        return obj
    import numpy as np

    dtype = {"int16": "<i2", "int32": "<i4"}[obj["dtype"]]
    arr = np.frombuffer(base64.b64decode(obj["data"]), dtype=dtype).astype(dtype[1:])
    return torch.from_numpy(arr.reshape(obj["shape"]).copy())
