"""Sparse-rollout correction against a plain-Python reference of the reference's mis.py semantics
(sparse_rl.md §2), hand-computed cases, metrics, presets, bypass and the correction flags."""

import argparse
import math

import pytest
import torch

from trainer.algorithms.argparse_flags import _CORRECTION_FLAGS, add_algorithm_args, config_from_args
from trainer.algorithms.correction import (
    PRESETS,
    CorrectionConfig,
    compute_mis_weights,
    correction_preset,
    mismatch_metrics,
    select_old_logp,
)


# ---------------------------------------------------------------- independent reference (floats)

def clamp(x, lo, hi):
    return min(max(x, lo), hi)


def reference(old_rows, roll_rows, cfg):
    """Weights and keep flags per sequence; rows hold only the response tokens of each sequence."""
    L = cfg.lower_bound if cfg.lower_bound is not None else 1 / cfg.upper_bound
    U = cfg.upper_bound
    rs_lo = L if cfg.rs_lower_bound is None else cfg.rs_lower_bound
    rs_hi = U if cfg.rs_upper_bound is None else cfg.rs_upper_bound
    weights, keeps, seq_weights = [], [], []
    for old, roll in zip(old_rows, roll_rows):
        lr = [o - r for o, r in zip(old, roll)]
        n = len(lr)

        def level_ratios(level):
            if level == "token":
                logs = lr
            elif level == "sequence":
                logs = [sum(lr)] * n
            else:
                logs = [sum(lr) / n] * n
            return [math.exp(clamp(x, -20, 20)) for x in logs]

        keep = [True] * n
        w = [1.0] * n
        if cfg.use_mis:
            rho = level_ratios(cfg.level)
            if cfg.mode == "truncate":
                w = [min(x, U) for x in rho]
            elif cfg.mode == "clip":
                w = [clamp(x, L, U) for x in rho]
            else:
                w = list(rho)
                keep = [k and L <= x <= U for k, x in zip(keep, rho)]
        if cfg.use_rs:
            keep = [k and rs_lo <= x <= rs_hi for k, x in zip(keep, level_ratios(cfg.rs_level))]
        if cfg.veto_threshold is not None and any(x < math.log(cfg.veto_threshold) for x in lr):
            keep = [False] * n
        weights.append(w)
        keeps.append(keep)
        seq_weights.append(w[0])
    if cfg.use_mis and cfg.batch_normalize:
        if cfg.level == "token":
            flat = [x for w in weights for x in w]
            mean = sum(flat) / len(flat)
        else:
            mean = sum(seq_weights) / len(seq_weights)
        if mean > 1e-8:
            weights = [[x / mean for x in w] for w in weights]
    return weights, keeps


def make_batch(lengths, T, seed, bias_scale=1.2, noise=0.35, catastrophic=True):
    """Padded [B, T] logprobs whose per-sequence log ratio has a bias (so geometric/sequence levels
    spread widely) plus per-token noise, and (optionally) one catastrophic token (ratio e^-10) in
    sequence 2; padding holds NaN to prove it is never read."""
    g = torch.Generator().manual_seed(seed)
    B = len(lengths)
    mask = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]
    roll = -torch.rand(B, T, generator=g) * 3 - 0.05
    bias = (torch.rand(B, 1, generator=g) * 2 - 1) * bias_scale
    old = roll + bias + torch.randn(B, T, generator=g) * noise
    if catastrophic:
        old[2, 4] = roll[2, 4] - 10.0
    nan = torch.full_like(old, float("nan"))
    return torch.where(mask, old, nan), torch.where(mask, roll, nan), mask


def rows(x, mask):
    return [[x[i, t].item() for t in range(x.shape[1]) if mask[i, t]] for i in range(x.shape[0])]


def check_against_reference(old, roll, mask, cfg):
    res = compute_mis_weights(old, roll, mask, cfg)
    ref_w, ref_keep = reference(rows(old, mask), rows(roll, mask), cfg)
    assert res.weights.dtype == torch.float32 and res.loss_mask.dtype == torch.bool
    assert not res.weights.requires_grad
    for i in range(mask.shape[0]):
        got_w = [res.weights[i, t].item() for t in range(mask.shape[1]) if mask[i, t]]
        got_keep = [bool(res.loss_mask[i, t]) for t in range(mask.shape[1]) if mask[i, t]]
        assert got_w == pytest.approx(ref_w[i], rel=1e-5), i
        assert got_keep == ref_keep[i], i
    assert torch.equal(res.weights[~mask], torch.zeros_like(res.weights[~mask]))
    assert not res.loss_mask[~mask].any()
    return res, ref_w, ref_keep


