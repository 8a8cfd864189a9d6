"""Policy loss against a plain-Python reference, hand-computed cases, micro-batch additivity,
masking, the first-step sanity checks and the loss flags."""

import argparse
import math

import pytest
import torch

from trainer.algorithms.argparse_flags import add_algorithm_args, config_from_args
from trainer.algorithms.policy_loss import AGG_MODES, LossScale, PolicyLossConfig, aggregate, policy_loss

NORM_LEN = 8


# ---------------------------------------------------------------- independent reference (floats)

def ref_kl(logp, ref, kind):
    lr = logp - ref
    if kind == "k1":
        return lr
    if kind == "k2":
        return 0.5 * lr * lr
    x = ref - logp
    if kind == "k3":
        return math.exp(x) - x - 1
    x = min(max(x, -20.0), 20.0)
    return min(max(math.exp(x) - x - 1, -10.0), 10.0)


def ref_aggregate(rows, mode, num_tokens=None, num_seqs=None):
    """rows: per sequence, the list of per-token values on its loss-mask tokens."""
    if mode == "token_mean":
        n = num_tokens if num_tokens is not None else max(sum(len(r) for r in rows), 1)
        return sum(sum(r) for r in rows) / n
    n = num_seqs if num_seqs is not None else len(rows)
    if mode == "seq_mean_token_mean":
        return sum(sum(r) / max(len(r), 1) for r in rows) / n
    return sum(sum(r) / NORM_LEN for r in rows) / n


def reference(logp, old, adv, mask, cfg, weights=None, ref=None, ent=None, num_tokens=None, num_seqs=None):
    """Loss and metrics written token by token from the PPO/GRPO definitions."""
    eps_lo, eps_hi = cfg.eps_clip, cfg.eps_clip if cfg.eps_clip_high is None else cfg.eps_clip_high
    rows = {k: [] for k in ("pg", "kl", "ent", "ppo_kl", "ratio", "high", "low", "dual")}
    for i in range(len(mask)):
        seq = {k: [] for k in rows}
        for t in range(len(mask[i])):
            if not mask[i][t]:
                continue
            a = adv[i][t]
            r = math.exp(logp[i][t] - old[i][t])
            pg = max(-a * r, -a * min(max(r, 1 - eps_lo), 1 + eps_hi))
            dual = False
            if cfg.eps_clip_c is not None and a < 0 and -a * cfg.eps_clip_c < pg:
                pg, dual = -a * cfg.eps_clip_c, True
            if weights is not None:
                pg *= weights[i][t]
            seq["pg"].append(pg)
            seq["ppo_kl"].append(old[i][t] - logp[i][t])
            seq["ratio"].append(r)
            seq["high"].append(float(a > 0 and r > 1 + eps_hi))
            seq["low"].append(float(a < 0 and r < 1 - eps_lo))
            seq["dual"].append(float(dual))
            if ref is not None:
                seq["kl"].append(ref_kl(logp[i][t], ref[i][t], cfg.kl_loss_type))
            if ent is not None:
                seq["ent"].append(ent[i][t])
        for k in rows:
            rows[k].append(seq[k])

    def agg(k):
        return ref_aggregate(rows[k], cfg.loss_agg_mode, num_tokens, num_seqs)

    out = {"pg_loss": agg("pg"), "ppo_kl": agg("ppo_kl"), "ratio_mean": agg("ratio"),
           "clipfrac_high": agg("high"), "clipfrac_low": agg("low"), "dual_clipfrac": agg("dual")}
    out["clipfrac"] = out["clipfrac_high"] + out["clipfrac_low"]
    loss = out["pg_loss"]
    if ref is not None:
        out["kl_loss"] = agg("kl")
        loss += cfg.kl_loss_coef * out["kl_loss"]
    if ent is not None:
        out["entropy"] = agg("ent")
        loss -= cfg.entropy_coef * out["entropy"]
    out["loss"] = loss
    return out


