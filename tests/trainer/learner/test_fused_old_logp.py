"""π_old from the update's own forward (fused) against recompute-then-update: the same gradients,
weights, metrics and correction fractions after one on-policy step (CPU, fp32, gloo), one
forward pass per micro-batch fewer; and which configurations keep the recompute.

The gradients are compared unclipped (``CLIP_GRAD`` far above their norms of 3-10: clipping to
1 would rescale both to the same norm and hide a wrongly scaled one), and their scale is checked
on its own: the least-squares factor between the fused gradient and the recompute's is 1.
Mutation check: ``AfterForward.__call__`` returning 1.0 instead of ``self.policy_factor`` (no
rescale of the accumulated gradient) fails the gradient-scale assertion of every sparse_rl case
(measured factors 0.30, 0.32 and 1.005) before any metric is compared."""

from __future__ import annotations

import pytest
import torch

from checkpoint_tools import cpu_megatron

TOL = 1e-6
CLIP_GRAD = 1e6  # never reached: the compared gradients are the backward's, unclipped
SHAPES = ((5, 7), (3, 12), (9, 1), (4, 4), (6, 9), (2, 5))


def _samples(vocab: int, sparse: bool, num_layers: int, kv_heads: int):
    """Random samples; with ``sparse``, random eviction records (each key evicted at a random
    later query or never) so that the replayed attention differs from the dense one."""
    from trainer.learner.packing import Sample

    g = torch.Generator().manual_seed(0)
    out = []
    for p, r in SHAPES:
        n = p + r
        k = torch.arange(n)
        at = k + 1 + (torch.rand(num_layers, kv_heads, n, generator=g) * (n - k)).long()
        never = torch.rand(num_layers, kv_heads, n, generator=g) < 0.4
        record = torch.where(never, n, at.clamp(max=n)).to(torch.int16) if sparse else None
        out.append(Sample(torch.randint(0, vocab, (p,), generator=g).tolist(),
                          torch.randint(0, vocab, (r,), generator=g).tolist(), record))
    return out


def _trainer(hf_dir, cache, sparse: bool):
    from trainer.learner.model_provider import ModelConfig
    from trainer.learner.policy_trainer import OptimConfig, PolicyTrainer, TrainConfig

    model = ModelConfig(hf_checkpoint=hf_dir, dtype=torch.float32,
                        attention_backend="sdpa" if sparse else "auto")
    # Adam's first step maps a gradient g to lr·g/(|g| + eps): its slope lr/eps at g ≈ 0 turns
    # fp32 rounding of the gradient (the fused step scales a sum, not each term) into weight
    # noise; lr/eps = 10 keeps that at 1e-7 while the step still moves weights by up to 1e-3
    return PolicyTrainer(model, OptimConfig(lr=1e-3, weight_decay=0.01, adam_eps=1e-4,
                                            clip_grad=CLIP_GRAD),
                         TrainConfig(max_tokens_per_gpu=30, temperature=0.7,
                                     sparse_recompute=sparse, train_sparse_policy=sparse),
                         cache_dir=cache)


def _batch(samples, current, keep_all: bool):
    """π_sparse = π_old + offsets wide enough to truncate and reject tokens, and one
    catastrophic token (vetoes its sequence); the reference a little further off."""
    from trainer.learner.grpo_update import RolloutBatch

    rollout = [lp + 0.8 * torch.cos(torch.arange(len(lp)) * 1.7 + i) for i, lp in enumerate(current)]
    rollout[1] = rollout[1].clone()
    rollout[1][3] += 12.0  # π_old / π_sparse < 1e-4
    rewards = torch.tensor([float(i % 3 == 0) + 0.3 * i for i in range(len(current))])
    keep = None if keep_all else torch.tensor([True, True, True, False, True, True])
    ref = [lp - 0.1 * torch.sin(torch.arange(len(lp)) + i) for i, lp in enumerate(current)]
    return RolloutBatch(samples, rewards, rollout, n_samples_per_prompt=3, keep=keep), ref


def _configs(case: str):
    from trainer.algorithms import AdvantageConfig, PolicyLossConfig, correction_preset

    corr, loss = {
        "sparse_rl-token_mean": (correction_preset("sparse_rl"),
                                 PolicyLossConfig(kl_loss_coef=0.0, loss_agg_mode="token_mean")),
        "sparse_rl-seq_mean": (correction_preset("sparse_rl"), PolicyLossConfig(kl_loss_coef=0.0)),
        "decoupled_token_is-kl": (correction_preset("decoupled_token_is"),
                                  PolicyLossConfig(kl_loss_coef=0.1, loss_agg_mode="token_mean")),
        "uncorrected-entropy": (None, PolicyLossConfig(kl_loss_coef=0.0, entropy_coef=0.01,
                                                       loss_agg_mode="token_mean")),
        "sparse_rl-replay": (correction_preset("sparse_rl"),
                             PolicyLossConfig(kl_loss_coef=0.0, loss_agg_mode="token_mean")),
    }[case]
    return AdvantageConfig(estimator="grpo"), corr, loss