LENGTHS = [7, 3, 9, 1, 5, 8, 2, 6, 9, 4, 7, 5]


def assert_not_near_bounds(old, roll, mask, bounds):
    """Guard: no ratio at any level lies within 1e-4 (relative) of a bound, so fp32-vs-float64
    rounding cannot flip a decision and make the comparison flaky."""
    for o, r in zip(rows(old, mask), rows(roll, mask)):
        lr = [a - b for a, b in zip(o, r)]
        for x in lr + [sum(lr), sum(lr) / len(lr)]:
            for b in bounds:
                assert abs(math.exp(clamp(x, -20, 20)) / b - 1) > 1e-4


@pytest.mark.parametrize("level,rs_level", [("token", "token"), ("sequence", "sequence"),
                                            ("geometric", "geometric"), ("token", "geometric")])
@pytest.mark.parametrize("mode", ["truncate", "mask", "clip"])
@pytest.mark.parametrize("use_rs,veto,batch_normalize", [(False, None, False), (True, 1e-4, True),
                                                         (True, None, False), (False, 0.3, True)])
def test_every_level_and_mode_matches_reference(level, rs_level, mode, use_rs, veto, batch_normalize):
    old, roll, mask = make_batch(LENGTHS, 9, seed=11)
    cfg = CorrectionConfig(level=level, mode=mode, lower_bound=0.6, upper_bound=1.4, use_rs=use_rs,
                           rs_level=rs_level, rs_lower_bound=0.4, rs_upper_bound=2.5, veto_threshold=veto,
                           batch_normalize=batch_normalize)
    assert_not_near_bounds(old, roll, mask, [0.6, 1.4, 0.4, 2.5] + ([veto] if veto else []))
    res, ref_w, ref_keep = check_against_reference(old, roll, mask, cfg)
    # The data must make each mechanism bite, or the comparison proves little.
    flat_keep = [k for r in ref_keep for k in r]
    if mode in ("truncate", "clip"):
        assert res.metrics["truncated_fraction"] > 0
    if mode == "clip":
        assert res.metrics["clipped_low_fraction"] > 0
    if mode == "mask" or use_rs or veto:
        assert 0 < flat_keep.count(False) < len(flat_keep)
    if veto:
        assert res.metrics["vetoed_seq_fraction"] > 0


def test_reference_defaults_hand_computed():
    # Default = the reference's mis.yaml: token truncate U = 1.5, token RS [0.5, 1.5], veto 1e-4,
    # batch normalisation over all response tokens (original mask).
    #   seq 0 ratios [1.0, 2.0, 0.4]  -> w [1.0, 1.5, 0.4], keep [T, F, F]
    #   seq 1 ratios [1.2, 5e-5]      -> w [1.2, 5e-5],     5e-5 < 1e-4: whole sequence vetoed
    #   mean weight = (1.0 + 1.5 + 0.4 + 1.2 + 5e-5) / 5 = 0.82001
    ratios = torch.tensor([[1.0, 2.0, 0.4], [1.2, 5e-5, 1.0]])
    mask = torch.tensor([[True, True, True], [True, True, False]])
    roll = torch.full((2, 3), -1.0)
    old = roll + ratios.log()
    res = compute_mis_weights(old, roll, mask, CorrectionConfig())
    mean = (1.0 + 1.5 + 0.4 + 1.2 + 5e-5) / 5
    assert res.weights.tolist()[0] == pytest.approx([1.0 / mean, 1.5 / mean, 0.4 / mean], rel=1e-5)
    assert res.weights.tolist()[1] == pytest.approx([1.2 / mean, 5e-5 / mean, 0.0], rel=1e-5)
    assert res.loss_mask.tolist() == [[True, False, False], [False, False, False]]
    m = res.metrics
    assert m["batch_norm_factor"] == pytest.approx(mean, rel=1e-5)
    assert m["truncated_fraction"] == pytest.approx(1 / 5)
    assert m["rs_rejected_fraction"] == pytest.approx(3 / 5)  # 2.0, 0.4 and 5e-5 are outside [0.5, 1.5]
    assert m["catastrophic_token_fraction"] == pytest.approx(1 / 5)
    assert m["vetoed_seq_fraction"] == pytest.approx(1 / 2)
    assert m["rejected_fraction"] == pytest.approx(4 / 5)
    assert m["is_weight_mean"] == pytest.approx(1.0, rel=1e-5)
    # ESS of the applied weights: only token (0, 0) survives -> (w)²/(5·w²) = 1/5
    assert m["ess"] == pytest.approx(1 / 5, rel=1e-5)


