"""The multi-turn loss mask on a 2-turn sample, by hand: observation tokens are context only, out
of the advantages, the correction's ratios and rejections, the mismatch metrics and the loss;
a single-turn sample (no mask) is every response token, as before."""

import math

import torch

from trainer.algorithms import AdvantageConfig, PolicyLossConfig, correction_preset, policy_loss
from trainer.algorithms.policy_loss import LossScale
from trainer.learner.grpo_update import RolloutBatch, apply_correction, prepare_update, response_mask
from trainer.learner.packing import Sample
from trainer.rollout.engines.interface import Generation
from trainer.rollout.learner_batch import learner_sample
from trainer.rollout.samples.traces import Call

# sample 0: model turn [10, 11], observation [20, 21, 22], model turn [12]; sample 1: one turn
TWO_TURN = Sample([1, 2], [10, 11, 20, 21, 22, 12], loss_mask=[1, 1, 0, 0, 0, 1])
ONE_TURN = Sample([1, 2], [13, 14])
MODEL = torch.tensor([[1, 1, 0, 0, 0, 1], [1, 1, 0, 0, 0, 0]], dtype=torch.bool)
# the sampler has no log-prob for an observation (0); π_old has one, far off: any leak shows
ROLLOUT = [torch.tensor([-1.0, -1.0, 0.0, 0.0, 0.0, -1.0]), torch.tensor([-1.0, -1.0])]
OLD = torch.tensor([[-0.9, -0.9, -12.0, -12.0, -12.0, -0.9], [-1.0, -1.0, 0.0, 0.0, 0.0, 0.0]])


def _batch() -> RolloutBatch:
    return RolloutBatch([TWO_TURN, ONE_TURN], torch.tensor([1.0, 0.0]), ROLLOUT,
                        n_samples_per_prompt=2)


def test_mask_is_the_model_tokens():
    assert response_mask([TWO_TURN, ONE_TURN], 6).equal(MODEL)


def test_advantages_only_on_model_tokens():
    prep = prepare_update(None, _batch(), AdvantageConfig(estimator="dr_grpo"),
                          correction_preset("bypass_ppo_clip"))
    # dr_grpo: reward - group mean (0.5), on model tokens only
    assert prep.advantages.tolist() == [[0.5, 0.5, 0, 0, 0, 0.5], [-0.5, -0.5, 0, 0, 0, 0]]
    assert prep.loss_mask.equal(MODEL)


def test_correction_and_metrics_ignore_observations():
    rollout = torch.stack([ROLLOUT[0], torch.tensor([-1.0, -1.0, 0, 0, 0, 0])])
    done = apply_correction(OLD, rollout, MODEL, None, correction_preset("sparse_rl"))
    # the observations' log ratio of -12 is below the veto (1e-4): had it counted, sample 0
    # would be vetoed whole
    assert done.loss_mask.equal(MODEL)
    e = math.exp(0.1)
    norm = (3 * e + 2) / 5  # batch normalisation over the 5 model tokens
    expected = torch.tensor([[e, e, 0, 0, 0, e], [1, 1, 0, 0, 0, 0]]) / norm
    assert torch.allclose(done.weights, expected, atol=1e-6)
    m = done.metrics
    assert math.isclose(m["k3_kl"], 3 * (e - 0.1 - 1) / 5, rel_tol=1e-5)
    assert math.isclose(m["kl"], -0.3 / 5, rel_tol=1e-5)
    assert math.isclose(m["train_rollout_logprob_abs_diff"], 0.3 / 5, rel_tol=1e-5)
    # per-sequence perplexity over model tokens: exp(0.9) and exp(1.0)
    assert math.isclose(m["training_ppl"], (math.exp(0.9) + math.exp(1.0)) / 2, rel_tol=1e-5)
    seq = apply_correction(OLD, rollout, MODEL, None, correction_preset("decoupled_seq_is"))
    assert math.isclose(float(seq.weights[0, 0]), math.exp(0.3), rel_tol=1e-5)  # not e^(0.3-36)


def test_loss_by_hand():
    """token_mean PPO loss at ratio 1 over the 5 model tokens: -(3 x 0.5 - 2 x 0.5) / 5."""
    prep = prepare_update(None, _batch(), AdvantageConfig(estimator="dr_grpo"),
                          correction_preset("bypass_ppo_clip"))
    cfg = PolicyLossConfig(kl_loss_coef=0.0, loss_agg_mode="token_mean")
    logp = torch.tensor([[-1.0, -1.0, 0, 0, 0, -1.0], [-1.0, -1.0, 0, 0, 0, 0]], requires_grad=True)
    loss, _ = policy_loss(logp, logp.detach(), prep.advantages, prep.loss_mask, cfg,
                          loss_scale=LossScale.for_batch(prep.loss_mask))
    assert math.isclose(float(loss.detach()), -(1.5 - 1.0) / 5, rel_tol=1e-6)
    loss.backward()
    assert logp.grad[0, 2:5].abs().sum() == 0  # no gradient through observation tokens
    assert torch.allclose(logp.grad[0, [0, 1, 5]], torch.full((3,), -0.5 / 5))


def test_the_call_carries_its_mask_to_the_learner():
    gen = Generation([10, 11, 20, 12], [-1.0, -1.0, 0.0, -1.0], "", "stop", None, {})
    sample = learner_sample(Call([1, 2], gen, loss_mask=[1, 1, 0, 1]), pad_id=0)
    assert sample.loss_mask == [1, 1, 0, 1]
    assert learner_sample(Call([1, 2], gen), pad_id=0).loss_mask is None
