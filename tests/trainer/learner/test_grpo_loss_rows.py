"""The GRPO loss on response rows (``grpo_update.GRPOLoss``: one gather per micro-batch, its row
ids copied with the pack) against the per-sample loss it replaced (split, a pad per sample, a
stack, the row ids built and copied per micro-batch): the same loss metrics and the same
gradients, bit for bit, over several micro-batches, with entropy, KL and the sparse_rl
correction (recomputed π_old) and fused (π_old from the forward itself).

Mutation check: ``GRPOLoss`` picking its prep rows in reverse (``rows.ids_device.flip(0)``)
fails ``test_rows_loss_equals_per_sample_loss``; so does ``PackedBatch.response_rows`` reading
each row one token late."""

from __future__ import annotations

import pytest
import torch

from checkpoint_tools import cpu_megatron

SHAPES = ((5, 7), (3, 12), (9, 1), (4, 4), (6, 9), (2, 5))


def per_sample_loss(prep, loss_cfg, scale):
    """The GRPO loss as a per-sample ``LossFn``, the way ``make_loss_fn`` built it before."""
    from trainer.algorithms import policy_loss
    from trainer.learner.grpo_update import _anchor

    def rows(base, values):
        padded = [torch.nn.functional.pad(r.float(), (0, base.shape[1] - r.shape[0]))
                  for r in values]
        return torch.stack(padded)

    def loss_fn(logp_list, entropy_list, ids):
        width = prep.advantages.shape[1]
        index = torch.tensor(ids)
        logp = rows(torch.zeros(len(ids), width), logp_list)
        entropy = rows(torch.zeros_like(logp), entropy_list) if entropy_list else None
        pick = lambda t: None if t is None else t[index]  # noqa: E731
        old, weights, loss_mask = _anchor(prep, logp, pick)
        return policy_loss(logp, old, pick(prep.advantages), loss_mask, loss_cfg,
                           mis_weights=weights, ref_logp=pick(prep.ref_logp), entropy=entropy,
                           loss_scale=scale, row_weights=pick(prep.row_weights),
                           kl_coefs=pick(prep.kl_coefs))

    return loss_fn


def compare_task(rank, world, port, hf_dir):
    from trainer.learner.model_provider import ModelConfig
    from trainer.learner.policy_trainer import OptimConfig, PolicyTrainer, TrainConfig

    cpu_megatron.init_distributed(rank, world, master_port=port)
    cpu_megatron.init_model_parallel(tp=1)
    # lr 0: every step starts from the same weights
    trainer = PolicyTrainer(ModelConfig(hf_checkpoint=hf_dir, dtype=torch.float32),
                            OptimConfig(lr=0.0, clip_grad=1e6),
                            TrainConfig(max_tokens_per_gpu=30, temperature=0.7),
                            load_weights=False)
    return {fused: _compare(trainer, fused) for fused in (False, True)}


def _compare(trainer, fused: bool) -> dict:
    from trainer.algorithms import AdvantageConfig, LossScale, PolicyLossConfig, correction_preset
    from trainer.learner.fused_old_logp import OldLogpPlan
    from trainer.learner.grpo_update import RolloutBatch, gather_dp, make_loss_fn, prepare_update
    from trainer.learner.packing import Sample

    g = torch.Generator().manual_seed(0)
    samples = [Sample(torch.randint(0, 400, (p,), generator=g).tolist(),
                      torch.randint(0, 400, (r,), generator=g).tolist()) for p, r in SHAPES]
    current = gather_dp(trainer.compute_logprobs(samples), trainer)
    rollout = [lp + 0.8 * torch.cos(torch.arange(len(lp)) * 1.7 + i) for i, lp in enumerate(current)]
    batch = RolloutBatch(samples, torch.tensor([1.0, 0.0, 0.5, 0.2, 1.0, 0.0]), rollout,
                         n_samples_per_prompt=3, loss_weights=[1.0, 0.5, 1.0, 2.0, 1.0, 1.0])
    ref = [lp - 0.1 * torch.sin(torch.arange(len(lp)) + i) for i, lp in enumerate(current)]
    loss_cfg = PolicyLossConfig(kl_loss_coef=0.0 if fused else 0.1, entropy_coef=0.01,
                                loss_agg_mode="token_mean")
    plan = OldLogpPlan(True, "test") if fused else None
    prep = prepare_update(trainer, batch, AdvantageConfig("grpo"), correction_preset("sparse_rl"),
                          None if fused else ref, plan)
    scale = LossScale.for_batch(prep.loss_mask, row_weights=prep.row_weights)
    out = {}
    for name, loss in (("per_sample", per_sample_loss(prep, loss_cfg, scale)),
                       ("rows", make_loss_fn(prep, loss_cfg, scale))):
        metrics = trainer.train_step(samples, loss, with_entropy=True)
        grads = {n: p.main_grad.clone() for n, p in trainer.model.module.named_parameters()}
        out[name] = (metrics, grads)
    return _summary(out, len(trainer._micro_batches(samples, list(range(len(samples))))))


def _summary(out: dict, micro: int) -> dict:
    """Plain values (tensors do not travel back from a spawned rank in bulk)."""
    (m_old, g_old), (m_new, g_new) = out["per_sample"], out["rows"]
    return dict(micro=micro, metrics=(m_old, m_new), names=(sorted(g_old), sorted(g_new)),
                unequal=[n for n in g_old if not torch.equal(g_new[n], g_old[n])],
                grad_max=max(g.abs().max().item() for g in g_old.values()))


@pytest.fixture(scope="module")
def compared(tiny_model_factory):
    hf = tiny_model_factory("qwen2-untied")
    (by_case,) = cpu_megatron.run_on_ranks((__file__, "compare_task"), 1, str(hf))
    return by_case


@pytest.mark.parametrize("fused", [False, True])
def test_rows_loss_equals_per_sample_loss(fused, compared):
    r = compared[fused]
    m_old, m_new = r["metrics"]
    assert r["micro"] >= 3  # the rows of several micro-batches
    assert m_new == m_old  # every loss metric, the gradient norm included: bit for bit
    assert m_old["loss"] != 0.0 and m_old["clipfrac"] + m_old["entropy"] > 0
    assert r["names"][0] == r["names"][1] and r["unequal"] == []  # every gradient bit for bit
    assert r["grad_max"] > 1e-4  # a real gradient