def test_sequence_level_hand_computed():
    # Sequence ratios: Π[2, 1.5] = 3 -> truncated to 2 (decoupled_seq_is, U = 2);
    # Π[0.5, 1.2] = 0.6 -> kept as is. One weight per sequence, broadcast to its tokens.
    ratios = torch.tensor([[2.0, 1.5], [0.5, 1.2]])
    roll = torch.full((2, 2), -0.5)
    res = compute_mis_weights(roll + ratios.log(), roll, torch.ones(2, 2, dtype=torch.bool),
                              correction_preset("decoupled_seq_is"))
    assert res.weights.flatten().tolist() == pytest.approx([2.0, 2.0, 0.6, 0.6], rel=1e-5)
    assert res.loss_mask.all()
    # Geometric level: sqrt(3) and sqrt(0.6) — both inside [0.5, 1.5] with mask mode, so nothing drops;
    # with bounds [0.9, 1.5] the second sequence (0.7746) is masked out entirely.
    geo = CorrectionConfig(level="geometric", mode="mask", lower_bound=0.9, upper_bound=1.8, use_rs=False,
                           veto_threshold=None, batch_normalize=False)
    res = compute_mis_weights(roll + ratios.log(), roll, torch.ones(2, 2, dtype=torch.bool), geo)
    assert res.weights.flatten().tolist() == pytest.approx([3 ** 0.5] * 2 + [0.6 ** 0.5] * 2, rel=1e-5)
    assert res.loss_mask.tolist() == [[True, True], [False, False]]


def test_sequence_level_batch_norm_averages_sequences_not_tokens():
    # Weights 2 (seq of 3 tokens) and 1 (seq of 1 token): per-sequence mean is 1.5, per-token 1.75.
    ratios = torch.tensor([[2 ** (1 / 3)] * 3, [1.0, 1.0, 1.0]])
    mask = torch.tensor([[True, True, True], [True, False, False]])
    roll = torch.full((2, 3), -1.0)
    cfg = CorrectionConfig(level="sequence", upper_bound=5.0, use_rs=False, veto_threshold=None)
    res = compute_mis_weights(roll + ratios.log(), roll, mask, cfg)
    assert res.metrics["batch_norm_factor"] == pytest.approx(1.5, rel=1e-5)
    assert res.weights[0, 0].item() == pytest.approx(2 / 1.5, rel=1e-5)
    assert res.weights[1, 0].item() == pytest.approx(1 / 1.5, rel=1e-5)


def test_metrics_match_loop_reference():
    old, roll, mask = make_batch(LENGTHS, 9, seed=12, bias_scale=0.3, noise=0.2, catastrophic=False)
    m = compute_mis_weights(old, roll, mask, CorrectionConfig()).metrics
    assert all(isinstance(v, float) for v in m.values())
    o_rows, r_rows = rows(old, mask), rows(roll, mask)
    lr = [[a - b for a, b in zip(o, r)] for o, r in zip(o_rows, r_rows)]
    toks = [x for row in lr for x in row]
    N, S = len(toks), len(lr)
    assert m["kl"] == pytest.approx(sum(-x for x in toks) / N, rel=1e-5)
    assert m["k3_kl"] == pytest.approx(sum(math.exp(x) - x - 1 for x in toks) / N, rel=1e-5)
    assert m["chi2_token"] == pytest.approx(sum(math.exp(x) ** 2 for x in toks) / N - 1, rel=1e-5)
    assert m["chi2_seq"] == pytest.approx(sum(math.exp(sum(row)) ** 2 for row in lr) / S - 1, rel=1e-5)
    mean_o = [sum(o) / len(o) for o in o_rows]
    mean_r = [sum(r) / len(r) for r in r_rows]
    assert m["training_ppl"] == pytest.approx(sum(math.exp(-x) for x in mean_o) / S, rel=1e-5)
    assert m["rollout_ppl"] == pytest.approx(sum(math.exp(-x) for x in mean_r) / S, rel=1e-5)
    assert m["ppl_ratio"] == pytest.approx(sum(math.exp(b - a) for a, b in zip(mean_o, mean_r)) / S, rel=1e-5)
    assert m["log_ppl_abs_diff"] == pytest.approx(sum(abs(b - a) for a, b in zip(mean_o, mean_r)) / S, rel=1e-4)
    assert m["is_weight_mean_raw"] == pytest.approx(sum(math.exp(x) for x in toks) / N, rel=1e-5)
    assert m["truncated_fraction"] == pytest.approx(sum(math.exp(x) > 1.5 for x in toks) / N)
    assert m["rs_rejected_fraction"] == pytest.approx(sum(not 0.5 <= math.exp(x) <= 1.5 for x in toks) / N)
    # ESS of the applied weights (truncated, normalised, zero where rejected), over all N tokens
    w_ref, keep_ref = reference(o_rows, r_rows, CorrectionConfig())
    applied = [w if k else 0.0 for wr, kr in zip(w_ref, keep_ref) for w, k in zip(wr, kr)]
    assert m["ess"] == pytest.approx(sum(applied) ** 2 / (N * sum(w * w for w in applied)), rel=1e-5)
    assert 0 < m["ess"] < 1


