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
    assert (masks.evict[..., 5:8] == 8).all()  # the dense sample: never evicted, seen to its end
    assert (masks.evict[..., 8:] == 128).all()  # the padding: one more sequence, to the last row
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


def reference_from_records(records, lengths, total):
    """The pack's eviction tensor row range by row range (how it was first built)."""
    from trainer.learner.sparse_attention import BLOCK

    rows = -(-(total + 1) // BLOCK) * BLOCK
    evict = torch.full((L, HKV, rows), rows, dtype=torch.int32)
    seq_id = torch.full((rows,), len(records), dtype=torch.int32)
    start = 0
    for i, (rec, n) in enumerate(zip(records, lengths)):
        seq_id[start:start + n] = i
        # a dense sample's keys are seen until its end (the padding's: until the last row)
        evict[..., start:start + n] = start + n if rec is None else rec.to(torch.int32) + start
        start += n
    return evict, seq_id


def test_from_records_equals_the_row_by_row_build():
    """One concatenated copy shifted in place: the same int32 tensor, with int16, int32 and
    missing (dense) records mixed, and padding past the samples."""
    g = torch.Generator().manual_seed(7)
    lengths = [40, 300, 9, 128]
    records = [random_record(40, g), None, random_record(9, g).int(), random_record(128, g)]
    masks = EvictionMasks.from_records(records, lengths, L, HKV, sum(lengths) + 20)
    evict, seq_id = reference_from_records(records, lengths, sum(lengths) + 20)
    assert masks.evict.dtype == torch.int32 and torch.equal(masks.evict, evict)
    assert torch.equal(masks.seq_id, seq_id)


def per_layer_block_classes(evict, seq_id):
    """One layer's (partial, full) tiles as first written, the reference for the all-layer
    pass: a tile may hold a visible pair if some query and key share a sequence, the key is not
    after the query and some key's eviction comes after the tile's first query; every pair is
    visible if both sides are one and the same sequence, every key precedes every query and no
    key is evicted before the tile's last query."""
    from trainer.learner.sparse_attention import BLOCK

    lo = lambda x: x.unflatten(-1, (-1, BLOCK)).amin(-1)  # noqa: E731
    hi = lambda x: x.unflatten(-1, (-1, BLOCK)).amax(-1)  # noqa: E731
    t = torch.arange(seq_id.shape[0])
    s_min, s_max, t_min, t_max = lo(seq_id), hi(seq_id), lo(t), hi(t)
    e_min, e_max = lo(evict), hi(evict)  # [Hkv, B]
    same_seq = (s_min[:, None] <= s_max[None, :]) & (s_min[None, :] <= s_max[:, None])
    some = (same_seq & (t_min[None, :] <= t_max[:, None]))[None] \
        & (e_max[:, None, :] > t_min[None, :, None])
    one = s_min == s_max
    every = (one[:, None] & one[None, :] & (s_min[:, None] == s_min[None, :])
             & (t_max[None, :] <= t_min[:, None]))[None] & (e_min[:, None, :] > t_max[None, :, None])
    return some & ~every, every


def _random_pack(seed, lengths, dense=()):
    g = torch.Generator().manual_seed(seed)
    records = [None if i in dense else random_record(n, g) for i, n in enumerate(lengths)]
    return EvictionMasks.from_records(records, lengths, L, HKV, sum(lengths) + 3)


def test_all_layer_block_classes_equal_the_per_layer_reference():
    from trainer.learner.sparse_attention import block_classes

    masks = _random_pack(8, [150, 90, 300, 37], dense={2})
    partial, full = block_classes(masks.evict, masks.seq_id)  # [L, Hkv, QB, KB], one pass
    assert partial.shape == (L, HKV, 5, 5)
    for layer in range(L):
        ref_partial, ref_full = per_layer_block_classes(masks.evict[layer], masks.seq_id)
        assert torch.equal(partial[layer], ref_partial) and torch.equal(full[layer], ref_full)
    assert full.any() and partial.any() and (~(partial | full)).any()


def _from_kv_blocks(masks, layer, q_heads, head_start=0, heads=HKV):
    """The layer's BlockMask as ``BlockMask.from_kv_blocks`` makes it from the reference tiles
    (its own transposes for the backward)."""
    from torch.nn.attention.flex_attention import BlockMask

    from trainer.learner.sparse_attention import BLOCK

    ev = masks.evict[layer, head_start:head_start + heads]
    tiles = [x.repeat_interleave(q_heads // heads, dim=0)
             for x in per_layer_block_classes(ev, masks.seq_id)]
    ordered = [(x.sum(-1, dtype=torch.int32)[None],
                torch.argsort((~x).to(torch.int8), dim=-1, stable=True).to(torch.int32)[None])
               for x in tiles]
    n = masks.seq_id.shape[0]
    return BlockMask.from_kv_blocks(*ordered[0], *ordered[1], BLOCK_SIZE=BLOCK, seq_lengths=(n, n))


TENSORS = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices",
           "q_num_blocks", "q_indices", "full_q_num_blocks", "full_q_indices")


@pytest.mark.parametrize("heads", [(0, HKV), (1, 1)])  # all KV heads, a TP rank's one
def test_block_masks_equal_from_kv_blocks_with_and_without_autograd(heads):
    """All layers' BlockMasks from the one vectorised pass hold exactly the tensors that
    ``from_kv_blocks`` builds per layer (the backward's transposes too); without autograd the
    transposes are left out."""
    masks = _random_pack(9, [150, 90, 300, 37], dense={2}).use().heads(*heads)
    with torch.enable_grad():
        train = masks.block_masks(HQ)
    with torch.no_grad():
        recompute = masks.block_masks(HQ)
    for layer in range(L):
        want = _from_kv_blocks(masks, layer, HQ, 0, heads[1])  # the view's evict: its heads
        for name in TENSORS:
            got = getattr(train[layer], name)
            assert got.dtype == torch.int32 and torch.equal(got, getattr(want, name)), name
            forward = getattr(recompute[layer], name)
            assert forward is None if name.startswith(("q_", "full_q")) else torch.equal(forward, got)
        assert train[layer].seq_lengths == want.seq_lengths
        assert train[layer].BLOCK_SIZE == want.BLOCK_SIZE


def test_block_mask_equals_create_block_mask_where_tiles_are_exact():
    """Sequences on tile bounds and evictions that empty or fill whole tiles: there the record's
    tiles are exact, and the BlockMask is the one ``create_block_mask`` makes by evaluating the
    mask element by element (tensors, order of the unlisted tiles included)."""
    from torch.nn.attention.flex_attention import create_block_mask

    from trainer.learner.sparse_attention import BLOCK

    a = torch.full((L, HKV, 256), 256, dtype=torch.int16)  # never evicted: a full tile below
    a[0, 0, :128] = a[1, 1, :128] = 128  # the first tile's keys gone from the second's queries
    a[0, 1, :64] = a[2, 0, :64] = 200  # half of them from query 200 on: a mixed tile
    masks = EvictionMasks.from_records([a, None], [256, 128], L, HKV, 384).use()
    rows = masks.seq_id.shape[0]
    with torch.enable_grad():
        ours = masks.block_masks(HQ)
    kinds = {(layer, int(bm.kv_num_blocks[0, h, 1]), int(bm.full_kv_num_blocks[0, h, 1]))
             for layer, bm in enumerate(ours) for h in range(HQ)}  # the second tile's row
    assert {k[1:] for k in kinds} == {(1, 0), (2, 0), (1, 1)}  # empty, partial, full (k0)
    for layer in range(L):
        seq, ev, group = masks.seq_id, masks.evict[layer], HQ // HKV

        def mod(b, h, qi, kj):  # the definition, sample ids included (the kernel's omits them)
            return (seq[qi] == seq[kj]) & (kj <= qi) & (qi < ev[h // group, kj])
        want = create_block_mask(mod, None, HQ, rows, rows, device="cpu", BLOCK_SIZE=BLOCK)
        for name in TENSORS:
            assert torch.equal(getattr(ours[layer], name), getattr(want, name)), (layer, name)


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
        # built on the GPU (one pinned copy, shifted there): the same masks, and the recompute's
        # forward (no autograd: BlockMasks without the backward's tiles) the same output
        on_gpu = EvictionMasks.from_records(records, lengths, L, HKV, rows, device="cuda")
        assert torch.equal(on_gpu.evict, masks.evict.cuda())
        with torch.no_grad():
            x = [t.to("cuda", torch.bfloat16) for t in qkv]
            o = sparse_packed_attention(*x, on_gpu.use(), 1, cu, scale=0.125, impl="flex")
        a, b = o.float().cpu(), outs[1][0]  # another compiled graph: against the fp32 path
        assert (a - b).abs().max() / b.abs().max() < 2e-2


def _flex_on_gpu(lengths, grad: bool, g) -> None:
    """Every layer of one pack through the compiled FlexAttention (bf16, masks built on the GPU)."""
    records = [random_record(n, g) for n in lengths]
    rows = sum(lengths) + 5
    masks = EvictionMasks.from_records(records, lengths, L, HKV, rows, device="cuda").use()
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    with torch.set_grad_enabled(grad):
        for layer in range(L):
            x = [torch.randn(rows, h, 64, device="cuda", dtype=torch.bfloat16, requires_grad=grad)
                 for h in (HQ, HKV, HKV)]
            o = sparse_packed_attention(*x, masks, layer, cu, scale=0.125, impl="flex")
            if grad:
                o.float().sum().backward()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_compiled_flex_compiles_nothing_per_layer_or_per_pack_length():
    """After two pack lengths (a static compile, then one with dynamic lengths), other lengths
    and every layer run the kernels already compiled, with and without autograd: the layers'
    mask_mods are one code object over same-shaped views."""
    from torch._dynamo.utils import counters

    g = torch.Generator().manual_seed(10)
    for lengths in ([300, 200], [700, 90, 1300]):
        _flex_on_gpu(lengths, False, g)
        _flex_on_gpu(lengths, True, g)
    compiled = counters["stats"]["unique_graphs"]
    for lengths in ([257, 1024], [129, 640, 900], [2000, 33]):
        _flex_on_gpu(lengths, False, g)
        _flex_on_gpu(lengths, True, g)
    assert counters["stats"]["unique_graphs"] == compiled


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
    assert (batch.eviction.evict[..., 11:19] == 19).all()  # the second copy attends densely
    # response log-probs sit at queries 2..6 of s: 2, 3, 4 masked (rows 5-7), 5, 6 dense (16, 17)
    assert batch.response_index.tolist() == [0, 1, 5, 6, 7, 16, 17]
    values = torch.arange(19.0)
    assert [x.tolist() for x in batch.split_per_sample(values)] == [[0, 1], [5, 6, 7, 16, 17]]
    assert pack([s]).cu_seqlens.tolist() == [0, 8]  # dense packs: one copy
    assert (packed_length(s, True), packed_length(s, False), packed_length(other, True)) == (16, 8, 3)
