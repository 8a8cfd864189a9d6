"""Fused rotary embedding for Megatron's ``apply_rope_fusion`` slots when Transformer Engine,
which normally provides them, is absent.

Megatron's unfused packed (``thd``) RoPE splits the batch per sequence and, in every layer, for
q and k separately, recomputes cos/sin and runs ~8 elementwise kernels per sequence. Here the
per-token cos/sin of a packed batch are built once per micro-batch (positions restart at every
``cu_seqlens`` boundary) and shared by all layers; the rotation itself is one compiled kernel
forward and one backward on CUDA.
"""

from __future__ import annotations

import dataclasses

import torch

from . import compiled_on_cuda


def _rotate(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Non-interleaved RoPE on the first ``cos.shape[-1]`` channels of ``t``; cos/sin broadcast
    against ``t`` and already hold both halves (``freqs = cat(theta, theta)``)."""
    rot = cos.shape[-1]
    x, rest = t[..., :rot], t[..., rot:]
    x1, x2 = x.chunk(2, dim=-1)
    rotated = x * cos + torch.cat((-x2, x1), dim=-1) * sin
    return torch.cat((rotated.to(t.dtype), rest), dim=-1) if rest.shape[-1] else rotated.to(t.dtype)


_rotate_kernel = compiled_on_cuda(_rotate)


@dataclasses.dataclass
class _PackedTables:
    """cos/sin per token of the last packed batch seen (kept with the tensors they came from:
    every layer passes the very same ``cu_seqlens`` and ``freqs`` objects)."""
    cu_seqlens: torch.Tensor | None = None
    freqs: torch.Tensor | None = None
    cos: torch.Tensor | None = None
    sin: torch.Tensor | None = None


@dataclasses.dataclass
class _KnownPositions:
    """Per-token positions the packing already put on the device, for the pack of these
    bounds (``use_positions``)."""
    cu_seqlens: torch.Tensor | None = None
    positions: torch.Tensor | None = None


_tables = _PackedTables()
_known = _KnownPositions()


def use_positions(cu_seqlens: torch.Tensor, positions: torch.Tensor) -> None:
    """The next forward's pack: bounds ``cu_seqlens`` (the very tensor Megatron will pass),
    per-token ``positions`` (``[>= tokens]``, on the device): its tables need no host work
    and no copy of their own."""
    _known.cu_seqlens, _known.positions = cu_seqlens, positions


def _positions(cu_seqlens: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``[tokens]`` position of each token in its sequence, on ``device``."""
    if _known.cu_seqlens is cu_seqlens and _known.positions.device == device:
        return _known.positions[:int(cu_seqlens[-1])]  # the host's bounds: no sync
    bounds = cu_seqlens.to("cpu", torch.long)
    lengths = bounds[1:] - bounds[:-1]
    starts = torch.repeat_interleave(bounds[:-1], lengths)
    positions = torch.arange(int(bounds[-1])) - starts
    if device.type == "cuda":  # a pageable host->device copy would wait for the stream: pin it
        positions = positions.pin_memory()
    return positions.to(device, non_blocking=True)


def _packed_cos_sin(cu_seqlens: torch.Tensor, freqs: torch.Tensor, dtype: torch.dtype):
    if _tables.cu_seqlens is cu_seqlens and _tables.freqs is freqs and _tables.cos.dtype == dtype:
        return _tables.cos, _tables.sin
    positions = _positions(cu_seqlens, freqs.device)
    table = freqs.reshape(freqs.shape[0], -1)[positions].unsqueeze(1)  # [t, 1, rot]
    _tables.cu_seqlens, _tables.freqs = cu_seqlens, freqs
    _tables.cos, _tables.sin = table.cos().to(dtype), table.sin().to(dtype)
    return _tables.cos, _tables.sin


def apply_rope_thd(t: torch.Tensor, cu_seqlens: torch.Tensor, freqs: torch.Tensor,
                   cp_size: int = 1, cp_rank: int = 0) -> torch.Tensor:
    """``t [tokens, heads, dim]`` of back-to-back sequences; ``freqs [max_s, 1, 1, rot]``."""
    if cp_size != 1:
        raise NotImplementedError("fused RoPE without Transformer Engine: no context parallelism")
    cos, sin = _packed_cos_sin(cu_seqlens, freqs, t.dtype)
    out = _rotate_kernel(t[: cos.shape[0]], cos, sin)
    if out.shape[0] < t.shape[0]:  # padding after the last sequence is left as it is
        out = torch.cat([out, t[out.shape[0]:]])
    return out


def apply_rope_bshd(t: torch.Tensor, freqs: torch.Tensor, interleaved: bool = False
                    ) -> torch.Tensor:
    """``t [s, b, heads, dim]``; ``freqs [>= s, 1, 1, rot]``."""
    if interleaved:
        raise NotImplementedError("fused RoPE without Transformer Engine: no interleaved rotary")
    f = freqs[: t.shape[0]]
    return _rotate_kernel(t, f.cos().to(t.dtype), f.sin().to(t.dtype))


def install() -> None:
    """Fill Megatron's fused-RoPE slots with these functions unless TE already did (after
    which ``apply_rope_fusion`` may be turned on)."""
    from megatron.core.models.common.embeddings import rope_utils

    if rope_utils.fused_apply_rotary_pos_emb_thd is None:
        rope_utils.fused_apply_rotary_pos_emb_thd = apply_rope_thd
    if rope_utils.fused_apply_rotary_pos_emb is None:
        rope_utils.fused_apply_rotary_pos_emb = apply_rope_bshd
