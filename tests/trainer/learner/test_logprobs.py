"""ChunkedLogProbs (values and analytic gradients) against a dense autograd reference:
log_softmax over the whole unpadded vocab, differentiated by torch itself."""

from __future__ import annotations

import pytest
import torch

from checkpoint_tools import cpu_megatron
from trainer.learner.logprobs import logprobs_and_entropy


def dense_reference(logits, targets, temperature, vocab_size):
    """Reference logp/entropy through plain autograd (padded columns simply cut off)."""
    logsm = (logits[:, :vocab_size].float() / temperature).log_softmax(-1)
    logp = logsm.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    entropy = -(logsm.exp() * logsm).sum(-1)
    return logp, entropy


def make_case(tokens=37, vocab=50, padded=56, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(tokens, padded, generator=g, dtype=torch.float64) * 3
    logits[:, vocab:] = 100.0  # padding must take no mass even when its logits are large
    targets = torch.randint(0, vocab, (tokens,), generator=g)
    w_logp = torch.randn(tokens, generator=g, dtype=torch.float64)
    w_ent = torch.randn(tokens, generator=g, dtype=torch.float64)
    return logits.float(), targets, w_logp.float(), w_ent.float()


@pytest.mark.parametrize("chunk", [1, 8, 37, 1000])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
@pytest.mark.parametrize("with_entropy", [True, False])
def test_values_and_gradients_match_dense_autograd(chunk, temperature, with_entropy):
    logits, targets, w_logp, w_ent = make_case()
    ours = logits.clone().requires_grad_(True)
    logp, ent = logprobs_and_entropy(ours, targets, temperature=temperature, vocab_size=50,
                                     chunk_size=chunk, with_entropy=with_entropy)
    loss = (logp * w_logp).sum() + ((ent * w_ent).sum() if with_entropy else 0.0)
    loss.backward()

    ref = logits.double().clone().requires_grad_(True)
    ref_logp, ref_ent = dense_reference(ref, targets, temperature, 50)
    ref_loss = (ref_logp * w_logp.double()).sum()
    if with_entropy:
        ref_loss = ref_loss + (ref_ent * w_ent.double()).sum()
    ref_loss.backward()

    torch.testing.assert_close(logp, ref_logp.float(), atol=1e-5, rtol=1e-5)
    if with_entropy:
        torch.testing.assert_close(ent, ref_ent.float(), atol=1e-5, rtol=1e-5)
    else:
        assert ent is None
    expected_grad = ref.grad.float()
    assert torch.all(ours.grad[:, 50:] == 0)  # padded columns get no gradient
    torch.testing.assert_close(ours.grad, expected_grad, atol=1e-5, rtol=1e-4)


def test_bf16_logits_get_bf16_gradients_close_to_fp32():
    logits, targets, w_logp, _ = make_case(tokens=20, vocab=56, padded=56)
    ours = logits.bfloat16().requires_grad_(True)
    logp, _ = logprobs_and_entropy(ours, targets, chunk_size=6, with_entropy=False)
    (logp * w_logp).sum().backward()
    assert ours.grad.dtype == torch.bfloat16
    ref = ours.detach().double().requires_grad_(True)
    ref_logp, _ = dense_reference(ref, targets, 1.0, 56)
    (ref_logp * w_logp.double()).sum().backward()
    torch.testing.assert_close(logp, ref_logp.float(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours.grad.float(), ref.grad.float(), atol=1e-2, rtol=1e-2)


def test_no_grad_path_and_bad_arguments():
    logits, targets, _, _ = make_case()
    with torch.no_grad():
        logp, ent = logprobs_and_entropy(logits, targets, vocab_size=50, chunk_size=5)
    ref_logp, ref_ent = dense_reference(logits.double(), targets, 1.0, 50)
    torch.testing.assert_close(logp, ref_logp.float(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent, ref_ent.float(), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="temperature"):
        logprobs_and_entropy(logits, targets, temperature=0.0)
    with pytest.raises(ValueError, match="chunk_size"):
        logprobs_and_entropy(logits, targets, chunk_size=0)


def tp_task(rank, world, port, logits, targets, w_logp, w_ent, temperature, vocab_size, chunk):
    cpu_megatron.init_distributed(rank, world, master_port=port)
    cpu_megatron.init_model_parallel(tp=world)
    local = logits.chunk(world, dim=-1)[rank].clone().requires_grad_(True)
    logp, ent = logprobs_and_entropy(local, targets, temperature=temperature,
                                     vocab_size=vocab_size, chunk_size=chunk)
    ((logp * w_logp).sum() + (ent * w_ent).sum()).backward()
    return logp.detach(), ent.detach(), local.grad


def test_vocab_parallel_slices_match_dense_reference_at_tp2():
    # vocab 50 padded to 56: rank 1's slice [28, 56) holds the padding and some real tokens
    logits, targets, w_logp, w_ent = make_case(tokens=23)
    results = cpu_megatron.run_on_ranks((__file__, "tp_task"), 2, logits, targets, w_logp, w_ent, 0.8, 50, 6)
    ref = logits.double().clone().requires_grad_(True)
    ref_logp, ref_ent = dense_reference(ref, targets, 0.8, 50)
    ((ref_logp * w_logp.double()).sum() + (ref_ent * w_ent.double()).sum()).backward()
    grads = []
    for logp, ent, grad in results:  # every rank holds the full per-token results
        torch.testing.assert_close(logp, ref_logp.float(), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ent, ref_ent.float(), atol=1e-5, rtol=1e-5)
        grads.append(grad)
    torch.testing.assert_close(torch.cat(grads, -1), ref.grad.float(), atol=1e-5, rtol=1e-4)
