"""The host side of packing, vectorised and built one micro-batch at a time: every field of
every pack (tokens, targets, response positions, bounds, eviction masks) identical to a
token-by-token reference (the loop ``pack`` ran before), dense and replayed, with two-copy
samples (a dense recompute after an eviction) and padding; ``PolicyTrainer`` builds each
micro-batch when the schedule asks for it.

Mutation checks: a target not zeroed at a sequence's end, or response positions counted from
the pack's start instead of the sequence's, fails ``test_pack_equals_token_loop``; building all
packs before the schedule fails ``test_micro_batches_built_on_demand``."""

from __future__ import annotations

import pytest
import torch

from checkpoint_tools import cpu_megatron

L, H = 2, 2


def reference_pack(samples, indices, pad_to_multiple, sparse):
    """Token-by-token: (tokens, targets, is_response, lengths, records) of the pack."""
    from trainer.learner.packing import _copies

    tokens, targets, is_response, lengths, records = [], [], [], [], []
    for i in indices:
        s = samples[i]
        seq = list(s.prompt_ids) + list(s.response_ids)
        for lo, hi, record in _copies(s, sparse):
            tokens += seq
            targets += seq[1:] + [0]
            is_response += [lo <= j < hi for j in range(len(seq))]
            lengths.append(len(seq))
            records.append(record)
    pad = -(-len(tokens) // pad_to_multiple) * pad_to_multiple - len(tokens)
    return (tokens + [0] * pad, targets + [0] * pad, is_response + [False] * pad, lengths,
            records)


def _samples(seed: int = 0):
    from trainer.learner.packing import Sample

    g = torch.Generator().manual_seed(seed)
    out = []
    for k, (p, r) in enumerate(((5, 7), (3, 12), (9, 1), (4, 4), (6, 9), (2, 5), (1, 3))):
        n = p + r
        record = (torch.arange(n) + 1 + (torch.rand(L, H, n, generator=g) * n).long()).clamp(
            max=n).to(torch.int16) if k % 3 else None
        dense_from = p + 2 if k in (1, 4) else None  # recomputed densely: two copies
        out.append(Sample(torch.randint(0, 50, (p,), generator=g).tolist(),
                          torch.randint(0, 50, (r,), generator=g).tolist(), record, dense_from))
    return out


def test_pack_equals_token_loop():
    from trainer.learner.packing import pack
    from trainer.learner.sparse_attention import EvictionMasks

    samples = _samples()
    for indices, pad, sparse in (([0, 1, 2], 1, False), ([4, 1, 6, 3], 8, True),
                                 (list(range(7)), 16, True), ([2], 1, True)):
        got = pack(samples, indices, pad, sparse=sparse)
        tokens, targets, is_response, lengths, records = reference_pack(samples, indices, pad,
                                                                        sparse)
        assert got.tokens.tolist() == [tokens] and got.targets.tolist() == targets
        assert got.response_positions.tolist() == is_response
        assert got.response_index.tolist() == [j for j, r in enumerate(is_response) if r]
        assert got.cu_seqlens.tolist() == [sum(lengths[:k]) for k in range(len(lengths) + 1)]
        assert got.max_seqlen == max(lengths) and got.sample_indices == indices
        assert got.response_lengths == [len(samples[i].response_ids) for i in indices]
        assert sum(got.response_lengths) == len(got.response_index)
        assert got.tokens.dtype == got.targets.dtype == got.response_index.dtype == torch.long
        if not sparse:
            assert got.eviction is None
            continue
        want = EvictionMasks.from_records(records, lengths, L, H, len(tokens))
        assert torch.equal(got.eviction.evict, want.evict)
        assert torch.equal(got.eviction.seq_id, want.seq_id)


def _moved_equal(batch, moved):
    for name in ("tokens", "targets", "response_positions", "response_index"):
        a, b = getattr(batch, name), getattr(moved, name)
        assert a.dtype == b.dtype and torch.equal(a, b.cpu()), name
    assert moved.cu_seqlens_device.dtype == torch.int32
    assert torch.equal(moved.cu_seqlens_device.cpu(), batch.cu_seqlens)
    assert moved.cu_seqlens is batch.cu_seqlens  # the host bounds stay on the host


def test_one_copy_keeps_every_field():
    from trainer.learner.packing import pack
    from trainer.learner.transfer import to_device_together

    parts = [torch.arange(5), torch.tensor([True, False, True]), torch.zeros(0, dtype=torch.long),
             torch.arange(6, dtype=torch.int32).reshape(2, 3), torch.tensor([1.5, -2.0])]
    back = to_device_together(parts, torch.device("cpu"))
    for a, b in zip(parts, back):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    batch = pack(_samples(), [0, 1, 2], 8)
    _moved_equal(batch, batch.to("cpu"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_one_copy_to_the_gpu():
    from trainer.learner.packing import pack

    batch = pack(_samples(), [0, 1, 2, 3], 8)
    moved = batch.to("cuda")
    torch.cuda.synchronize()
    assert moved.tokens.is_cuda and moved.cu_seqlens_device.is_cuda
    _moved_equal(batch, moved)


def test_single_threaded_restores_threads():
    from trainer.learner.transfer import single_threaded

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with single_threaded():
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def demand_task(rank, world, port, hf_dir, cache):
    from trainer.learner import policy_trainer
    from trainer.learner.model_provider import ModelConfig
    from trainer.learner.policy_trainer import OptimConfig, PolicyTrainer, TrainConfig

    cpu_megatron.init_distributed(rank, world, master_port=port)
    cpu_megatron.init_model_parallel(tp=1)
    trainer = PolicyTrainer(ModelConfig(hf_checkpoint=hf_dir, dtype=torch.float32),
                            OptimConfig(), TrainConfig(max_tokens_per_gpu=20), cache_dir=cache)
    events = []
    real_pack, real_forward = policy_trainer.pack, policy_trainer.packed_forward
    policy_trainer.pack = lambda *a, **k: events.append("pack") or real_pack(*a, **k)
    policy_trainer.packed_forward = lambda m, b: events.append("forward") or real_forward(m, b)
    samples = [s for s in _samples() if s.eviction_dense_from is None]
    trainer.compute_logprobs(samples)
    trainer.train_step(samples, lambda lp, ent, ids: (sum(x.sum() for x in lp), {}))
    return events


def test_micro_batches_built_on_demand(tiny_model_factory, tmp_path):
    hf = tiny_model_factory("qwen2-untied")
    events, = cpu_megatron.run_on_ranks((__file__, "demand_task"), 1, str(hf), str(tmp_path / "c"))
    n = len(events) // 4  # micro-batches per pass; each packed right before its forward
    assert n > 1 and events == ["pack", "forward"] * (2 * n)


def _padded_samples(batch, values, width):
    """The rows as the GRPO loss built them before ``response_rows``: split per sample, each
    padded with zeros to ``width``, stacked."""
    rows = batch.split_per_sample(values)
    return torch.stack([torch.nn.functional.pad(r, (0, width - len(r))) for r in rows])


def test_response_rows_equal_padded_samples():
    """One gather gives the rows (and, backward, the gradient) of a pad per sample and a stack,
    bit for bit: dense and replayed packs (two-copy samples: one row from both copies),
    padding at the end. Mutation check: pointing past-the-end entries at position 0 instead of
    the appended zero fails here."""
    from trainer.learner.packing import pack

    samples = _samples()
    g = torch.Generator().manual_seed(3)
    for indices, pad, sparse in (([0, 1, 2], 1, False), ([4, 1, 6, 3], 8, True),
                                 (list(range(7)), 16, True)):
        width = max(len(samples[i].response_ids) for i in indices) + 3
        batch = pack(samples, indices, pad, sparse=sparse, row_width=width)
        values = torch.randn(batch.tokens.shape[1], generator=g, requires_grad=True)
        upstream = torch.randn(len(indices), width, generator=g)
        got = batch.response_rows(values)
        (got_grad,) = torch.autograd.grad(got, values, upstream)
        want = _padded_samples(batch, values, width)
        (want_grad,) = torch.autograd.grad(want, values, upstream)
        assert torch.equal(got, want) and torch.equal(got_grad, want_grad)
        assert batch.sample_rows.tolist() == indices
    with pytest.raises(ValueError, match="does not fit rows of 3"):
        pack(samples, [1], row_width=3)


def test_positions_restart_per_sequence():
    """The RoPE positions the pack carries: 0, 1, ... in every sequence (both copies of a
    replayed sample), 0 in the padding -- what the fused RoPE derived from the bounds itself."""
    from trainer.learner.packing import pack

    samples = _samples()
    batch = pack(samples, [4, 1, 6], 16, sparse=True)
    _, _, _, lengths, _ = reference_pack(samples, [4, 1, 6], 16, True)
    want = [j for n in lengths for j in range(n)]
    assert batch.positions.tolist() == want + [0] * (batch.tokens.shape[1] - len(want))
