"""Eviction replay over gathered keys (``gathered_replay``): the gathered sets against a brute
force over the definition, the tiles against the element mask, and the attention (outputs and
gradients) against the per-sample mask path and the per-query reference."""

from __future__ import annotations

import pytest
import torch

from trainer.learner.gathered_replay import BLOCK, GatheredKeys
from trainer.learner.sparse_attention import EvictionMasks, sparse_packed_attention

from tests.trainer.learner.test_sparse_attention import D, HKV, HQ, L, random_record, reference


def _pack(lengths, g, dense=()):
    records = [None if i in dense else random_record(n, g) for i, n in enumerate(lengths)]
    rows = sum(lengths) + 5
    masks = EvictionMasks.from_records(records, lengths, L, HKV, rows)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    return records, rows, masks, cu


def test_gathered_sets_are_the_keys_some_query_of_the_block_sees():
    g = torch.Generator().manual_seed(20)
    _, _, masks, _ = _pack([150, 90, 200, 40], g, dense={1})
    keys = GatheredKeys.build(masks.evict)
    ev = masks.evict
    rows = ev.shape[-1]
    assert keys.slots % BLOCK == 0 and keys.pos.shape == (L, rows // BLOCK, HKV, keys.slots)
    for layer in range(L):
        for h in range(HKV):
            for b in range(rows // BLOCK):
                lo, hi = b * BLOCK, b * BLOCK + BLOCK
                # brute force: some query i in [lo, hi) has j <= i < evict[j]
                want = [j for j in range(rows) if any(j <= i < ev[layer, h, j] for i in range(lo, hi))]
                pos, evict = keys.pos[layer, b, h], keys.evict[layer, b, h]
                used = pos < rows
                assert sorted(pos[used].tolist()) == want
                assert evict[used].tolist() == ev[layer, h, pos[used].long()].tolist()
                assert bool((evict[~used] == 0).all()) and bool(used[:len(want)].all())
                # the keys every query of the block sees come first, each part in order
                by_all = [(p <= lo) and (e >= hi) for p, e in zip(pos[used].tolist(), evict[used].tolist())]
                assert by_all == sorted(by_all, reverse=True)
                assert pos[:sum(by_all)].tolist() == sorted(pos[:sum(by_all)].tolist())


def test_tiles_are_conservative_against_the_element_mask():
    """Full exactly where every query of the block sees every key of the tile; neither partial
    nor full only where none does (partial may over-cover: the kernel masks it)."""
    g = torch.Generator().manual_seed(21)
    records = [random_record(n, g) for n in (300, 257, 90)]
    records[0][..., :BLOCK] = 300  # a kept prompt: seen by every later query of its sample
    masks = EvictionMasks.from_records(records, [300, 257, 90], L, HKV, 652)
    keys = GatheredKeys.build(masks.evict)
    partial, full = keys.tiles()
    qb = keys.pos.shape[1]
    row = (torch.arange(qb)[:, None] * BLOCK + torch.arange(BLOCK)[None, :])  # [QB, BLOCK]
    pos = keys.pos.unflatten(-1, (-1, BLOCK))[:, :, :, :, None, :]  # [L, QB, H, KB, 1, BLOCK]
    ev = keys.evict.unflatten(-1, (-1, BLOCK))[:, :, :, :, None, :]
    r = row[None, :, None, None, :, None]
    sees = (pos <= r) & (r < ev)  # [L, QB, H, KB, BLOCK q, BLOCK k]
    assert torch.equal(full, sees.flatten(-2).all(-1))
    assert not bool(sees[~(partial | full)].any())
    assert not bool((partial & full).any())
    assert int(full.sum()) > 0


@pytest.mark.parametrize("lengths,dense", [([150, 90, 200], ()), ([7, 12, 5], {1}), ([260], ())])
def test_gather_matches_the_mask_path(lengths, dense):
    g = torch.Generator().manual_seed(22)
    records, rows, masks, cu = _pack(lengths, g, dense)
    q, k, v = (torch.randn(rows, h, D, generator=g) for h in (HQ, HKV, HKV))
    for layer in range(L):
        a = sparse_packed_attention(q, k, v, masks, layer, cu, scale=0.3, impl="gather")
        b = sparse_packed_attention(q, k, v, masks, layer, cu, scale=0.3, impl="mask")
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
        assert bool((a[cu[-1]:] == 0).all())  # padding rows
        with torch.no_grad():  # the recompute's pass: block masks without the backward's tiles
            c = sparse_packed_attention(q, k, v, masks.use(), layer, cu, scale=0.3, impl="gather")
        torch.testing.assert_close(c, b, atol=1e-5, rtol=0)


def _flex_by_its_mask_mod(q, k, v, block_mask, scale, enable_gqa):
    """FlexAttention's semantics in plain SDPA (FlexAttention has no backward on the CPU): the
    block mask's element mask evaluated at every (query, slot)."""
    b, h, qi, kj = (torch.arange(n).view([-1 if i == d else 1 for i in range(4)])
                    for d, n in enumerate((q.shape[0], q.shape[1], q.shape[2], k.shape[2])))
    mask = block_mask.mask_mod(b, h, qi, kj)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale,
                                                            enable_gqa=enable_gqa)


def test_gather_gradients_match_the_per_query_reference():
    """The gather (and its backward, the keys' gradients added back from every block that
    gathered them) around the block masks' own mask_mod, in float64."""
    from trainer.learner.gathered_replay import gathered_attention

    g = torch.Generator().manual_seed(23)
    lengths = [6, 9, 140]
    records = [random_record(n, g) for n in lengths]
    rows = sum(lengths)
    qkv = [torch.randn(rows, h, D, generator=g, dtype=torch.float64) for h in (HQ, HKV, HKV)]
    masks = EvictionMasks.from_records(records, lengths, L, HKV, rows)
    grads = []
    for fn in (lambda q, k, v: gathered_attention(
                   q, k, v, masks.gathered(), masks.gathered_block_masks(HQ)[2], 2, 0.3,
                   _flex_by_its_mask_mod).reshape(rows, -1),
               lambda q, k, v: reference(q, k, v, records, lengths, 2, 0.3)):
        x = [t.clone().requires_grad_() for t in qkv]
        fn(*x).square().sum().backward()
        grads.append([fn(*x).detach()] + [t.grad for t in x])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, atol=1e-9, rtol=1e-7)


