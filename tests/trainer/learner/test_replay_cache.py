"""One rollout's eviction masks built once: packs of the same micro-batch share them within
``shared_replay_masks`` (block tiles included), nothing else does, nothing outlives the scope,
and a recompute + update gives the same log-probs and gradients with and without sharing."""

from __future__ import annotations

import dataclasses

import torch

from checkpoint_tools import cpu_megatron

L, HKV, HQ = 3, 2, 4


def _samples(vocab: int, layers: int, kv_heads: int, shapes, seed: int = 0):
    """Random samples with random eviction records (each key evicted at a later query or never)."""
    from trainer.learner.packing import Sample

    g = torch.Generator().manual_seed(seed)
    out = []
    for p, r in shapes:
        n = p + r
        k = torch.arange(n)
        at = k + 1 + (torch.rand(layers, kv_heads, n, generator=g) * (n - k)).long()
        never = torch.rand(layers, kv_heads, n, generator=g) < 0.4
        out.append(Sample(torch.randint(0, vocab, (p,), generator=g).tolist(),
                          torch.randint(0, vocab, (r,), generator=g).tolist(),
                          torch.where(never, n, at.clamp(max=n)).to(torch.int16)))
    return out


def test_packs_of_the_same_samples_share_masks_only_within_the_scope():
    from trainer.learner import replay_cache
    from trainer.learner.packing import pack
    from trainer.learner.replay_cache import shared_replay_masks

    samples = _samples(50, L, HKV, [(5, 40), (3, 90), (7, 20)])
    with shared_replay_masks():
        a, b = (pack(samples, [0, 2], sparse=True).eviction for _ in range(2))
        assert a.evict is b.evict and a.shared is b.shared  # one pack, built once
        assert a.passes is not b.passes  # each pass its own per-layer block masks
        with shared_replay_masks():  # nested: the outer scope's
            assert pack(samples, [0, 2], sparse=True).eviction.evict is a.evict
        others = [pack(samples, [2, 0], sparse=True), pack(samples, [0, 2], 16, sparse=True),
                  pack([samples[0], samples[1], dataclasses.replace(samples[2])], [0, 2],
                       sparse=True)]  # another order, padding, sample object
        assert all(o.eviction.evict is not a.evict for o in others)
    assert replay_cache._active is None  # dropped with the scope
    assert pack(samples, [0, 2], sparse=True).eviction.evict is not a.evict
    with shared_replay_masks():
        assert pack(samples, [0, 2], sparse=True).eviction.evict is not a.evict


def test_block_tiles_are_built_once_for_a_recompute_and_an_update(monkeypatch):
    """The recompute (no autograd) and the update (autograd: the backward's tiles too) of the
    same micro-batch classify its tiles once; the update's BlockMasks equal a fresh build's."""
    from trainer.learner.packing import pack
    from trainer.learner.replay_cache import shared_replay_masks
    from trainer.learner.sparse_attention import LayerTiles

    builds = []
    real_build = LayerTiles.build.__func__
    monkeypatch.setattr(LayerTiles, "build",
                        classmethod(lambda cls, *a: builds.append(1) or real_build(cls, *a)))
    samples = _samples(50, L, HKV, [(5, 140), (3, 200)])
    with shared_replay_masks():
        with torch.no_grad():
            recompute = pack(samples, sparse=True).eviction.block_masks(HQ)
        update = pack(samples, sparse=True).eviction.block_masks(HQ)
    assert len(builds) == 1
    assert recompute[0].q_indices is None and update[0].q_indices is not None
    fresh = pack(samples, sparse=True).eviction.block_masks(HQ)
    assert len(builds) == 2
    for ours, want in zip(update, fresh):
        for name in ("kv_num_blocks", "kv_indices", "full_kv_indices", "q_indices", "full_q_indices"):
            assert torch.equal(getattr(ours, name), getattr(want, name))