def test_identical_policies_change_nothing():
    old, _, mask = make_batch(LENGTHS, 9, seed=13)
    for name in PRESETS:
        res = compute_mis_weights(old, old.clone(), mask, correction_preset(name))
        assert torch.equal(res.weights, mask.float()), name
        assert torch.equal(res.loss_mask, mask), name
        m = res.metrics
        for key in ("kl", "k3_kl", "chi2_token", "chi2_seq", "log_ppl_diff", "rejected_fraction",
                    "truncated_fraction", "vetoed_seq_fraction"):
            assert m[key] == 0.0, (name, key)
        assert m["ess"] == 1.0 and m["ppl_ratio"] == 1.0 and m["training_ppl"] == m["rollout_ppl"]


def test_bypass_and_select_old_logp():
    old, roll, mask = make_batch(LENGTHS, 9, seed=14)
    cfg = correction_preset("bypass_ppo_clip")
    assert not cfg.needs_dense_recompute
    assert select_old_logp(None, roll, cfg) is roll
    assert select_old_logp(old, roll, CorrectionConfig()) is old
    with pytest.raises(ValueError, match="required"):
        select_old_logp(None, roll, CorrectionConfig())
    with pytest.raises(ValueError, match="required"):
        compute_mis_weights(None, roll, mask, CorrectionConfig())
    # Bypass: π_old := π_sparse, nothing to correct even with every mechanism switched on.
    for c in (cfg, CorrectionConfig(bypass=True)):
        res = compute_mis_weights(None, roll, mask, c)
        assert torch.equal(res.weights, mask.float()) and torch.equal(res.loss_mask, mask)
        assert res.metrics["kl"] == 0.0 and res.metrics["ess"] == 1.0


def test_disabled_preset_reports_metrics_only():
    old, roll, mask = make_batch(LENGTHS, 9, seed=15)
    res = compute_mis_weights(old, roll, mask, correction_preset("disabled"))
    assert torch.equal(res.weights, mask.float()) and torch.equal(res.loss_mask, mask)
    expected = {k: v.item() for k, v in mismatch_metrics(old, roll, mask).items()}
    assert expected["kl"] != 0.0
    for key, value in expected.items():
        assert res.metrics[key] == pytest.approx(value), key


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_match_reference(name):
    old, roll, mask = make_batch(LENGTHS, 9, seed=16, bias_scale=0.3, noise=0.25)
    cfg = correction_preset(name)
    if not cfg.bypass:
        check_against_reference(old, roll, mask, cfg)


def test_preset_contents():
    ref = correction_preset("sparse_rl")
    assert ref == CorrectionConfig()
    assert (ref.level, ref.mode, ref.upper_bound, ref.rs_lower, ref.rs_upper, ref.veto_threshold,
            ref.batch_normalize, ref.use_rs) == ("token", "truncate", 1.5, 0.5, 1.5, 1e-4, True, True)
    tis = correction_preset("decoupled_token_is")
    assert (tis.level, tis.mode, tis.upper_bound, tis.use_rs, tis.veto_threshold) == ("token", "truncate", 2.0,
                                                                                        False, None)
    seq_rs = correction_preset("decoupled_seq_is_rs")
    assert (seq_rs.rs_level, seq_rs.rs_lower, seq_rs.rs_upper) == ("sequence", 0.5, 2.0)
    geo = correction_preset("decoupled_geo_rs")
    assert not geo.use_mis and geo.rs_level == "geometric"
    assert geo.rs_lower == pytest.approx(1 / 1.001) and geo.rs_upper == 1.001 and geo.veto_threshold == 1e-4
    assert correction_preset("decoupled_token_is", upper_bound=3.0).upper_bound == 3.0
    with pytest.raises(ValueError, match="unknown correction preset"):
        correction_preset("nope")


