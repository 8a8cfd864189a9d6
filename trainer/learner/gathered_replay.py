"""Eviction replay over gathered keys: each block of 128 queries attends only to the keys that
some query of the block still sees.

Under R-KV or SnapKV a query sees at most the budget (plus the compression's buffer) of its
sample's keys, but those keys are scattered over the whole sample, so in the pack's T x T grid
nearly every causal tile is partial and FlexAttention computes (and masks) the full causal
triangle: 1.5x the dense varlen forward on an H100 (``docs/benchmarks.md``, issue 42). Here the
keys of query block ``b`` (rows ``[128 b, 128 b + 128)``)

    K_b = { j : j < 128 b + 128  and  evict[j] > 128 b }      (per layer and KV head)

are gathered into ``U`` slots, ``U`` the largest ``|K_b|`` rounded up to a tile (the keys every
query of the block sees first, so that they fill full tiles, then the rest, each part in position
order; unused slots point nowhere and are masked), and FlexAttention runs on ``[QB, H, 128, U]``
batches: one query tile against ``U / 128`` key tiles, most of them full. ``|K_b|`` is about
budget + buffer + 128, against the sample's whole prefix for dense attention. The element mask is
the same rule, ``kpos <= i < evict``; the gather's backward (``index_select``) adds the keys'
gradients back.

Built once per pack for every layer (``gathered``: a sort of the (key, block) pairs, two host
syncs for the sizes) and shared like the block tiles of ``sparse_attention``.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from .block_tiles import BLOCK, aligned_layers, block_mask_tensors, ordered

_NOWHERE = torch.iinfo(torch.int32).max  # an unused slot's key position: after every query


@dataclasses.dataclass(eq=False)
class GatheredKeys:
    """Every layer's gathered keys of one pack, ``[L, QB, Hkv, U]`` int32."""

    pos: torch.Tensor  # the key's pack row (an unused slot: _NOWHERE)
    evict: torch.Tensor  # the first query that no longer sees it (an unused slot: 0)

    @property
    def slots(self) -> int:
        return self.pos.shape[-1]

    @classmethod
    def build(cls, evict: torch.Tensor) -> "GatheredKeys":
        """From ``evict`` ``[L, Hkv, rows]`` (rows a multiple of BLOCK)."""
        L, H, rows = evict.shape
        qb = rows // BLOCK
        pos, ev, group = _grouped_pairs(evict, qb)
        at, slots = _slot_positions(group, L * H * qb)
        return cls(*(_scatter(at, v, L * H * qb * slots, fill).view(L, H, qb, slots)
                     .transpose(1, 2).contiguous()
                     for v, fill in ((pos, _NOWHERE), (ev, 0))))

    def tiles(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(partial, full) ``[L, QB, Hkv, U / BLOCK]`` bool: conservative like ``block_classes``
        (full only if every query of the block sees every key of the tile)."""
        start = torch.arange(self.pos.shape[1], device=self.pos.device)[:, None, None] * BLOCK
        p = self.pos.unflatten(-1, (-1, BLOCK))
        e = self.evict.unflatten(-1, (-1, BLOCK))
        some = (p.amin(-1) < start + BLOCK) & (e.amax(-1) > start)
        full = (p.amax(-1) <= start) & (e.amin(-1) >= start + BLOCK)
        return some & ~full, full


def _key_block_pairs(evict: torch.Tensor, qb: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every (flat key index, query block) with the key in the block's set: key ``j`` is seen
    by queries ``[j, evict[j])``, so by blocks ``j // BLOCK`` to ``(evict[j] - 1) // BLOCK``."""
    rows = evict.shape[-1]
    j = torch.arange(rows, device=evict.device)
    first = j // BLOCK
    last = torch.clamp((evict.to(torch.int64) - 1).div(BLOCK, rounding_mode="floor"), max=qb - 1)
    count = (last - first + 1).clamp(min=0).flatten()
    key = torch.repeat_interleave(torch.arange(count.numel(), device=evict.device), count)
    return key, (key % rows) // BLOCK + _rank_in_run(count, key)


def _grouped_pairs(evict: torch.Tensor, qb: int) -> tuple[torch.Tensor, ...]:
    """(key position, its evict, group) of every (key, block) pair, sorted by group (layer,
    KV head, query block); within a group the keys every query of the block sees first (they
    fill full tiles, which skip the element mask), then the others, each part in key order."""
    rows = evict.shape[-1]
    key, block = _key_block_pairs(evict, qb)
    group = key // rows * qb + block
    pos, ev = key % rows, evict.flatten()[key]
    start = block * BLOCK
    seen_by_all = (pos <= start) & (ev >= start + BLOCK)
    order = torch.sort(group * 2 + (~seen_by_all).long(), stable=True).indices
    return pos[order], ev[order], group[order]


def _slot_positions(group: torch.Tensor, groups: int) -> tuple[torch.Tensor, int]:
    """Each pair's flat slot (its group's row of ``slots``, its rank in the group) and
    ``slots``: the largest group, rounded up to a tile."""
    sizes = torch.bincount(group, minlength=groups)
    slots = -(-max(int(sizes.max()), 1) // BLOCK) * BLOCK
    return group * slots + _rank_in_run(sizes, group), slots


def _rank_in_run(counts: torch.Tensor, owner: torch.Tensor) -> torch.Tensor:
    """For entries laid out in runs (``counts[i]`` consecutive entries owned by ``i``, in
    order; ``owner`` names each entry's run): each entry's index within its run."""
    run_start = torch.cumsum(counts, 0) - counts
    return torch.arange(owner.numel(), device=owner.device) - run_start[owner]


def _scatter(at: torch.Tensor, values: torch.Tensor, size: int, fill: int) -> torch.Tensor:
    out = torch.full((size,), fill, dtype=torch.int32, device=at.device)
    return out.index_put_((at,), values.to(torch.int32))


def block_masks(keys: GatheredKeys, q_heads: int, backward: bool) -> list:
    """One ``BlockMask`` per layer over ``[QB, q_heads, BLOCK, U]``: a single query tile per
    batch, so the backward's transposed tiles are the tiles themselves."""
    from torch.nn.attention.flex_attention import BlockMask

    group = q_heads // keys.pos.shape[2]
    partial, full = (x.repeat_interleave(group, dim=2) for x in keys.tiles())
    parts = [_kv_ordered(partial), _kv_ordered(full)]
    if backward:
        parts += [_q_ordered(partial), _q_ordered(full)]
    per_layer = list(zip(*(aligned_layers(t) for pair in parts for t in pair)))
    return [BlockMask(**block_mask_tensors(per_layer[layer]),
                      seq_lengths=(BLOCK, keys.slots), BLOCK_SIZE=(BLOCK, BLOCK),
                      mask_mod=_gathered_mask_mod(keys.pos[layer], keys.evict[layer], group))
            for layer in range(partial.shape[0])]


def _kv_ordered(tiles: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[L, QB, H, KB]`` -> (``[L, QB, H, 1]`` count, ``[L, QB, H, 1, KB]`` listed tiles
    first): BlockMask's ordered form for the one query tile of each batch."""
    count, order = ordered(tiles)
    return count[..., None], order[..., None, :]


def _q_ordered(tiles: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The transposes: per key tile, 1 if its one query tile lists it, index 0."""
    return tiles.to(torch.int32), torch.zeros(*tiles.shape, 1, dtype=torch.int32,
                                              device=tiles.device)


def _gathered_mask_mod(pos: torch.Tensor, evict: torch.Tensor, group: int):
    """The element mask of one layer (one code object for every layer and pack, as
    ``sparse_attention._eviction_mask_mod``): query row ``BLOCK b + qi`` sees the slot's key
    iff ``pos <= row < evict``."""
    def mask_mod(b, h, qi, kj):
        row = b * BLOCK + qi
        return (pos[b, h // group, kj] <= row) & (row < evict[b, h // group, kj])

    return mask_mod


def gathered_attention(q, k, v, keys: GatheredKeys, bm, layer: int, scale: float, flex
                       ) -> torch.Tensor:
    """``[t, hq, d]`` q, ``[t, hkv, d]`` k/v -> ``[t, hq, d]`` (rows past the samples: not
    zeroed here)."""
    rows, hkv = q.shape[0], k.shape[1]
    qb = keys.pos.shape[1]
    pad = (0, 0, 0, 0, 0, qb * BLOCK - rows)
    qs = F.pad(q, pad).view(qb, BLOCK, *q.shape[1:]).transpose(1, 2)
    index = _flat_index(keys.pos[layer], qb * BLOCK, hkv)
    ks, vs = (F.pad(x, pad).reshape(-1, x.shape[-1]).index_select(0, index)
              .view(qb, hkv, keys.slots, x.shape[-1]) for x in (k, v))
    o = flex(qs, ks, vs, block_mask=bm, scale=scale, enable_gqa=q.shape[1] != hkv)
    return o.transpose(1, 2).reshape(qb * BLOCK, *q.shape[1:])[:rows]


def _flat_index(pos: torch.Tensor, rows: int, hkv: int) -> torch.Tensor:
    """Rows of ``[rows * hkv, d]`` (k flattened) for every slot (unused slots: row 0)."""
    head = torch.arange(hkv, device=pos.device, dtype=torch.int32)[None, :, None]
    return (torch.where(pos < rows, pos, 0) * hkv + head).flatten()