def test_gather_on_a_tensor_parallel_share_of_the_heads():
    """A TP rank's view (``heads``) gathers its own heads' keys: the same as the full pack's
    attention restricted to those heads."""
    g = torch.Generator().manual_seed(24)
    records, rows, masks, cu = _pack([150, 200], g)
    q, k, v = (torch.randn(rows, h, D, generator=g) for h in (HQ, HKV, HKV))
    full = sparse_packed_attention(q, k, v, masks, 1, cu, scale=0.3, impl="mask").view(rows, HQ, D)
    share = masks.heads(1, 1)
    got = sparse_packed_attention(q[:, 2:], k[:, 1:], v[:, 1:], share, 1, cu, scale=0.3,
                                  impl="gather").view(rows, 2, D)
    torch.testing.assert_close(got, full[:, 2:], atol=1e-5, rtol=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_compiled_gather_on_cuda_matches_the_mask_path_and_compiles_once():
    """Compiled FlexAttention over gathered keys in bf16 against the fp32 mask path (outputs
    and q/k/v gradients), then other pack lengths and every layer with no new graph."""
    from torch._dynamo.utils import counters

    g = torch.Generator().manual_seed(25)
    for n, lengths in enumerate(([700, 90, 1300], [257, 1024], [300, 200], [129, 640, 900],
                                 [2000, 33])):
        records = [random_record(m, g) for m in lengths]
        rows = sum(lengths) + 11
        qkv = [torch.randn(rows, h, 64, generator=g) for h in (HQ, HKV, HKV)]
        masks = EvictionMasks.from_records(records, lengths, L, HKV, rows)
        cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
        if n == 2:
            compiled = counters["stats"]["unique_graphs"]
        outs = []
        for impl, dtype, dev in (("gather", torch.bfloat16, "cuda"), ("mask", torch.float32, "cpu")):
            x = [t.to(dev, dtype).requires_grad_() for t in qkv]
            m = masks.to(dev).use()
            for layer in range(L):
                o = sparse_packed_attention(*x, m, layer, cu, scale=0.125, impl=impl)
            o.float().square().sum().backward()
            outs.append([o.float().cpu()] + [t.grad.float().cpu() for t in x])
            if n < 2:  # the recompute's no-grad pass too
                with torch.no_grad():
                    sparse_packed_attention(*x, m.use(), 0, cu, scale=0.125, impl=impl)
        for a, b in zip(*outs):
            assert (a - b).abs().max() / b.abs().max() < 2e-2
    assert counters["stats"]["unique_graphs"] == compiled