def _one_step(trainer, samples, batch, ref, case, fused: bool):
    """One rollout's update; returns what the comparison needs and the forwards it ran."""
    import dataclasses

    from trainer.learner import policy_trainer
    from trainer.learner.fused_old_logp import OldLogpPlan
    from trainer.learner.grpo_update import prepare_update, run_updates

    adv, corr, loss = _configs(case)
    initial = {n: p.detach().clone() for n, p in trainer.model.module.named_parameters()}
    calls = []
    real_forward = policy_trainer.packed_forward
    policy_trainer.packed_forward = lambda model, b: calls.append(1) or real_forward(model, b)
    try:
        plan = OldLogpPlan(True, "test") if fused else None  # None: today's path, as it was
        prep = prepare_update(trainer, batch, adv, corr, ref if loss.kl_loss_coef else None, plan)
        steps = run_updates(trainer, batch, prep, loss, len(samples))
    finally:
        policy_trainer.packed_forward = real_forward
    module = trainer.model.module
    return dict(initial_weights=initial, forwards=len(calls), steps=steps, metrics=dict(prep.metrics),
                prep={k: getattr(prep, k) for k in ("old_logp", "weights", "loss_mask")},
                weights={n: p.detach().clone() for n, p in module.named_parameters()},
                grads={n: p.main_grad.detach().clone() for n, p in module.named_parameters()})


def compare_task(rank, world, port, hf_dir, cache, case):
    from checkpoint_tools.model_config import load_arch
    from trainer.learner.grpo_update import gather_dp

    cpu_megatron.init_distributed(rank, world, master_port=port)
    cpu_megatron.init_model_parallel(tp=1, seed=1234)
    sparse = case.endswith("replay")
    arch = load_arch(hf_dir)
    samples = _samples(arch.vocab_size, sparse, arch.num_layers, arch.num_query_groups)
    out = {}
    for fused in (False, True):
        trainer = _trainer(hf_dir, cache, sparse)
        current = gather_dp(trainer.compute_logprobs(samples, sparse=sparse), trainer)
        batch, ref = _batch(samples, current, keep_all=case != "sparse_rl-token_mean")
        out[fused] = _one_step(trainer, samples, batch, ref, case, fused)
    return _summary(out[False], out[True])


def _summary(old: dict, new: dict) -> dict:
    """Plain numbers (tensors do not travel back from a spawned rank in bulk)."""
    prep_o, prep_n = old["prep"], new["prep"]
    weights = None if prep_o["weights"] is None else _max_diff(
        {0: prep_o["weights"]}, {0: prep_n["weights"]})
    return dict(forwards=(old["forwards"], new["forwards"]), steps=(old["steps"], new["steps"]),
                metrics=(old["metrics"], new["metrics"]),
                grad_diff=_max_diff(old["grads"], new["grads"]),
                grad_scale=_scale(old["grads"], new["grads"]),
                weight_diff=_max_diff(old["weights"], new["weights"]),
                grad_max=max(g.abs().max().item() for g in old["grads"].values()),
                moved=_max_diff(old["weights"], old["initial_weights"]),
                loss_mask_equal=torch.equal(prep_o["loss_mask"], prep_n["loss_mask"]),
                old_logp_diff=_max_diff({0: prep_o["old_logp"]}, {0: prep_n["old_logp"]}),
                is_weight_diff=weights)


def _scale(old: dict, new: dict) -> float:
    """The factor c minimising |new - c old| over every parameter's gradient (1: same scale)."""
    dot = sum(float((old[k].double() * new[k].double()).sum()) for k in old)
    return dot / sum(float(old[k].double().square().sum()) for k in old)


def _max_diff(a: dict, b: dict) -> float:
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.mark.parametrize("case,world", [
    ("sparse_rl-token_mean", 1), ("sparse_rl-seq_mean", 1), ("decoupled_token_is-kl", 1),
    ("uncorrected-entropy", 1), ("sparse_rl-replay", 1), ("sparse_rl-token_mean", 2)])
