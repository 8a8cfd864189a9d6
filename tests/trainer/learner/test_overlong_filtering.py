"""Over-long filtering in the update: a truncated row leaves the loss mask, its reward stays in
its group's baseline."""

import torch

from trainer.algorithms import AdvantageConfig, correction_preset
from trainer.learner.grpo_update import RolloutBatch, prepare_update
from trainer.learner.packing import Sample


def test_kept_rows_only_in_the_loss_mask():
    samples = [Sample([1], [5, 6]), Sample([1], [5, 6, 7]), Sample([1], [5])]
    logp = [torch.zeros(len(s.response_ids)) for s in samples]
    batch = RolloutBatch(samples, torch.tensor([1.0, 0.0, 0.0]), logp, n_samples_per_prompt=3,
                         keep=torch.tensor([True, False, True]))
    # bypass: no dense recompute, so no trainer is needed
    prep = prepare_update(None, batch, AdvantageConfig(estimator="dr_grpo"),
                          correction_preset("bypass_ppo_clip"))
    assert prep.loss_mask.tolist() == [[True, True, False], [False, False, False],
                                       [True, False, False]]
    # the truncated sample's 0 still counts in the mean: 1 - 1/3 for the first row
    assert torch.allclose(prep.advantages[0, :2], torch.tensor([2 / 3, 2 / 3]))
