"""KL estimators against the textbook formulas, evaluated element by element in Python floats."""

import math

import pytest
import torch

from trainer.algorithms.kl import KL_TYPES, kl_estimate


def reference_kl(logp: float, ref: float, kind: str) -> float:
    """Schulman's estimators of KL(π_θ‖π_ref) from one sample, written from their definitions."""
    log_ratio = logp - ref  # log π_θ/π_ref
    if kind == "k1":
        return log_ratio
    if kind == "k2":
        return 0.5 * log_ratio ** 2
    x = ref - logp  # log π_ref/π_θ
    if kind == "k3":
        return math.exp(x) - x - 1.0
    x = min(max(x, -20.0), 20.0)  # low_var_kl: verl's clamps
    return min(max(math.exp(x) - x - 1.0, -10.0), 10.0)


@pytest.mark.parametrize("kind", KL_TYPES)
def test_matches_elementwise_reference(kind):
    g = torch.Generator().manual_seed(0)
    logp = -torch.rand(5, 7, generator=g) * 4
    ref = logp + torch.randn(5, 7, generator=g) * 0.7
    out = kl_estimate(logp, ref, kind)
    assert out.dtype == torch.float32 and out.shape == logp.shape
    for a, b, o in zip(logp.flatten().tolist(), ref.flatten().tolist(), out.flatten().tolist()):
        assert o == pytest.approx(reference_kl(a, b, kind), rel=1e-5, abs=1e-6)


def test_hand_computed_values():
    # log π_θ = log 0.5, log π_ref = log 0.25: log ratio = log 2.
    logp, ref = torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)])
    l2 = math.log(2.0)
    assert kl_estimate(logp, ref, "k1").item() == pytest.approx(l2)
    assert kl_estimate(logp, ref, "k2").item() == pytest.approx(0.5 * l2 * l2)
    # k3 = π_ref/π_θ − log(π_ref/π_θ) − 1 = 0.5 + log 2 − 1
    assert kl_estimate(logp, ref, "k3").item() == pytest.approx(0.5 + l2 - 1.0)
    assert kl_estimate(logp, ref, "low_var_kl").item() == pytest.approx(0.5 + l2 - 1.0)


@pytest.mark.parametrize("kind", KL_TYPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_identical_policies_give_exactly_zero(kind, dtype):
    logp = (-torch.rand(3, 9) * 6).to(dtype)
    out = kl_estimate(logp, logp.clone(), kind)
    assert out.dtype == torch.float32
    assert torch.equal(out, torch.zeros_like(out))


def test_low_var_kl_is_clamped_where_k3_is_not():
    logp = torch.tensor([-30.0, -1.0, -1.0])
    ref = torch.tensor([-1.0, -30.0, -3.0])
    k3 = kl_estimate(logp, ref, "k3")
    low = kl_estimate(logp, ref, "low_var_kl")
    assert k3[0].item() > 1e10  # e^29 − 29 − 1
    assert k3[1].item() == pytest.approx(28.0)  # e^-29 + 29 − 1
    assert low[:2].tolist() == [10.0, 10.0]
    assert low[2].item() == pytest.approx(math.exp(-2.0) + 2.0 - 1.0)  # inside the band: k3
    assert k3[2].item() == low[2].item()


def test_gradients_match_hand_derivatives():
    logp = torch.tensor([-1.0, -2.0, -0.5], requires_grad=True)
    ref = torch.tensor([-1.5, -1.0, -0.5])
    # d/dlogp: k1 -> 1; k2 -> (logp − ref); k3 -> 1 − exp(ref − logp)
    expected = {
        "k1": [1.0, 1.0, 1.0],
        "k2": [0.5, -1.0, 0.0],
        "k3": [1 - math.exp(-0.5), 1 - math.exp(1.0), 0.0],
        "low_var_kl": [1 - math.exp(-0.5), 1 - math.exp(1.0), 0.0],
    }
    for kind, grads in expected.items():
        (g,) = torch.autograd.grad(kl_estimate(logp, ref, kind).sum(), logp)
        assert g.tolist() == pytest.approx(grads, rel=1e-6), kind


def test_low_var_kl_has_no_gradient_when_clamped():
    logp = torch.tensor([-30.0], requires_grad=True)
    (g,) = torch.autograd.grad(kl_estimate(logp, torch.tensor([-1.0]), "low_var_kl").sum(), logp)
    assert g.item() == 0.0


def test_unknown_kind_rejected():
    with pytest.raises(ValueError, match="unknown kl type"):
        kl_estimate(torch.zeros(1), torch.zeros(1), "k4")
