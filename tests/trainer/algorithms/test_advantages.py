"""Advantage estimators against hand-computed numbers and plain-Python per-group references."""

import math
import statistics

import pytest
import torch

from trainer.algorithms.advantages import (ESTIMATORS, AdvantageConfig, advantages_for,
                                          compute_advantages)


def make_mask(lengths, T):
    return torch.tensor([[t < n for t in range(T)] for n in lengths])


def group_reference(estimator, rewards, groups, eps=1e-6):
    """Per-sample scalar advantage from the textbook definitions (statistics.stdev is Bessel-corrected)."""
    out = []
    for i, r in enumerate(rewards):
        members = [rewards[j] for j in range(len(rewards)) if groups[j] == groups[i]]
        if len(members) == 1:
            out.append(0.0)
            continue
        mean = sum(members) / len(members)
        if estimator == "grpo":
            out.append((r - mean) / (statistics.stdev(members) + eps))
        elif estimator == "dr_grpo":
            out.append(r - mean)
        elif estimator == "rloo":
            others = list(members)
            others.remove(r)
            out.append(r - sum(others) / len(others))
    return out


def whiten_reference(values):
    mean = sum(values) / len(values)
    var = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return [(v - mean) / math.sqrt(var + 1e-8) for v in values]


def assert_token_values(adv, mask, per_token):
    """adv[i, t] == per_token[i][t] on the mask and exactly 0 off it."""
    assert adv.dtype == torch.float32
    for i in range(adv.shape[0]):
        for t in range(adv.shape[1]):
            if mask[i, t]:
                assert adv[i, t].item() == pytest.approx(per_token[i][t], rel=1e-5, abs=1e-6), (i, t)
            else:
                assert adv[i, t].item() == 0.0, (i, t)


def test_grpo_hand_computed():
    # Group [1, 0, 0, 0]: mean 0.25, unbiased std sqrt(0.75/3) = 0.5.
    # Group [1, 1, 0, 1]: mean 0.75, std 0.5.
    rewards = torch.tensor([1.0, 0, 0, 0, 1, 1, 0, 1])
    mask = make_mask([3, 1, 2, 3, 3, 2, 1, 3], 3)
    adv = compute_advantages("grpo", rewards, mask, n_samples_per_prompt=4)
    expected = [1.5, -0.5, -0.5, -0.5, 0.5, 0.5, -1.5, 0.5]
    assert_token_values(adv, mask, [[e * 0.5 / (0.5 + 1e-6)] * 3 for e in expected])


def test_rloo_hand_computed():
    rewards = torch.tensor([1.0, 0, 0, 0])
    mask = make_mask([2, 2, 2, 2], 2)
    adv = compute_advantages("rloo", rewards, mask, n_samples_per_prompt=4)
    assert_token_values(adv, mask, [[1.0] * 2] + [[-1 / 3] * 2] * 3)


@pytest.mark.parametrize("estimator", ["grpo", "dr_grpo", "rloo"])
def test_group_estimators_match_reference_with_shuffled_group_labels(estimator):
    g = torch.Generator().manual_seed(1)
    groups = [7, 3, 7, 9, 3, 3, 7, 9, 42, 7]  # arbitrary labels, interleaved, one singleton (42)
    rewards = torch.randint(0, 3, (10,), generator=g).float() + torch.rand(10, generator=g)
    lengths = [5, 1, 4, 2, 5, 3, 3, 5, 2, 4]
    mask = make_mask(lengths, 5)
    adv = compute_advantages(estimator, rewards, mask, group_index=torch.tensor(groups))
    ref = group_reference(estimator, rewards.tolist(), groups)
    assert_token_values(adv, mask, [[a] * 5 for a in ref])


