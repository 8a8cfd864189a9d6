"""Packed (``thd``) attention of ``SDPACoreAttention`` against an independent reference: each
sequence on its own, softmax written out in fp64. Every path (varlen, per-sequence loop,
block-diagonal mask) must give the reference's outputs and gradients, with trailing padding
rows at zero. The varlen path runs on CPU against stand-ins with each torch version's
``varlen_attn`` signature; on CUDA the real kernel is checked (skipped without a GPU)."""

from __future__ import annotations

import math

import pytest
import torch

from trainer.learner import attention as attn
from trainer.learner.attention import PackLayout, packed_attention

LENGTHS = [5, 1, 17, 2, 1, 9]  # length-1 sequences included
HQ, HKV, D = 6, 2, 16  # GQA: 3 query heads per KV head


def reference(q, k, v, lengths, scale):
    """fp64 causal attention per sequence, zeros for the rows after the last one."""
    group = q.shape[1] // k.shape[1]
    out, start = torch.zeros_like(q, dtype=torch.float64), 0
    for n in lengths:
        qs, ks, vs = (x[start:start + n].double().transpose(0, 1) for x in (q, k, v))
        ks, vs = ks.repeat_interleave(group, 0), vs.repeat_interleave(group, 0)
        scores = qs @ ks.transpose(1, 2) * scale
        causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        probs = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        out[start:start + n] = (probs @ vs).transpose(0, 1)
        start += n
    return out.reshape(q.shape[0], -1)


def make_case(lengths=LENGTHS, pad=3, dtype=torch.float64, device="cpu", seed=0, hkv=HKV, d=D):
    g = torch.Generator().manual_seed(seed)
    t = sum(lengths) + pad
    q, k, v = (torch.randn(t, h, d, generator=g, dtype=torch.float64).to(device, dtype)
               .requires_grad_(True) for h in (HQ, hkv, hkv))
    cu = torch.tensor([0, *lengths], dtype=torch.int32).cumsum(0, dtype=torch.int32)
    layout = PackLayout(cu.to(device), cu, max(lengths), sum(lengths))
    return q, k, v, cu, layout


def grads(out, inputs, seed=1):
    g = torch.Generator().manual_seed(seed)
    # bf16-representable weights: the same loss for a bf16 output and its fp64 reference
    weight = torch.randn(out.shape, generator=g).bfloat16().to(out.device, out.dtype)
    return torch.autograd.grad((out * weight).sum(), inputs)


def check_against_reference(out, q, k, v, lengths, scale, atol=1e-10, rtol=1e-10):
    ref = reference(q, k, v, lengths, scale)
    torch.testing.assert_close(out.double(), ref, atol=atol, rtol=rtol)
    pad = q.shape[0] - sum(lengths)
    if pad:
        assert out[-pad:].eq(0).all()  # padding rows: zeros, never NaN
    for ours, want in zip(grads(out, (q, k, v)), grads(ref, (q, k, v))):
        torch.testing.assert_close(ours.double(), want.double(), atol=atol * 10, rtol=rtol * 10)
        if pad:
            assert ours[-pad:].eq(0).all()


@pytest.mark.parametrize("impl", ["auto", "loop", "mask"])
@pytest.mark.parametrize("pad", [0, 3])
def test_cpu_paths_match_per_sequence_reference(impl, pad):
    q, k, v, _, layout = make_case(pad=pad)
    scale = 1 / math.sqrt(D)
    out = packed_attention(q, k, v, layout, scale=scale, impl=impl)
    assert out.shape == (q.shape[0], HQ * D)
    check_against_reference(out, q, k, v, LENGTHS, scale)


def test_auto_without_host_bounds_uses_the_mask_and_no_token_count():
    q, k, v, cu, _ = make_case()
    layout = PackLayout(cu, None, max(LENGTHS), None)  # as if only the GPU knew the bounds
    assert attn.choose_packed_impl(q, layout, 0.0) == "mask"
    check_against_reference(packed_attention(q, k, v, layout, scale=0.3), q, k, v, LENGTHS, 0.3)


def test_auto_is_the_loop_on_cpu_with_host_bounds():
    q, _, _, _, layout = make_case()
    assert attn.choose_packed_impl(q, layout, 0.0) == "loop"
    with pytest.raises(ValueError, match="unknown packed attention"):
        attn.choose_packed_impl(q, layout, 0.0, "flash")