def random_batch(B=6, T=NORM_LEN, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    old = -torch.rand(B, T, generator=g) * 3
    logp = old + torch.randn(B, T, generator=g) * 0.4  # wide enough that clipping happens
    adv = torch.randn(B, T, generator=g)
    ref = old + torch.randn(B, T, generator=g) * 0.3
    ent = torch.rand(B, T, generator=g) * 2
    w = torch.rand(B, T, generator=g) * 1.5
    # Pin one token per clipping regime (position 0 is always a response token):
    # upper clip (A > 0, r = 1.6), lower clip (A < 0, r = 0.5), dual clip (A < 0, r = 4).
    for row, (a, r) in enumerate([(1.0, 1.6), (-1.0, 0.5), (-1.0, 4.0)]):
        adv[row, 0], logp[row, 0] = a, old[row, 0] + math.log(r)
    return dict(logp=logp, old=old, adv=adv, mask=mask, ref=ref, ent=ent, w=w)


CONFIGS = [
    dict(),
    dict(eps_clip_high=0.28),
    dict(eps_clip_c=3.0),
    dict(eps_clip=0.1, eps_clip_high=0.3, eps_clip_c=1.5),
]


@pytest.mark.parametrize("mode", AGG_MODES)
@pytest.mark.parametrize("cfg_kwargs", CONFIGS)
@pytest.mark.parametrize("kl_type", ["k1", "k2", "k3", "low_var_kl"])
def test_matches_reference(mode, cfg_kwargs, kl_type):
    b = random_batch()
    cfg = PolicyLossConfig(loss_agg_mode=mode, loss_agg_norm_length=NORM_LEN, kl_loss_coef=0.1,
                           kl_loss_type=kl_type, entropy_coef=0.01, **cfg_kwargs)
    loss, metrics = policy_loss(b["logp"], b["old"], b["adv"], b["mask"], cfg,
                                mis_weights=b["w"], ref_logp=b["ref"], entropy=b["ent"])
    expected = reference(b["logp"].tolist(), b["old"].tolist(), b["adv"].tolist(), b["mask"].tolist(), cfg,
                         weights=b["w"].tolist(), ref=b["ref"].tolist(), ent=b["ent"].tolist())
    assert loss.item() == pytest.approx(expected["loss"], rel=1e-5, abs=1e-6)
    for key, value in expected.items():
        assert metrics[key].item() == pytest.approx(value, rel=1e-5, abs=1e-6), key
    # The data must exercise both clip sides (and the dual clip where enabled) for this to mean much.
    assert expected["clipfrac_high"] > 0 and expected["clipfrac_low"] > 0
    if cfg.eps_clip_c is not None:
        assert expected["dual_clipfrac"] > 0


def test_hand_computed_tokens_and_gradients():
    # Four tokens, eps = 0.2, dual clip c = 3, token_mean over 4 tokens:
    #   A = +1, r = 1.5 -> max(−1.5, −1.2) = −1.2   (upper clip active, no gradient)
    #   A = −1, r = 0.5 -> max( 0.5,  0.8) =  0.8   (lower clip active, no gradient)
    #   A = −1, r = 5.0 -> max( 5.0,  1.2) =  5.0 -> min(5.0, 3.0) = 3.0 (dual clip, no gradient)
    #   A = +1, r = 0.5 -> max(−0.5, −0.8) = −0.5   (unclipped: d/dlogp = −A·r = −0.5)
    ratios = torch.tensor([[1.5, 0.5, 5.0, 0.5]])
    old = torch.full((1, 4), -2.0)
    logp = (old + ratios.log()).requires_grad_()
    adv = torch.tensor([[1.0, -1.0, -1.0, 1.0]])
    cfg = PolicyLossConfig(eps_clip=0.2, eps_clip_c=3.0, kl_loss_coef=0.0, loss_agg_mode="token_mean")
    loss, m = policy_loss(logp, old, adv, torch.ones(1, 4, dtype=torch.bool), cfg)
    assert loss.item() == pytest.approx((-1.2 + 0.8 + 3.0 - 0.5) / 4)
    assert m["clipfrac_high"].item() == 0.25 and m["clipfrac_low"].item() == 0.25
    assert m["clipfrac"].item() == 0.5 and m["dual_clipfrac"].item() == 0.25
    assert m["ratio_mean"].item() == pytest.approx((1.5 + 0.5 + 5.0 + 0.5) / 4)
    loss.backward()
    assert logp.grad.tolist()[0] == pytest.approx([0.0, 0.0, 0.0, -0.5 / 4], abs=1e-7)


def test_mis_weights_scale_the_policy_term_only():
    b = random_batch(seed=1)
    cfg = PolicyLossConfig(kl_loss_coef=0.5, entropy_coef=0.1)
    args = (b["logp"], b["old"], b["adv"], b["mask"], cfg)
    _, plain = policy_loss(*args, ref_logp=b["ref"], entropy=b["ent"])
    _, doubled = policy_loss(*args, mis_weights=torch.full_like(b["w"], 2.0), ref_logp=b["ref"], entropy=b["ent"])
    assert doubled["pg_loss"].item() == pytest.approx(2 * plain["pg_loss"].item(), rel=1e-6)
    assert doubled["kl_loss"].item() == plain["kl_loss"].item()
    assert doubled["entropy"].item() == plain["entropy"].item()
    assert doubled["loss"].item() == pytest.approx(plain["loss"].item() + plain["pg_loss"].item(), rel=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kl_type", ["k1", "k2", "k3", "low_var_kl"])
def test_first_step_sanity_ratio_one_and_zero_kl(dtype, kl_type):
    b = random_batch(seed=2)
    logp = b["logp"].to(dtype).requires_grad_()
    old = logp.detach().clone()  # π_θ = π_old: the dense recompute before the first update
    cfg = PolicyLossConfig(kl_loss_coef=1.0, kl_loss_type=kl_type, eps_clip_c=3.0)
    loss, m = policy_loss(logp, old, b["adv"], b["mask"], cfg, ref_logp=old.clone())  # ref = initial model
    assert m["ratio_mean"].item() == 1.0
    assert m["ppo_kl"].item() == 0.0
    assert m["kl_loss"].item() == 0.0
    assert m["clipfrac"].item() == 0.0 and m["dual_clipfrac"].item() == 0.0
    # loss = agg(−A·1): per-sequence means of −A averaged over sequences
    rows = [[-b["adv"][i, t].item() for t in range(NORM_LEN) if b["mask"][i, t]] for i in range(6)]
    assert loss.item() == pytest.approx(ref_aggregate(rows, "seq_mean_token_mean"), rel=1e-6)
    # gradient of an on-policy PPO step is the policy gradient −A/len_i/B, plus the KL gradient at
    # ref = θ: d k1/d logp = 1, while k2, k3 and low_var_kl have zero gradient there.
    loss.backward()
    lens = b["mask"].sum(1, keepdim=True).float()
    kl_grad = 1.0 if kl_type == "k1" else 0.0
    expected = torch.where(b["mask"], (-b["adv"] + kl_grad) / lens / 6, 0.0)
    torch.testing.assert_close(logp.grad.float(), expected, rtol=1e-2 if dtype == torch.bfloat16 else 1e-6,
                               atol=1e-6)


@pytest.mark.parametrize("mode", AGG_MODES)
def test_micro_batch_split_equals_whole_batch(mode):
    b = random_batch(B=7, seed=3)
    b["mask"][4] = False  # a fully rejected sequence still counts as a sequence
    cfg = PolicyLossConfig(loss_agg_mode=mode, loss_agg_norm_length=NORM_LEN, kl_loss_coef=0.2, entropy_coef=0.05,
                           eps_clip_c=2.0)

    def run(rows, scale):
        logp = b["logp"][rows].clone().requires_grad_()
        ent = b["ent"][rows].clone().requires_grad_()
        loss, m = policy_loss(logp, b["old"][rows], b["adv"][rows], b["mask"][rows], cfg,
                              mis_weights=b["w"][rows], ref_logp=b["ref"][rows], entropy=ent, loss_scale=scale)
        loss.backward()
        return loss, m, logp.grad, ent.grad

    whole_loss, whole_m, whole_g, whole_eg = run(slice(None), None)
    scale = LossScale.for_batch(b["mask"])
    assert scale.num_sequences == 7.0 and scale.num_tokens == float(b["mask"].sum())
    parts = [run(slice(0, 2), scale), run(slice(2, 5), scale), run(slice(5, 7), scale)]
    assert sum(p[0].item() for p in parts) == pytest.approx(whole_loss.item(), rel=1e-6)
    for key in whole_m:
        assert sum(p[1][key].item() for p in parts) == pytest.approx(whole_m[key].item(), rel=1e-5, abs=1e-7), key
    torch.testing.assert_close(torch.cat([p[2] for p in parts]), whole_g, rtol=1e-6, atol=1e-8)
    torch.testing.assert_close(torch.cat([p[3] for p in parts]), whole_eg, rtol=1e-6, atol=1e-8)
    # Without the global scale each part normalises by itself, which is not the whole-batch loss.
    local = [policy_loss(b["logp"][r], b["old"][r], b["adv"][r], b["mask"][r], cfg, mis_weights=b["w"][r],
                         ref_logp=b["ref"][r], entropy=b["ent"][r])[0].item()
             for r in (slice(0, 2), slice(2, 5), slice(5, 7))]
    assert sum(local) != pytest.approx(whole_loss.item(), rel=1e-3)


@pytest.mark.parametrize("mode", AGG_MODES)
def test_masked_positions_have_no_effect(mode):
    b = random_batch(seed=4)
    cfg = PolicyLossConfig(loss_agg_mode=mode, loss_agg_norm_length=NORM_LEN, kl_loss_coef=0.3, entropy_coef=0.1,
                           eps_clip_c=3.0)
    off = ~b["mask"]
    assert off.any()

    def run(fill):
        def garble(x, v):
            return torch.where(off, torch.full_like(x, v), x) if fill else x.clone()
        logp = garble(b["logp"], float("nan")).requires_grad_()
        ent = garble(b["ent"], float("inf")).requires_grad_()
        loss, m = policy_loss(logp, garble(b["old"], -float("inf")), garble(b["adv"], 1e30), b["mask"], cfg,
                              mis_weights=garble(b["w"], float("nan")), ref_logp=garble(b["ref"], 50.0), entropy=ent)
        loss.backward()
        return loss, m, logp.grad, ent.grad

    clean, garbled = run(False), run(True)
    assert torch.isfinite(garbled[0])
    assert garbled[0].item() == clean[0].item()
    for key in clean[1]:
        assert garbled[1][key].item() == clean[1][key].item(), key
    for g_clean, g_garbled in ((clean[2], garbled[2]), (clean[3], garbled[3])):
        assert torch.equal(g_clean, g_garbled)
        assert torch.equal(g_garbled[off], torch.zeros_like(g_garbled[off]))


def test_bf16_inputs_compute_in_fp32():
    b = random_batch(seed=5)
    cfg = PolicyLossConfig(kl_loss_coef=0.1)
    bf = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in b.items()}
    loss_bf, _ = policy_loss(bf["logp"], bf["old"], bf["adv"], bf["mask"], cfg, ref_logp=bf["ref"])
    up = {k: v.float() if v.is_floating_point() else v for k, v in bf.items()}
    loss_up, _ = policy_loss(up["logp"], up["old"], up["adv"], up["mask"], cfg, ref_logp=up["ref"])
    assert loss_bf.dtype == torch.float32
    assert loss_bf.item() == loss_up.item()  # the same bf16 values, computed in fp32


def test_sequence_advantages_broadcast():
    b = random_batch(seed=6)
    adv_seq = b["adv"][:, 0]
    cfg = PolicyLossConfig(kl_loss_coef=0.0)
    a, _ = policy_loss(b["logp"], b["old"], adv_seq, b["mask"], cfg)
    c, _ = policy_loss(b["logp"], b["old"], adv_seq[:, None].expand(-1, NORM_LEN), b["mask"], cfg)
    assert a.item() == c.item()


def test_aggregate_hand_computed():
    values = torch.tensor([[1.0, 2.0, 3.0, 99.0], [4.0, 99.0, 99.0, 99.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    assert aggregate(values, mask, "token_mean").item() == pytest.approx(10 / 4)
    assert aggregate(values, mask, "seq_mean_token_mean").item() == pytest.approx((2 + 4) / 2)
    sum_norm = aggregate(values, mask, "seq_mean_token_sum_norm", norm_length=4).item()
    assert sum_norm == pytest.approx((6 / 4 + 4 / 4) / 2)
    scale = LossScale(num_tokens=8, num_sequences=4)
    assert aggregate(values, mask, "token_mean", scale=scale).item() == pytest.approx(10 / 8)
    assert aggregate(values, mask, "seq_mean_token_mean", scale=scale).item() == pytest.approx(6 / 4)


def test_config_validation_and_missing_inputs():
    with pytest.raises(ValueError, match="eps_clip_c"):
        PolicyLossConfig(eps_clip_c=1.0)
    with pytest.raises(ValueError, match="loss_agg_norm_length"):
        PolicyLossConfig(loss_agg_mode="seq_mean_token_sum_norm")
    with pytest.raises(ValueError, match="kl_loss_type"):
        PolicyLossConfig(kl_loss_type="k4")
    with pytest.raises(ValueError, match="loss_agg_mode"):
        PolicyLossConfig(loss_agg_mode="sum")
    b = random_batch(seed=7)
    with pytest.raises(ValueError, match="needs ref_logp"):
        policy_loss(b["logp"], b["old"], b["adv"], b["mask"], PolicyLossConfig(kl_loss_coef=0.1))
    with pytest.raises(ValueError, match="needs entropy"):
        policy_loss(b["logp"], b["old"], b["adv"], b["mask"], PolicyLossConfig(kl_loss_coef=0, entropy_coef=0.1))
    cfg = PolicyLossConfig(kl_loss_coef=0.0)
    assert not cfg.needs_ref_logp and not cfg.needs_entropy and cfg.clip_high == cfg.eps_clip


def test_loss_flags():
    parser = add_algorithm_args(argparse.ArgumentParser())
    cfg = config_from_args(parser.parse_args([]))
    # reference run: eps 0.2/0.2, low_var_kl 1e-4, no entropy, per-sample token mean, GRPO with std
    assert cfg.loss == PolicyLossConfig()
    assert (cfg.loss.eps_clip, cfg.loss.clip_high, cfg.loss.kl_loss_coef, cfg.loss.kl_loss_type) == (
        0.2, 0.2, 1e-4, "low_var_kl")
    assert cfg.loss.loss_agg_mode == "seq_mean_token_mean" and cfg.loss.entropy_coef == 0.0
    assert (cfg.advantage.estimator, cfg.advantage.std_normalize, cfg.advantage.gamma) == ("grpo", True, 1.0)
    args = parser.parse_args(["--eps-clip-high", "0.28", "--eps-clip-c", "3", "--kl-loss-coef", "0",
                              "--kl-loss-type", "k2", "--entropy-coef", "0.01", "--loss-agg-mode",
                              "seq_mean_token_sum_norm", "--advantage-estimator", "rloo", "--gamma", "0.99",
                              "--disable-grpo-std-normalization"])
    args.rollout_max_response_len = 4096  # registered by the trainer's own flags
    cfg = config_from_args(args)
    assert (cfg.loss.clip_high, cfg.loss.eps_clip_c, cfg.loss.kl_loss_coef, cfg.loss.kl_loss_type) == (
        0.28, 3.0, 0.0, "k2")
    assert (cfg.loss.entropy_coef, cfg.loss.loss_agg_norm_length) == (0.01, 4096)
    assert (cfg.advantage.estimator, cfg.advantage.std_normalize, cfg.advantage.gamma) == ("rloo", False, 0.99)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode", AGG_MODES)
def test_cuda_matches_cpu(dtype, mode):
    b = {k: v.to(dtype) if v.is_floating_point() else v for k, v in random_batch(seed=8).items()}
    cfg = PolicyLossConfig(loss_agg_mode=mode, loss_agg_norm_length=NORM_LEN, kl_loss_coef=0.1, entropy_coef=0.01,
                           eps_clip_c=3.0)

    def run(device):
        d = {k: v.to(device) for k, v in b.items()}
        logp = d["logp"].clone().requires_grad_()
        loss, m = policy_loss(logp, d["old"], d["adv"], d["mask"], cfg, mis_weights=d["w"], ref_logp=d["ref"],
                              entropy=d["ent"], loss_scale=LossScale.for_batch(d["mask"]))
        loss.backward()
        return loss, m, logp.grad

    cpu, gpu = run("cpu"), run("cuda")
    assert gpu[0].dtype == torch.float32 and gpu[0].is_cuda
    assert gpu[0].item() == pytest.approx(cpu[0].item(), rel=1e-5)
    for key in cpu[1]:
        assert gpu[1][key].item() == pytest.approx(cpu[1][key].item(), rel=1e-5, abs=1e-7), key
    torch.testing.assert_close(gpu[2].cpu(), cpu[2], rtol=1e-2 if dtype == torch.bfloat16 else 1e-5, atol=1e-6)
