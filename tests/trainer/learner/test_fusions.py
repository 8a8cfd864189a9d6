"""The fused RoPE slots against Megatron's own unfused implementation (values and gradients),
and against an independent rotation written out per position."""

from __future__ import annotations

import math

import pytest
import torch

from trainer.learner.fusions import rope as fused_rope


def freqs_table(max_s: int, rot: int, base: float = 10000.0) -> torch.Tensor:
    inv = 1.0 / base ** (torch.arange(0, rot, 2, dtype=torch.float32) / rot)
    theta = torch.outer(torch.arange(max_s, dtype=torch.float32), inv)
    return torch.cat([theta, theta], -1)[:, None, None, :]  # Megatron's [max_s, 1, 1, rot]


def rotate_by_hand(x: torch.Tensor, pos: int, rot: int, base: float = 10000.0) -> torch.Tensor:
    """One head vector rotated pair by pair (channel i with i + rot/2)."""
    out = x.clone()
    half = rot // 2
    for i in range(half):
        angle = pos / base ** (2 * i / rot)
        a, b = x[i], x[i + half]
        out[i] = a * math.cos(angle) - b * math.sin(angle)
        out[i + half] = b * math.cos(angle) + a * math.sin(angle)
    return out


@pytest.mark.parametrize("rot", [8, 4])  # full and partial rotary
def test_thd_restarts_positions_per_sequence(rot):
    lengths = [5, 3, 6]
    cu = torch.tensor([0, 5, 8, 14], dtype=torch.int32)
    t = torch.randn(14, 2, 8, dtype=torch.float64)
    out = fused_rope.apply_rope_thd(t, cu, freqs_table(6, rot).double())
    for s, n in enumerate(lengths):
        for j in range(n):
            tok = int(cu[s]) + j
            for h in range(2):
                torch.testing.assert_close(out[tok, h], rotate_by_hand(t[tok, h], j, rot))


def test_matches_megatron_unfused_thd_and_bshd_with_gradients():
    from megatron.core.models.common.embeddings.rope_utils import (
        _apply_rotary_pos_emb_bshd,
        _apply_rotary_pos_emb_thd,
    )

    class OneRankGroup:
        def size(self):
            return 1

        def rank(self):
            return 0

    cu = torch.tensor([0, 7, 9, 20], dtype=torch.int32)
    freqs = freqs_table(11, 16)
    x = torch.randn(20, 3, 16, requires_grad=True)
    w = torch.randn(20, 3, 16)
    ours = fused_rope.apply_rope_thd(x, cu, freqs)
    (ours * w).sum().backward()
    ours_grad, x.grad = x.grad, None
    ref = _apply_rotary_pos_emb_thd(x, cu, freqs, cp_group=OneRankGroup())
    (ref * w).sum().backward()
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours_grad, x.grad, atol=1e-5, rtol=1e-5)

    y = torch.randn(9, 2, 3, 16)
    torch.testing.assert_close(fused_rope.apply_rope_bshd(y, freqs),
                               _apply_rotary_pos_emb_bshd(y, freqs[:9]), atol=1e-5, rtol=1e-5)


def test_tables_are_rebuilt_for_a_new_pack():
    freqs = freqs_table(8, 8)
    x = torch.randn(8, 1, 8)
    a = fused_rope.apply_rope_thd(x, torch.tensor([0, 8], dtype=torch.int32), freqs)
    b = fused_rope.apply_rope_thd(x, torch.tensor([0, 4, 8], dtype=torch.int32), freqs)
    torch.testing.assert_close(a[:4], b[:4])
    torch.testing.assert_close(b[4:], fused_rope.apply_rope_thd(
        x[4:], torch.tensor([0, 4], dtype=torch.int32), freqs))
    assert not torch.allclose(a[4:], b[4:])


def test_pack_positions_give_the_same_rotation():
    """A pack's own positions (``use_positions``, as ``packed_forward`` hands them over) rotate
    exactly as the positions the RoPE derives from the bounds; other bounds ignore them.
    Mutation check: reading the given positions one token off (``[1:tokens + 1]``) fails here."""
    from trainer.learner.packing import Sample, pack

    batch = pack([Sample([1, 2, 3], [4, 5]), Sample([6], [7, 8, 9, 10, 11])], pad_to_multiple=16)
    freqs = freqs_table(8, 8)
    x = torch.randn(batch.tokens.shape[1], 2, 8)
    derived = fused_rope.apply_rope_thd(x, batch.cu_seqlens.clone(), freqs)
    fused_rope.use_positions(batch.cu_seqlens, batch.positions)
    given = fused_rope.apply_rope_thd(x, batch.cu_seqlens, freqs)
    assert torch.equal(given, derived)
    fused_rope.use_positions(batch.cu_seqlens, torch.zeros_like(batch.positions))
    assert torch.equal(fused_rope.apply_rope_thd(x, batch.cu_seqlens.clone(), freqs), derived)


def test_unsupported_layouts_say_so():
    with pytest.raises(NotImplementedError, match="context parallelism"):
        fused_rope.apply_rope_thd(torch.randn(4, 1, 8), torch.tensor([0, 4]), freqs_table(4, 8),
                                  cp_size=2)
    with pytest.raises(NotImplementedError, match="interleaved"):
        fused_rope.apply_rope_bshd(torch.randn(4, 1, 1, 8), freqs_table(4, 8), interleaved=True)


def test_wgrad_accumulation_adds_the_weight_gradient_in_place():
    from trainer.learner.fusions.wgrad import WgradAccumulation

    x, dy = torch.randn(2, 5, 4), torch.randn(2, 5, 3)  # [s, b, in], [s, b, out]
    main_grad = torch.randn(3, 4)
    expected = main_grad + dy.reshape(-1, 3).t() @ x.reshape(-1, 4)
    buffer = main_grad
    WgradAccumulation.wgrad_gemm_accum_fp32(x, dy, main_grad)
    assert main_grad is buffer
    torch.testing.assert_close(main_grad, expected)


def test_fused_rmsnorm_matches_torch_rmsnorm_with_gradients():
    from types import SimpleNamespace

    from trainer.learner.fusions.rmsnorm import FusedRMSNorm

    config = SimpleNamespace(normalization="RMSNorm", sequence_parallel=False,
                             layernorm_zero_centered_gamma=False)
    ours, ref = FusedRMSNorm(config, 16, eps=1e-6), torch.nn.RMSNorm(16, eps=1e-6)
    with torch.no_grad():
        ours.weight.copy_(torch.randn(16))
        ref.weight.copy_(ours.weight)
    assert list(ours.state_dict()) == list(ref.state_dict()) == ["weight"]
    x = torch.randn(7, 1, 16, requires_grad=True)
    w = torch.randn(7, 1, 16)
    (ours(x) * w).sum().backward()
    gx, gw = x.grad, ours.weight.grad
    x.grad = None
    (ref(x) * w).sum().backward()
    torch.testing.assert_close(ours(x), ref(x))
    torch.testing.assert_close(gx, x.grad)
    torch.testing.assert_close(gw, ref.weight.grad)
    with pytest.raises(ValueError, match="LayerNorm"):
        FusedRMSNorm(SimpleNamespace(normalization="LayerNorm"), 16)
