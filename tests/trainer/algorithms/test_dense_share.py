"""Dense share in the update: the correction runs on the sparse samples only (its fractions over
their tokens), dense samples weigh 1 and are never rejected, and the group's advantages use all
n samples as a hand computation does."""

from __future__ import annotations

import pytest
import torch

import trainer.learner.grpo_update as grpo_update
from trainer.algorithms import AdvantageConfig, compute_mis_weights, correction_preset
from trainer.algorithms.dense_share import correct_with_dense_rows
from trainer.learner.packing import Sample


def mixed_rollout():
    """Two prompts x 3 samples, the first of each dense; sparse rows with a mismatch that
    the reference correction rejects, truncates and (row 4) vetoes."""
    lens = [3, 4, 2, 4, 3, 2]
    dense = torch.tensor([True, False, False, True, False, False])
    g = torch.Generator().manual_seed(0)
    old = [-torch.rand(n, generator=g) for n in lens]
    roll = [o + (0.0 if d else 0.9 * torch.randn(len(o), generator=g)) for o, d in zip(old, dense)]
    roll[0] = old[0] + 1e-6  # numerics only
    roll[4] = old[4] + torch.tensor([0.0, 12.0, 0.0])  # catastrophic: vetoed
    return lens, dense, old, roll


def pad(rows):
    return grpo_update.pad_rows(rows, 4)


def test_correction_over_sparse_rows_only():
    lens, dense, old, roll = mixed_rollout()
    mask = torch.arange(4)[None] < torch.tensor(lens)[:, None]
    cfg = correction_preset("sparse_rl")
    mis = correct_with_dense_rows(pad(old), pad(roll), mask, dense, cfg)
    sparse = ~dense
    alone = compute_mis_weights(pad(old)[sparse], pad(roll)[sparse], mask[sparse], cfg)
    assert torch.allclose(mis.weights[sparse], alone.weights)  # same batch normalisation
    assert torch.equal(mis.loss_mask[sparse], alone.loss_mask)
    for k, v in alone.metrics.items():  # every fraction and diagnostic over sparse tokens
        assert mis.metrics[k] == pytest.approx(v), k
    assert torch.equal(mis.weights[dense], mask[dense].float())
    assert torch.equal(mis.loss_mask[dense], mask[dense])
    assert mis.metrics["vetoed_seq_fraction"] == pytest.approx(1 / 4)
    assert mis.metrics["rs_rejected_fraction"] > 0
    assert mis.metrics["dense_token_fraction"] == pytest.approx(7 / 18)
    # even a dense row with a mismatch (numerics gone wrong) is not rejected
    roll_bad = list(roll)
    roll_bad[3] = old[3] + 12.0
    mis2 = correct_with_dense_rows(pad(old), pad(roll_bad), mask, dense, cfg)
    assert torch.equal(mis2.loss_mask[dense], mask[dense]) and mis2.metrics == mis.metrics
    plain = correct_with_dense_rows(pad(old), pad(roll), mask, None, cfg)
    assert plain.metrics == compute_mis_weights(pad(old), pad(roll), mask, cfg).metrics


class FakeTrainer:
    """The dense recompute: π_old given per sample."""

    class train_cfg:
        sparse_recompute = False

    def __init__(self, old):
        self.old = old

    def compute_logprobs(self, samples, sparse=False):
        return list(self.old)


def test_prepare_update_mixed_group(monkeypatch):
    monkeypatch.setattr(grpo_update, "gather_dp", lambda values, trainer: values)
    lens, dense, old, roll = mixed_rollout()
    samples = [Sample([1, 2], list(range(5, 5 + n))) for n in lens]
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0])
    batch = grpo_update.RolloutBatch(samples, rewards, roll, n_samples_per_prompt=3, dense=dense)
    prep = grpo_update.prepare_update(FakeTrainer(old), batch, AdvantageConfig(),
                                      correction_preset("sparse_rl"))
    # GRPO by hand over all three samples of each group, dense and sparse alike
    want = []
    for grp in (rewards[:3], rewards[3:]):
        mean, std = sum(grp.tolist()) / 3, float(grp.std())
        want += [(r - mean) / (std + 1e-6) for r in grp.tolist()]
    for i, n in enumerate(lens):
        assert prep.advantages[i, :n].tolist() == pytest.approx([want[i]] * n, rel=1e-5)
    assert torch.equal(prep.weights[dense], prep.loss_mask[dense].float())
    assert prep.loss_mask[3].all() and not prep.loss_mask[4].any()  # row 4 vetoed
    sparse_mask = (torch.arange(4)[None] < torch.tensor(lens)[:, None]) & ~dense[:, None]
    diff = (pad(old) - pad(roll))[sparse_mask].abs().mean()
    assert prep.metrics["train_rollout_logprob_abs_diff"] == pytest.approx(float(diff))
    assert prep.metrics["train_rollout_logprob_abs_diff_dense"] < 1e-6
    # the adaptive budget reads the sparse samples only
    d, s, m = grpo_update.mismatch_inputs(batch, prep)
    assert torch.equal(m, sparse_mask) and torch.equal(s, pad(roll))
