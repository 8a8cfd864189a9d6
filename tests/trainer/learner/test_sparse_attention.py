"""Eviction-replay attention on packed batches against a per-query loop over the visible keys."""

from __future__ import annotations

import pytest
import torch

from trainer.learner.packing import Sample, pack, packed_length
from trainer.learner.sparse_attention import EvictionMasks, sparse_packed_attention

L, HKV, HQ, D = 3, 2, 4, 8


def random_record(n, g):
    """Each key evicted at a random query after it, or never (n)."""
    k = torch.arange(n)
    at = k + 1 + (torch.rand(L, HKV, n, generator=g) * (n - k)).long()
    never = torch.rand(L, HKV, n, generator=g) < 0.4
    return torch.where(never, n, at.clamp(max=n)).to(torch.int16)


def reference(q, k, v, records, lengths, layer, scale):
    """Query i of a sample: softmax over its keys j <= i with i < record[layer, h, j]."""
    out = torch.zeros(q.shape, dtype=q.dtype)
    start = 0
    for rec, n in zip(records, lengths):
        for i in range(n):
            for h in range(HQ):
                kv = h // (HQ // HKV)
                keys = [j for j in range(i + 1) if rec is None or i < rec[layer, kv, j]]
                idx = torch.tensor(keys) + start
                w = torch.softmax(k[idx, kv] @ q[start + i, h] * scale, 0)
                out[start + i, h] = w @ v[idx, kv]
        start += n
    return out.reshape(q.shape[0], -1)


@pytest.mark.parametrize("impl", ["mask", "flex"])
def test_sparse_attention_matches_per_query_reference(impl):
    g = torch.Generator().manual_seed(0)
    lengths = [7, 12, 5]
    records = [random_record(7, g), None, random_record(5, g)]
    rows = sum(lengths) + 3  # padding rows
    q, k, v = (torch.randn(rows, h, D, generator=g) for h in (HQ, HKV, HKV))
    masks = EvictionMasks.from_records(records, lengths, L, HKV, rows)
    cu = torch.tensor([0, 7, 19, 24], dtype=torch.int32)
    for layer in range(L):
        got = sparse_packed_attention(q, k, v, masks, layer, cu, scale=0.3, impl=impl)
        want = reference(q, k, v, records, lengths, layer, 0.3)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    # and the mask really removed keys: dense causal attention differs
    dense = EvictionMasks.from_records([None] * 3, lengths, L, HKV, rows)
    d = sparse_packed_attention(q, k, v, dense, 0, cu, scale=0.3, impl="mask")
    assert (d - sparse_packed_attention(q, k, v, masks, 0, cu, scale=0.3, impl="mask")).abs().max() > 1e-2


def test_pack_carries_records_only_when_sparse_and_checks_shapes():
    g = torch.Generator().manual_seed(1)
    samples = [Sample([1, 2, 3], [4, 5], random_record(5, g)), Sample([6, 7], [8], None)]
    assert pack(samples).eviction is None
    masks = pack(samples, sparse=True, pad_to_multiple=4).eviction
    assert masks.evict.shape == (L, HKV, 128)  # rounded up to a FlexAttention tile
    assert torch.equal(masks.evict[..., :5], samples[0].eviction_record.int())
    assert (masks.evict[..., 5:8] == 128).all()  # the dense sample: never evicted
    assert masks.seq_id.tolist() == [0] * 5 + [1] * 3 + [2] * 120
    assert masks.real.tolist() == [True] * 8 + [False] * 120
    bad = [Sample([1, 2, 3], [4, 5], random_record(4, g))]
    with pytest.raises(ValueError, match="eviction record of shape"):
        pack(bad, sparse=True)


def test_block_classes_are_safe_and_sparse():
    """FlexAttention tiles built from the record alone: an empty tile has no visible pair, a full
    one only visible pairs (checked against the dense mask), and both kinds occur."""
    from trainer.learner.sparse_attention import BLOCK, block_classes

    g = torch.Generator().manual_seed(2)
    lengths = [150, 90, 300]
    records = [random_record(n, g) for n in lengths]
    records[1] = records[2] = None  # the long dense one gives full tiles
    masks = EvictionMasks.from_records(records, lengths, L, HKV, sum(lengths))
    rows = masks.seq_id.shape[0]
    i = torch.arange(rows)
    seq = masks.seq_id
    for layer in range(L):
        ev = masks.evict[layer]
        dense = ((seq[:, None] == seq[None, :]) & (i[None, :] <= i[:, None]))[None] \
            & (i[None, :, None] < ev[:, None, :])
        tiles = dense.unflatten(1, (-1, BLOCK)).unflatten(3, (-1, BLOCK))
        ref_any, ref_all = tiles.any(4).any(2), tiles.all(4).all(2)
        partial, full = block_classes(ev, seq)
        assert not (partial & full).any()
        assert not (ref_any & ~(partial | full)).any()  # nothing visible is skipped
        assert not (full & ~ref_all).any()  # no tile is wrongly unmasked
        assert full.any() and (~(partial | full)).any()


