"""CUDA paths of the trainer's fusions against their torch references (skipped without a GPU):
the Triton log-prob kernels, the fp32-accumulating weight-gradient GEMM, and the compiled
RMSNorm / RoPE."""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _case(rows=300, n_cols=5120, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    logits = (torch.randn(rows, n_cols, device="cuda", generator=g) * 4).bfloat16()
    targets = torch.randint(0, n_cols, (rows,), device="cuda", generator=g)
    return logits, targets, g


@pytest.mark.parametrize("vocab_start,vocab_size", [(0, 5000), (0, None), (5120, 9000)])
def test_triton_row_stats_and_grad_match_torch_reference(vocab_start, vocab_size):
    from trainer.learner.fusions.logprob_triton import logits_grad, row_stats
    from trainer.learner.logprobs import _chunk_grad, _chunk_stats

    logits, _, g = _case()
    # targets below vocab_start belong to another TP rank's slice
    targets = torch.randint(0, vocab_size or 5120, (logits.shape[0],), device="cuda", generator=g)
    ours = row_stats(logits, targets, 0.7, vocab_start, vocab_size)
    ref = _chunk_stats(logits, targets, 0.7, vocab_start, vocab_size)
    torch.testing.assert_close(ours[0], ref[0])  # max
    for a, b in zip(ours[1:], ref[1:]):  # sum exp, sum exp*z, target logit
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)

    lse = ref[0] + ref[1].log()
    entropy = lse - ref[2] / ref[1]
    dlogp = torch.randn(logits.shape[0], device="cuda", generator=g)
    dent = torch.randn(logits.shape[0], device="cuda", generator=g)
    for grad_entropy in (dent, None):
        ours = logits_grad(logits, targets, lse, entropy, dlogp, grad_entropy, 0.7, vocab_start,
                           vocab_size)
        ref = _chunk_grad(logits, targets, lse, entropy, dlogp, grad_entropy, 0.7, vocab_start,
                          vocab_size)
        assert ours.dtype == torch.bfloat16
        torch.testing.assert_close(ours.float(), ref.float(), rtol=2e-2, atol=1e-3)


def test_logprobs_on_cuda_match_dense_autograd():
    from trainer.learner.logprobs import logprobs_and_entropy

    logits, targets, g = _case(rows=257, n_cols=4160)
    targets = targets.clamp(max=4095)
    weights = torch.randn(2, 257, device="cuda", generator=g)
    ours = logits.clone().requires_grad_(True)
    logp, ent = logprobs_and_entropy(ours, targets, temperature=0.8, vocab_size=4096)
    ((logp * weights[0]).sum() + (ent * weights[1]).sum()).backward()
    ref = logits.double().requires_grad_(True)
    logsm = (ref[:, :4096] / 0.8).log_softmax(-1)
    ref_logp = logsm.gather(-1, targets[:, None])[:, 0]
    ref_ent = -(logsm.exp() * logsm).sum(-1)
    ((ref_logp * weights[0]).sum() + (ref_ent * weights[1]).sum()).backward()
    torch.testing.assert_close(logp, ref_logp.float(), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(ent, ref_ent.float(), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(ours.grad.float(), ref.grad.float(), rtol=2e-2, atol=1e-3)


def test_wgrad_accumulates_bf16_gemm_into_fp32_main_grad():
    from trainer.learner.fusions.wgrad import WgradAccumulation

    x = torch.randn(4, 2, 96, device="cuda").bfloat16()
    dy = torch.randn(4, 2, 64, device="cuda").bfloat16()
    main_grad = torch.randn(64, 96, device="cuda")
    expected = main_grad + dy.reshape(-1, 64).double().t().matmul(x.reshape(-1, 96).double()).float()
    ptr = main_grad.data_ptr()
    WgradAccumulation.wgrad_gemm_accum_fp32(x, dy, main_grad)
    assert main_grad.data_ptr() == ptr and main_grad.dtype == torch.float32
    torch.testing.assert_close(main_grad, expected, rtol=1e-4, atol=1e-3)


def test_compiled_rmsnorm_and_rope_match_fp32_references():
    from types import SimpleNamespace

    from trainer.learner.fusions import rope
    from trainer.learner.fusions.rmsnorm import FusedRMSNorm

    config = SimpleNamespace(normalization="RMSNorm", sequence_parallel=False,
                             layernorm_zero_centered_gamma=False)
    norm = FusedRMSNorm(config, 128, eps=1e-6).cuda().bfloat16()
    with torch.no_grad():
        norm.weight.normal_()
    x = torch.randn(33, 1, 128, device="cuda").bfloat16()
    xf = x.double()
    ref = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * norm.weight.double()
    torch.testing.assert_close(norm(x).double(), ref, rtol=1e-2, atol=1e-2)

    inv = 1.0 / 10000 ** (torch.arange(0, 64, 2, device="cuda").double() / 64)
    positions = torch.cat([torch.arange(10), torch.arange(40)]).cuda().double()
    theta = torch.outer(torch.arange(40, device="cuda").double(), inv)
    freqs = torch.cat([theta, theta], -1)[:, None, None, :].float()
    t = torch.randn(50, 4, 64, device="cuda").bfloat16()
    angle = torch.outer(positions, inv)
    cos, sin = angle.cos()[:, None, :], angle.sin()[:, None, :]
    t1, t2 = t.double().chunk(2, -1)
    ref = torch.cat([t1 * cos - t2 * sin, t2 * cos + t1 * sin], -1)
    out = rope.apply_rope_thd(t, torch.tensor([0, 10, 50], dtype=torch.int32), freqs)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), ref, rtol=1e-2, atol=2e-2)