def rollout_task(rank, world, port, hf_dir, cache):
    """Recompute + update (CPU, fp32, mask path) without and with shared masks; the same again
    forward-only through FlexAttention (its block tiles)."""
    from checkpoint_tools.model_config import load_arch
    from trainer.learner import replay_cache
    from trainer.learner.attention import SDPACoreAttention
    from trainer.learner.model_provider import ModelConfig
    from trainer.learner.policy_trainer import OptimConfig, PolicyTrainer, TrainConfig
    from trainer.learner.replay_cache import shared_replay_masks

    cpu_megatron.init_distributed(rank, world, master_port=port)
    cpu_megatron.init_model_parallel(tp=1, seed=1234)
    arch = load_arch(hf_dir)
    trainer = PolicyTrainer(ModelConfig(hf_checkpoint=hf_dir, dtype=torch.float32,
                                        attention_backend="sdpa"),
                            OptimConfig(lr=0.0, weight_decay=0.0),  # the same weights each time
                            TrainConfig(max_tokens_per_gpu=40, sparse_recompute=True,
                                        train_sparse_policy=True), cache_dir=cache)
    samples = _samples(arch.vocab_size, arch.num_layers, arch.num_query_groups,
                       [(5, 7), (3, 12), (9, 1), (4, 4), (6, 9), (2, 5)])
    n_resp = sum(len(s.response_ids) for s in samples)

    def loss_fn(logp, ent, ids):
        loss = sum(-lp.sum() for lp in logp) / n_resp
        return loss, {"loss": loss.detach()}

    def rollout():
        logp = trainer.compute_logprobs(samples, sparse=True)
        metrics = trainer.train_step(samples, loss_fn, sparse=True)
        grads = {n: p.main_grad.detach().clone() for n, p in trainer.model.module.named_parameters()}
        return logp, grads, metrics["loss"]

    counts = [dict(replay_cache.stats)]
    plain = rollout()
    counts.append(dict(replay_cache.stats))
    with shared_replay_masks():
        shared = rollout()
    counts.append(dict(replay_cache.stats))
    SDPACoreAttention.sparse_impl = "flex"  # FlexAttention forward (unfused on the CPU)
    with shared_replay_masks():
        flex = [trainer.compute_logprobs(samples, sparse=True) for _ in range(2)]
    counts.append(dict(replay_cache.stats))
    return _compare(plain, shared, flex), counts


def _compare(plain, shared, flex) -> dict:
    """Plain numbers (tensors do not travel back from a spawned rank in bulk)."""
    (lp_a, grads_a, loss_a), (lp_b, grads_b, loss_b) = plain, shared
    return dict(logp_equal=all(torch.equal(a, b) for a, b in zip(lp_a, lp_b)),
                grads_equal=all(torch.equal(grads_a[k], grads_b[k]) for k in grads_a),
                loss_equal=loss_a == loss_b,
                grad_max=max(g.abs().max().item() for g in grads_a.values()),
                flex_gap=max((a - b).abs().max().item() for a, b in zip(flex[0], lp_a)),
                flex_repeat_equal=all(torch.equal(a, b) for a, b in zip(*flex)))


def test_shared_masks_give_the_same_logprobs_and_gradients(tiny_model_factory, tmp_path):
    hf = tiny_model_factory("qwen2-untied")
    ((result, counts),) = cpu_megatron.run_on_ranks(
        (__file__, "rollout_task"), 1, str(hf), str(tmp_path / "c"))
    assert result["logp_equal"] and result["grads_equal"] and result["loss_equal"], result
    assert result["grad_max"] > 1e-4  # a real gradient
    step = lambda i, k: counts[i + 1][k] - counts[i][k]  # noqa: E731
    packs = step(0, "built") // 2  # without the scope: the recompute and update each build
    assert packs >= 2 and step(0, "reused") == 0  # several micro-batches (40-token budget)
    assert (step(1, "built"), step(1, "reused")) == (packs, packs)  # the update reused them all
    assert (step(2, "built"), step(2, "reused")) == (packs, packs)
    assert result["flex_gap"] < 1e-5 and result["flex_repeat_equal"], result