def test_flex_on_a_pack_of_several_tiles_matches_the_mask_path():
    g = torch.Generator().manual_seed(3)
    lengths = [150, 90, 200]
    records = [random_record(n, g) for n in lengths]
    rows = sum(lengths) + 5
    q, k, v = (torch.randn(rows, h, D, generator=g) for h in (HQ, HKV, HKV))
    masks = EvictionMasks.from_records(records, lengths, L, HKV, rows)
    cu = torch.tensor([0, 150, 240, 440], dtype=torch.int32)
    for layer in range(L):
        a = sparse_packed_attention(q, k, v, masks, layer, cu, scale=0.3, impl="flex")
        b = sparse_packed_attention(q, k, v, masks, layer, cu, scale=0.3, impl="mask")
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_compiled_flex_on_cuda_matches_the_mask_path_with_gradients():
    """The GPU path (compiled FlexAttention, block masks from the record) in bf16 against the
    fp32 mask path: outputs and q/k/v gradients, on two pack shapes (a recompile)."""
    g = torch.Generator().manual_seed(4)
    for lengths in ([700, 90, 1300], [257, 1024]):
        records = [random_record(n, g) for n in lengths]
        rows = sum(lengths) + 11
        qkv = [torch.randn(rows, h, 64, generator=g) for h in (HQ, HKV, HKV)]
        masks = EvictionMasks.from_records(records, lengths, L, HKV, rows)
        cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
        outs = []
        for impl, dtype, dev in (("flex", torch.bfloat16, "cuda"), ("mask", torch.float32, "cpu")):
            x = [t.to(dev, dtype).requires_grad_() for t in qkv]
            m = masks.to(dev)
            o = sparse_packed_attention(*x, m, 1, cu, scale=0.125, impl=impl)
            o.float().square().sum().backward()
            outs.append([o.float().cpu()] + [t.grad.float().cpu() for t in x])
        for a, b in zip(*outs):
            assert (a - b).abs().max() / b.abs().max() < 2e-2


def test_gradients_of_the_mask_path_match_the_per_query_reference():
    g = torch.Generator().manual_seed(5)
    lengths = [6, 9]
    records = [random_record(6, g), random_record(9, g)]
    qkv = [torch.randn(15, h, D, generator=g, dtype=torch.float64) for h in (HQ, HKV, HKV)]
    masks = EvictionMasks.from_records(records, lengths, L, HKV, 15)
    cu = torch.tensor([0, 6, 15], dtype=torch.int32)
    grads = []
    for fn in (lambda q, k, v: sparse_packed_attention(q, k, v, masks, 2, cu, scale=0.3, impl="mask"),
               lambda q, k, v: reference(q, k, v, records, lengths, 2, 0.3)):
        x = [t.clone().requires_grad_() for t in qkv]
        fn(*x).square().sum().backward()
        grads.append([t.grad for t in x])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, atol=1e-9, rtol=1e-7)


def test_a_densely_recomputed_sample_is_packed_twice_and_split_back():
    """eviction_dense_from d: queries before d from the masked copy, from d on from a dense
    copy; split_per_sample gives the response log-probs back in order, one row per sample."""
    g = torch.Generator().manual_seed(6)
    s = Sample([1, 2, 3], [4, 5, 6, 7, 8], random_record(8, g), eviction_dense_from=5)
    other = Sample([9], [10, 11], random_record(3, g))
    batch = pack([other, s], sparse=True)
    assert batch.cu_seqlens.tolist() == [0, 3, 11, 19]
    assert batch.eviction.seq_id[:19].tolist() == [0] * 3 + [1] * 8 + [2] * 8
    assert (batch.eviction.evict[..., 11:19] == 128).all()  # the second copy attends densely
    # response log-probs sit at queries 2..6 of s: 2, 3, 4 masked (rows 5-7), 5, 6 dense (16, 17)
    assert batch.response_index.tolist() == [0, 1, 5, 6, 7, 16, 17]
    values = torch.arange(19.0)
    assert [x.tolist() for x in batch.split_per_sample(values)] == [[0, 1], [5, 6, 7, 16, 17]]
    assert pack([s]).cu_seqlens.tolist() == [0, 8]  # dense packs: one copy
    assert (packed_length(s, True), packed_length(s, False), packed_length(other, True)) == (16, 8, 3)
