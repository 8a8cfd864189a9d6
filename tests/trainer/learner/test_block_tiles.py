"""The BlockMasks of replay's attention (flex), read tile by tile against the element mask.

FlexAttention on the CPU runs unfused: it applies the element mask everywhere and ignores the
BlockMask's tile lists, so the CPU attention tests cannot see a wrong list. On a GPU a tile
listed full skips the element mask and a tile not listed is skipped. These tests decode the lists
themselves (``kv_num_blocks``/``kv_indices``, their ``full_`` pair, and the backward's transposes)
and check them against the attention's definition, evaluated element by element from the
records: query ``i`` sees key ``j`` iff same sample (the pack's padding: one more), ``j <= i``
and ``i < evict[j]``.

- every tile listed full has every element visible;
- every tile listed partial has some element visible;
- every tile not listed has none; no tile is listed twice;
- the transposes (by key tile) list exactly the (query tile, key tile) pairs of the forward's.

Mutation check: the partial/full swap in ``sparse_attention.LayerTiles.build`` fails these
tests (a partial tile listed full), while the CPU attention tests of ``test_sparse_attention.py``
all pass under it.
"""

from __future__ import annotations

import pytest
import torch

from trainer.learner.block_tiles import BLOCK
from trainer.learner.sparse_attention import EvictionMasks

from tests.trainer.learner.test_sparse_attention import HKV, HQ, L, random_record

GROUP = HQ // HKV


def _records(lengths, seed, dense, kept_prompt, early):
    """Random evictions; dense samples (full tiles); a sample whose first tile of keys is kept to
    its end (full tiles among evictions); one whose keys are evicted right after they are
    written (empty tiles inside a sample)."""
    g = torch.Generator().manual_seed(seed)
    records = [None if i in dense else random_record(n, g) for i, n in enumerate(lengths)]
    if kept_prompt is not None:
        records[kept_prompt][..., :BLOCK] = lengths[kept_prompt]
    if early is not None:
        n = lengths[early]
        records[early][..., :] = torch.clamp(torch.arange(n) + 2, max=n).to(torch.int16)
    return records


def _reference_visible(records, lengths, rows):
    """``[L, Hkv, rows q, rows k]`` bool: the definition, from the records (not from the pack's
    ``evict``): the padding rows past the samples form one more sample, never evicted."""
    seq = torch.full((rows,), len(records))
    ev = torch.full((L, HKV, rows), rows)
    start = 0
    for s, (rec, n) in enumerate(zip(records, lengths)):
        seq[start:start + n] = s
        ev[..., start:start + n] = start + n if rec is None else rec.long() + start
        start += n
    i = torch.arange(rows)
    causal = (seq[:, None] == seq[None, :]) & (i[None, :] <= i[:, None])
    return causal & (i[:, None] < ev[..., None, :])


def _listed(num: torch.Tensor, idx: torch.Tensor, cols: int) -> torch.Tensor:
    """``[..., rows] count``, ``[..., rows, n] indices`` -> ``[..., rows, cols]`` bool: the
    tiles the lists name (the first ``count`` indices of each row), checking none is named twice."""
    out = torch.zeros(*num.shape, cols, dtype=torch.bool)
    for at in torch.cartesian_prod(*(torch.arange(s) for s in num.shape)).view(-1, num.dim()):
        at = tuple(at.tolist())
        named = idx[at][:int(num[at])].long()
        assert named.unique().numel() == named.numel() and bool((named < cols).all()), at
        out[at][named] = True
    return out


def _check_classes(visible_tiles, partial, full):
    """``visible_tiles [..., QB, KB, BLOCK q, BLOCK k]`` against the listed tiles."""
    elems = visible_tiles.flatten(-2)
    assert not bool((partial & full).any()), "a tile listed both partial and full"
    assert bool(elems[full].all()), "a tile listed full holds a masked element"
    assert bool(elems[partial].any(-1).all()), "a tile listed partial has nothing visible"
    assert not bool(elems[~(partial | full)].any()), "a tile not listed holds a visible element"


def _forward_lists(bm, qb, kb):
    partial = _listed(bm.kv_num_blocks, bm.kv_indices, kb)
    full = _listed(bm.full_kv_num_blocks, bm.full_kv_indices, kb)
    return partial, full  # [B, Hq, QB, KB]


def _check_transposes(bm, partial, full, qb):
    """The backward's lists, per key tile, name the query tiles whose forward lists name it."""
    assert torch.equal(_listed(bm.q_num_blocks, bm.q_indices, qb), partial.mT)
    assert torch.equal(_listed(bm.full_q_num_blocks, bm.full_q_indices, qb), full.mT)


PACKS = [  # lengths, dense samples, a kept prompt, early evictions
    ([150, 90, 300, 37], {2}, 0, None),
    ([256, 5, 123, 300], {1}, 3, 0),
    ([300], (), 0, None),
]


@pytest.mark.parametrize("lengths,dense,kept,early", PACKS)
def test_flex_block_masks_list_tiles_as_the_element_mask_says(lengths, dense, kept, early):
    records = _records(lengths, 30, dense, kept, early)
    masks = EvictionMasks.from_records(records, lengths, L, HKV, sum(lengths) + 7).use()
    rows = masks.seq_id.shape[0]
    nb = rows // BLOCK
    tiles = _reference_visible(records, lengths, rows).unflatten(2, (nb, BLOCK)) \
        .unflatten(4, (nb, BLOCK)).permute(0, 1, 2, 4, 3, 5)  # [L, Hkv, QB, KB, BLOCK, BLOCK]
    with torch.enable_grad():
        bms = masks.block_masks(HQ)
    kinds = torch.zeros(3, dtype=torch.long)
    for layer, bm in enumerate(bms):
        assert bm.BLOCK_SIZE == (BLOCK, BLOCK) and bm.seq_lengths == (rows, rows)
        partial, full = (x[0] for x in _forward_lists(bm, nb, nb))  # [Hq, QB, KB]
        _check_classes(tiles[layer].repeat_interleave(GROUP, dim=0), partial, full)
        _check_transposes(bm, partial[None], full[None], nb)
        kinds += torch.stack([full.sum(), partial.sum(), (~(partial | full)).sum()])
    assert bool((kinds > 0).all()), kinds  # full, partial and skipped tiles all occur