def test_contiguous_groups_equal_explicit_group_index():
    g = torch.Generator().manual_seed(2)
    rewards = torch.rand(12, generator=g)
    mask = make_mask([4] * 12, 4)
    for estimator in ("grpo", "dr_grpo", "rloo", "reinforce_plus_plus_baseline"):
        a = compute_advantages(estimator, rewards, mask, n_samples_per_prompt=3)
        b = compute_advantages(estimator, rewards, mask, group_index=torch.arange(12) // 3)
        assert torch.equal(a, b), estimator


def test_grpo_without_std_is_dr_grpo():
    rewards = torch.tensor([0.3, 0.9, 0.1, 1.0, 0.0, 0.5])
    mask = make_mask([3, 2, 1, 3, 3, 2], 3)
    a = compute_advantages("grpo", rewards, mask, n_samples_per_prompt=3, std_normalize=False)
    b = compute_advantages("dr_grpo", rewards, mask, n_samples_per_prompt=3)
    assert torch.equal(a, b)
    assert a[1, 0].item() == pytest.approx(0.9 - 1.3 / 3)


@pytest.mark.parametrize("estimator", ["grpo", "dr_grpo", "rloo", "reinforce_plus_plus_baseline"])
def test_singleton_groups_and_constant_groups_give_zero_not_nan(estimator):
    mask = make_mask([2, 2, 2, 2], 2)
    adv = compute_advantages(estimator, torch.tensor([1.0, 0.0, 1.0, 1.0]), mask,
                             group_index=torch.tensor([0, 1, 2, 2]))  # two singletons + a constant pair
    assert torch.isfinite(adv).all()
    assert torch.equal(adv, torch.zeros_like(adv))


def test_reinforce_plus_plus_matches_loop_reference():
    g = torch.Generator().manual_seed(3)
    B, T = 5, 6
    lengths = [6, 3, 1, 4, 5]
    mask = make_mask(lengths, T)
    rewards = torch.randn(B, generator=g)
    penalty = torch.rand(B, T, generator=g) * 0.1
    for gamma in (1.0, 0.9):
        for use_penalty in (False, True):
            adv = compute_advantages("reinforce_plus_plus", rewards, mask, gamma=gamma,
                                     token_level_penalty=penalty if use_penalty else None)
            returns = []
            for i in range(B):
                n = lengths[i]
                token_r = [(-penalty[i, t].item() if use_penalty else 0.0) for t in range(n)]
                token_r[n - 1] += rewards[i].item()
                returns.append([sum(gamma ** (k - t) * token_r[k] for k in range(t, n)) for t in range(n)])
            flat = whiten_reference([v for row in returns for v in row])
            it = iter(flat)
            per_token = [[next(it) for _ in range(n)] for n in lengths]
            assert_token_values(adv, mask, [row + [0.0] * (T - len(row)) for row in per_token])


def test_reinforce_plus_plus_hand_computed_gamma_half():
    # One sequence of 3 tokens, reward 1 on the last token, γ = 0.5 -> returns [0.25, 0.5, 1];
    # a second sequence of 1 token with reward 0 -> return [0]. Whiten over the 4 tokens.
    mask = make_mask([3, 1], 3)
    adv = compute_advantages("reinforce_plus_plus", torch.tensor([1.0, 0.0]), mask, gamma=0.5)
    vals = [0.25, 0.5, 1.0, 0.0]
    mean = 1.75 / 4
    std = math.sqrt(sum((v - mean) ** 2 for v in vals) / 3 + 1e-8)
    assert adv[0].tolist() == pytest.approx([(v - mean) / std for v in vals[:3]], rel=1e-5)
    assert adv[1].tolist() == pytest.approx([(0.0 - mean) / std, 0.0, 0.0], rel=1e-5)
    assert adv[0, 2].item() == pytest.approx(1.31747, abs=1e-4)  # (1 − 0.4375)/0.426956


def test_reinforce_plus_plus_baseline_matches_loop_reference():
    rewards = [1.0, 0.0, 1.0, 1.0, 0.0, 0.0]
    lengths = [3, 2, 1, 3, 3, 2]
    mask = make_mask(lengths, 3)
    adv = compute_advantages("reinforce_plus_plus_baseline", torch.tensor(rewards), mask, n_samples_per_prompt=3)
    centred = [r - sum(rewards[3 * (i // 3):3 * (i // 3) + 3]) / 3 for i, r in enumerate(rewards)]
    flat = whiten_reference([centred[i] for i in range(6) for _ in range(lengths[i])])
    it = iter(flat)
    assert_token_values(adv, mask, [[next(it) for _ in range(n)] + [0.0] * (3 - n) for n in lengths])


def test_bf16_rewards_and_float_mask_give_fp32_output():
    mask = make_mask([2, 2], 2).float()
    adv = compute_advantages("grpo", torch.tensor([1.0, 0.0], dtype=torch.bfloat16), mask, n_samples_per_prompt=2)
    assert adv.dtype == torch.float32
    s = 1 / (math.sqrt(0.5) + 1e-6) * 0.5
    assert adv.flatten().tolist() == pytest.approx([s, s, -s, -s], rel=1e-5)


def test_config_wrapper_and_argument_errors():
    mask = make_mask([1, 1], 1)
    cfg = AdvantageConfig(estimator="rloo")
    rows = advantages_for(cfg, torch.tensor([1.0, 0.0]), mask, n_samples_per_prompt=2)
    assert rows.flatten().tolist() == [1.0, -1.0]
    with pytest.raises(ValueError, match="unknown advantage estimator"):
        AdvantageConfig(estimator="ppo")
    with pytest.raises(ValueError, match="exactly one"):
        compute_advantages("grpo", torch.zeros(2), mask)
    with pytest.raises(ValueError, match="not a multiple"):
        compute_advantages("grpo", torch.zeros(2), mask, n_samples_per_prompt=3)
    with pytest.raises(ValueError, match="token_level_penalty"):
        compute_advantages("grpo", torch.zeros(2), mask, n_samples_per_prompt=2, token_level_penalty=torch.zeros(2, 1))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_cuda_matches_cpu(estimator):
    g = torch.Generator().manual_seed(9)
    rewards = torch.rand(12, generator=g).to(torch.bfloat16)
    mask = make_mask([5, 1, 4, 2, 5, 3, 3, 5, 2, 4, 1, 5], 5)
    groups = torch.tensor([4, 1, 4, 2, 1, 1, 4, 2, 9, 4, 2, 1])
    kw = {} if estimator == "reinforce_plus_plus" else {"group_index": groups}
    cpu = compute_advantages(estimator, rewards, mask, gamma=0.9, **kw)
    kw = {k: v.cuda() for k, v in kw.items()}
    gpu = compute_advantages(estimator, rewards.cuda(), mask.cuda(), gamma=0.9, **kw)
    assert gpu.is_cuda and gpu.dtype == torch.float32
    torch.testing.assert_close(gpu.cpu(), cpu, rtol=1e-5, atol=1e-6)