def test_fused_step_equals_recompute_then_update(case, world, tiny_model_factory, tmp_path):
    hf = tiny_model_factory("qwen2-untied")
    results = cpu_megatron.run_on_ranks((__file__, "compare_task"), world, str(hf),
                                        str(tmp_path / "c"), case)
    for r in results:  # DP ranks: each its own half of the batch, the same step
        _check(case, r)


def _check(case: str, r: dict) -> None:
    # one forward per micro-batch fewer: the recompute ran as many as the update
    old_forwards, new_forwards = r["forwards"]
    assert new_forwards > 0 and old_forwards == 2 * new_forwards
    print(f"{case}: max |Δgrad| {r['grad_diff']:.2e}, |Δweight| {r['weight_diff']:.2e}, "
          f"|Δπ_old| {r['old_logp_diff']:.2e}, |ΔIS weight| {r['is_weight_diff']}")
    assert r["grad_scale"] == pytest.approx(1.0, abs=TOL), "fused gradient wrongly scaled"
    assert r["grad_diff"] < TOL and r["weight_diff"] < TOL and r["old_logp_diff"] < TOL
    assert r["grad_max"] > 1e-3 and r["moved"] > 1e-4  # a real gradient, a real step
    assert r["loss_mask_equal"] and (r["is_weight_diff"] or 0.0) < TOL
    ((s_old,), (s_new,)), (m_old, m_new) = r["steps"], r["metrics"]
    assert s_new.keys() == s_old.keys() and s_old["grad_norm"] < CLIP_GRAD / 10  # not clipped
    for k in s_old:
        assert s_new[k] == pytest.approx(s_old[k], rel=TOL, abs=TOL), k
    assert m_old.pop("old_logp_fused", 0.0) == 0.0 and m_new.pop("old_logp_fused") == 1.0
    assert m_new.keys() == m_old.keys()
    for k in m_old:  # the correction's fractions, mismatch metrics, ESS, normaliser
        assert m_new[k] == pytest.approx(m_old[k], rel=TOL, abs=TOL), k
    worst = max(s_old, key=lambda k: abs(s_new[k] - s_old[k]))
    print(f"  max |Δmetric| {max(abs(m_new[k] - m_old[k]) for k in m_old):.2e}, max |Δstep "
          f"metric| {abs(s_new[worst] - s_old[worst]):.2e} ({worst} = {s_old[worst]:.4g})")
    if case.startswith("sparse_rl"):  # the batch really exercised the correction
        assert m_old["truncated_fraction"] > 0 and m_old["rs_rejected_fraction"] > 0
        assert m_old["vetoed_seq_fraction"] > 0 and m_old["batch_norm_factor"] != 1.0


# --- which path --------------------------------------------------------------------------------

def _reason(corr="sparse_rl", kl=0.0, entropy=0.0, steps=1, staleness=None, flag=True,
            sparse_recompute=False, train_sparse=False, kl_coefs=None):
    from trainer.algorithms import PolicyLossConfig, correction_preset
    from trainer.learner.fused_old_logp import recompute_reason
    from trainer.learner.grpo_update import RolloutBatch
    from trainer.learner.packing import Sample
    from trainer.learner.policy_trainer import TrainConfig

    batch = RolloutBatch([Sample([1], [2])] * 4, torch.zeros(4), [torch.zeros(1)] * 4,
                         n_samples_per_prompt=2, kl_coefs=kl_coefs)
    train = TrainConfig(sparse_recompute=sparse_recompute or train_sparse,
                        train_sparse_policy=train_sparse, fused_old_logprobs=flag)
    return recompute_reason(train, batch, PolicyLossConfig(kl_loss_coef=kl, entropy_coef=entropy),
                            corr and correction_preset(corr), 4 // steps, staleness)


def test_which_configurations_fuse():
    fused = [dict(), dict(corr="decoupled_token_is", kl=1e-3), dict(corr=None, kl=1e-3, entropy=0.01),
             dict(train_sparse=True), dict(staleness=0), dict(corr="decoupled_seq_is_rs", kl=1e-3)]
    for kwargs in fused:
        assert _reason(**kwargs) is None, kwargs
    kept = {"--no-fused-old-logprobs": dict(flag=False), "bypass": dict(corr="bypass_ppo_clip"),
            "--max-staleness 1": dict(staleness=1), "several optimizer steps": dict(steps=2),
            "--sparse-recompute without": dict(sparse_recompute=True),
            "batch-normalised": dict(kl=1e-4)}
    for why, kwargs in kept.items():
        assert why in _reason(**kwargs), kwargs
    assert "batch-normalised" in _reason(entropy=0.01)
    assert "batch-normalised" in _reason(kl_coefs=[0.0, 0.1, 0.0, 0.0])
    assert _reason(kl_coefs=[0.0] * 4) is None