def test_geometric_rejection_drops_whole_sequences():
    # geometric ratios exp(0.0005) (inside ±0.1%) and exp(0.002) (outside): second sequence dropped.
    roll = torch.full((2, 4), -1.0)
    lr = torch.tensor([[0.001, 0.0, 0.001, 0.0], [0.002, 0.002, 0.002, 0.002]])
    res = compute_mis_weights(roll + lr, roll, torch.ones(2, 4, dtype=torch.bool),
                              correction_preset("decoupled_geo_rs"))
    assert res.loss_mask.tolist() == [[True] * 4, [False] * 4]
    assert torch.equal(res.weights, torch.ones(2, 4))


def test_bf16_inputs():
    old, roll, mask = make_batch(LENGTHS, 9, seed=17)
    old_bf, roll_bf = old.to(torch.bfloat16), roll.to(torch.bfloat16)
    a = compute_mis_weights(old_bf, roll_bf, mask, CorrectionConfig())
    b = compute_mis_weights(old_bf.float(), roll_bf.float(), mask, CorrectionConfig())
    assert a.weights.dtype == torch.float32
    assert torch.equal(a.weights, b.weights) and torch.equal(a.loss_mask, b.loss_mask)
    assert a.metrics == b.metrics


def test_config_validation():
    with pytest.raises(ValueError, match="level"):
        CorrectionConfig(level="batch")
    with pytest.raises(ValueError, match="mode"):
        CorrectionConfig(mode="cap")
    with pytest.raises(ValueError, match="lower_bound < upper_bound"):
        CorrectionConfig(mode="clip", lower_bound=2.0, upper_bound=1.5)
    with pytest.raises(ValueError, match="rs_lower_bound < rs_upper_bound"):
        CorrectionConfig(rs_lower_bound=3.0)
    with pytest.raises(ValueError, match="veto_threshold"):
        CorrectionConfig(veto_threshold=2.0)
    assert CorrectionConfig(lower_bound=None, upper_bound=4.0).is_lower_bound == 0.25


def test_correction_flags():
    assert set(_CORRECTION_FLAGS.values()) == set(CorrectionConfig.__dataclass_fields__)  # a flag per field
    parser = add_algorithm_args(argparse.ArgumentParser())
    assert config_from_args(parser.parse_args([])).correction == CorrectionConfig()
    argv = ["--mis-preset", "decoupled_geo_rs", "--mis-veto-threshold", "none", "--mis-rs-upper-bound", "1.01"]
    cfg = config_from_args(parser.parse_args(argv)).correction
    assert cfg.veto_threshold is None and cfg.rs_upper == 1.01 and cfg.rs_level == "geometric" and not cfg.use_mis
    cfg = config_from_args(parser.parse_args(
        ["--no-use-mis-rs", "--mis-level", "sequence", "--mis-mode", "clip", "--mis-lower-bound", "0.2",
         "--mis-upper-bound", "5", "--no-mis-batch-normalize", "--mis-bypass"])).correction
    assert (cfg.use_rs, cfg.level, cfg.mode, cfg.lower_bound, cfg.upper_bound, cfg.batch_normalize, cfg.bypass) == (
        False, "sequence", "clip", 0.2, 5.0, False, True)
    assert config_from_args(parser.parse_args(["--no-use-mis"])).correction.use_mis is False
    with pytest.raises(SystemExit):
        parser.parse_args(["--mis-level", "batch"])


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_all_zero_mask_is_finite(name):
    mask = torch.zeros(2, 3, dtype=torch.bool)
    res = compute_mis_weights(torch.zeros(2, 3), torch.zeros(2, 3), mask, correction_preset(name))
    assert all(math.isfinite(v) for v in res.metrics.values())
    assert not res.loss_mask.any() and not res.weights.any()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_matches_cpu(dtype):
    old, roll, mask = make_batch(LENGTHS, 9, seed=18)
    old, roll = old.to(dtype), roll.to(dtype)
    for name in sorted(PRESETS):
        cfg = correction_preset(name)
        cpu = compute_mis_weights(old, roll, mask, cfg)
        gpu = compute_mis_weights(old.cuda(), roll.cuda(), mask.cuda(), cfg)
        assert gpu.weights.is_cuda and gpu.loss_mask.is_cuda
        assert torch.equal(gpu.loss_mask.cpu(), cpu.loss_mask), name
        torch.testing.assert_close(gpu.weights.cpu(), cpu.weights, rtol=1e-5, atol=1e-6)
        for key, value in cpu.metrics.items():
            assert gpu.metrics[key] == pytest.approx(value, rel=1e-4, abs=1e-6), (name, key)