def test_block_causal_mask():
    cu = torch.tensor([0, 2, 3], dtype=torch.int32)
    mask, real = attn.block_causal_mask(cu, 5)
    want = torch.tensor([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 0, 1, 0, 0],
                         [0, 0, 0, 1, 0], [0, 0, 0, 1, 1]], dtype=torch.bool)
    assert torch.equal(mask, want) and real.tolist() == [True] * 3 + [False] * 2


# --- varlen against stand-ins with each torch version's signature ---------------------------

def _fake_kernel(q, k, v, cu, max_len, causal, scale):
    assert cu.dtype == torch.int32 and isinstance(max_len, int)
    assert q.shape[0] == int(cu[-1])  # padding rows never reach the kernel
    lengths = (cu[1:] - cu[:-1]).tolist()
    assert max_len == max(lengths) and causal
    return reference(q, k, v, lengths, scale).reshape(q.shape).to(q.dtype)


def varlen_2_10(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, is_causal=False,
                return_aux=None):
    assert query.shape[1] == key.shape[1], "no GQA in this version: K/V must be repeated"
    return _fake_kernel(query, key, value, cu_seq_q, max_q, is_causal, 1 / math.sqrt(query.shape[-1]))


def varlen_2_11(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None,
                scale=None, window_size=(-1, -1)):
    assert query.shape[1] == key.shape[1], "no enable_gqa in this version: K/V must be repeated"
    return _fake_kernel(query, key, value, cu_seq_q, max_q, window_size == (-1, 0), scale)


def varlen_2_13(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None,
                scale=None, window_size=(-1, -1), enable_gqa=False, seqused_k=None,
                block_table=None, num_splits=None):
    assert enable_gqa == (query.shape[1] != key.shape[1])
    return _fake_kernel(query, key, value, cu_seq_q, max_q, window_size == (-1, 0), scale)


@pytest.mark.parametrize("fake", [varlen_2_10, varlen_2_11, varlen_2_13])
@pytest.mark.parametrize("scale", [None, 0.2])  # None: Megatron's default 1/sqrt(d)
def test_varlen_call_for_each_torch_signature(monkeypatch, fake, scale):
    import inspect

    monkeypatch.setattr(attn, "varlen_attn", fake)
    monkeypatch.setattr(attn, "_VARLEN_ARGS", frozenset(inspect.signature(fake).parameters))
    q, k, v, _, layout = make_case()
    scale = scale or 1 / math.sqrt(D)
    out = packed_attention(q, k, v, layout, scale=scale, impl="varlen")
    check_against_reference(out, q, k, v, LENGTHS, scale)


def test_varlen_refuses_dropout():
    q, k, v, _, layout = make_case()
    with pytest.raises(ValueError, match="dropout"):
        packed_attention(q, k, v, layout, scale=0.25, dropout_p=0.1, impl="varlen")


# --- the Megatron module and the packing --------------------------------------------------------

def _module(dropout=0.0, d=D):
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.transformer_config import TransformerConfig

    config = TransformerConfig(num_layers=1, hidden_size=HQ * d, num_attention_heads=HQ,
                               num_query_groups=HKV, kv_channels=d, attention_dropout=dropout)
    return attn.SDPACoreAttention(config, 1, AttnMaskType.causal, "self")


def test_module_on_a_packed_batch_matches_reference():
    from trainer.learner.packing import Sample, pack

    samples = [Sample([1] * (n - 1), [2]) for n in LENGTHS]
    lengths = [s.length for s in samples]
    batch = pack(samples, pad_to_multiple=8).to("cpu")
    params = batch.packed_seq_params()
    assert params.max_seqlen_q == max(lengths) and params.num_tokens == sum(lengths)
    assert params.cu_seqlens_host.device.type == "cpu" and params.cu_seqlens_device is not None
    q, k, v, _, _ = make_case(lengths, pad=batch.tokens.shape[1] - sum(lengths))
    out = _module().eval()(q, k, v, None, packed_seq_params=params)
    check_against_reference(out, q, k, v, lengths, 1 / math.sqrt(D))


def test_module_with_plain_megatron_params():
    """A caller building Megatron's own PackedSeqParams still gets the right answer."""
    from megatron.core.packed_seq_params import PackedSeqParams

    q, k, v, cu, _ = make_case()
    params = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu)
    out = _module().eval()(q, k, v, None, packed_seq_params=params)
    check_against_reference(out, q, k, v, LENGTHS, 1 / math.sqrt(D))


def test_dropout_in_training_stays_on_sdpa():
    q, _, _, _, layout = make_case(device="cpu")
    module = _module(dropout=0.5).train()
    assert module._dropout_p() == 0.5 and module.eval()._dropout_p() == 0.0
    assert attn.choose_packed_impl(q, layout, 0.5) == "loop"


def test_set_packed_attention():
    try:
        attn.set_packed_attention("mask")
        assert attn.SDPACoreAttention.packed_impl == "mask"
        with pytest.raises(ValueError):
            attn.set_packed_attention("nope")
    finally:
        attn.set_packed_attention("auto")


# --- CUDA: the real kernel ----------------------------------------------------------------------

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
# bf16 inputs (the fp64 reference gets the same rounded values): the largest error of the
# output and of each gradient, relative to that tensor's largest reference entry, is within
# 2e-2 (bf16 keeps 8 bits), and no more than twice the per-sequence SDPA path's (+1e-3).
BF16_TOL = 2e-2
HEAD_DIM = 64  # the real shapes' (Qwen2.5-0.5B, SmolLM2-135M)


def _bf16_case(lengths):
    q, k, v, cu, _ = make_case(lengths, pad=5, dtype=torch.bfloat16, device="cuda", d=HEAD_DIM)
    return q, k, v, PackLayout(cu.to("cuda"), cu, max(lengths), sum(lengths))


def _relative_errors(out, q, k, v, lengths, scale):
    ref = reference(q, k, v, lengths, scale)
    pairs = [(out, ref), *zip(grads(out, (q, k, v)), grads(ref, (q, k, v)))]
    return torch.stack([(a.double() - b.double()).abs().max() / b.double().abs().max()
                        for a, b in pairs]).cpu()


@cuda
def test_varlen_is_chosen_on_cuda_bf16():
    if attn.varlen_attn is None:
        pytest.skip(f"torch {torch.__version__} has no torch.nn.attention.varlen")
    if torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("flash attention needs sm80+")
    q, _, _, layout = _bf16_case(LENGTHS)
    assert attn.choose_packed_impl(q, layout, 0.0) == "varlen"
    assert attn.choose_packed_impl(q.float(), layout, 0.0) == "loop"  # fp32: no flash kernel


@cuda
@pytest.mark.parametrize("lengths", [LENGTHS, [1, 300, 7, 1, 129, 64, 1000]])
def test_varlen_on_cuda_matches_reference_in_bf16(lengths):
    if not attn.varlen_supported(torch.empty(1, 1, HEAD_DIM, device="cuda", dtype=torch.bfloat16)):
        pytest.skip("varlen flash attention unavailable here")
    q, k, v, layout = _bf16_case(lengths)
    scale = 1 / math.sqrt(HEAD_DIM)
    out = packed_attention(q, k, v, layout, scale=scale, impl="varlen")
    assert out[sum(lengths):].eq(0).all() and out.isfinite().all()
    varlen_err = _relative_errors(out, q, k, v, lengths, scale)
    loop_err = _relative_errors(packed_attention(q, k, v, layout, scale=scale, impl="loop"),
                                q, k, v, lengths, scale)
    assert (varlen_err <= BF16_TOL).all(), varlen_err
    assert (varlen_err <= 2 * loop_err + 1e-3).all(), (varlen_err, loop_err)


@cuda
def test_varlen_layer_makes_no_host_sync():
    from trainer.learner.packing import Sample, pack

    if not attn.varlen_supported(torch.empty(1, 1, HEAD_DIM, device="cuda", dtype=torch.bfloat16)):
        pytest.skip("varlen flash attention unavailable here")
    samples = [Sample([1] * (n - 1), [2]) for n in LENGTHS]
    batch = pack(samples, pad_to_multiple=8).to("cuda")
    lengths = [s.length for s in samples]
    q, k, v, _, _ = make_case(lengths, pad=batch.tokens.shape[1] - sum(lengths),
                              dtype=torch.bfloat16, device="cuda", d=HEAD_DIM)
    module = _module(d=HEAD_DIM).cuda()
    params = batch.packed_seq_params()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = module(q, k, v, None, packed_seq_params=params)
        out.float().square().sum().backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert q.grad is not None
