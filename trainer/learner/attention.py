"""Core attention for Megatron's local layer spec, on PyTorch SDPA (flash / memory-efficient).

Megatron's local ``DotProductAttention`` materialises the full ``[b, heads, s, s]`` score matrix
in fp32 (10% MFU, 55 GiB at S=2,048 on the 0.5B shape). This module is a drop-in replacement
for the ``core_attention`` submodule: causal, GQA without repeating K/V, and packed ``thd``
batches (several sequences in one row, each attending only to itself).

A packed micro-batch of RL samples holds tens of short sequences. Attending them one by one is
tens of small kernels per layer, forward and backward (the 135M shape ran at 2% MFU). So on
CUDA a pack is one variable-length flash call per layer (``torch.nn.attention.varlen``), fed
with what the packing already knows on the host (``PackedAttentionParams``): asking the GPU for
sequence bounds in every layer would stall the host each time. Elsewhere (CPU, fp32, dropout,
older torch) each sequence gets its own SDPA call from host bounds, or, when only device
bounds exist, one SDPA call with a block-diagonal causal mask.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math

import torch
import torch.nn.functional as F
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.transformer.module import MegatronModule

try:
    from torch.nn.attention.varlen import varlen_attn
except ImportError:  # torch < 2.9
    varlen_attn = None

# keyword arguments of the installed varlen_attn: torch 2.9/2.10 take is_causal and no scale,
# 2.11 takes window_size and scale, later ones also enable_gqa
_VARLEN_ARGS = frozenset(inspect.signature(varlen_attn).parameters) if varlen_attn else frozenset()
PACKED_IMPLS = ("auto", "varlen", "loop", "mask")


@dataclasses.dataclass
class PackedAttentionParams(PackedSeqParams):
    """Megatron's ``thd`` parameters plus what the packing knows on the host (each would be a
    device-to-host sync if attention had to read it off the GPU, once per layer)."""

    cu_seqlens_host: torch.Tensor | None = None  # [n + 1] int32 on the CPU
    cu_seqlens_device: torch.Tensor | None = None  # the same, int32 on the compute device
    num_tokens: int | None = None  # tokens in sequences; the rest of the row is padding
    # the rollout engine's KV evictions in pack coordinates (sparse_attention.EvictionMasks):
    # when set, every layer attends under its own eviction mask (--sparse-recompute)
    eviction: object | None = None


@dataclasses.dataclass
class PackLayout:
    """The sequence bounds of one pack, in the forms the attention paths need."""

    cu_device: torch.Tensor  # [n + 1] int32 on q's device
    cu_host: torch.Tensor | None  # the same on the CPU; None when only the device has it
    max_seqlen: int
    num_tokens: int | None  # None when only the device knows it

    @classmethod
    def from_params(cls, params: PackedSeqParams, device: torch.device) -> "PackLayout":
        cu = params.cu_seqlens_q
        host = getattr(params, "cu_seqlens_host", None)
        if host is None and cu.device.type == "cpu":
            host = cu
        dev = getattr(params, "cu_seqlens_device", None)
        if dev is None or dev.device != device:
            dev = cu.to(device=device, dtype=torch.int32, non_blocking=True)
        num = getattr(params, "num_tokens", None)
        if num is None and host is not None:
            num = int(host[-1])
        max_len = params.max_seqlen_q
        if max_len is None:  # a caller that did not say: ask once (a sync when on the device)
            bounds = host if host is not None else dev
            max_len = int((bounds[1:] - bounds[:-1]).max()) if bounds.numel() > 1 else 0
        return cls(dev, host, int(max_len), num)

    def total_tokens(self) -> int:
        return self.num_tokens if self.num_tokens is not None else int(self.cu_device[-1])


def _sdpa(q, k, v, *, scale, dropout_p=0.0, mask=None):
    """q ``[b, hq, s, d]``, k/v ``[b, hkv, s, d]``; causal unless an explicit mask is given."""
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=mask is None, scale=scale, dropout_p=dropout_p,
        enable_gqa=q.shape[1] != k.shape[1])


def _heads_first(x: torch.Tensor) -> torch.Tensor:
    """``[t, h, d]`` -> ``[1, h, t, d]``."""
    return x.transpose(0, 1).unsqueeze(0)


def _pad_rows(out: torch.Tensor, rows: int) -> torch.Tensor:
    """Zero rows after the sequences: padding tokens attend nowhere."""
    if out.shape[0] == rows:
        return out
    return torch.cat([out, out.new_zeros(rows - out.shape[0], *out.shape[1:])])


@functools.lru_cache(maxsize=None)
def _flash_capable(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index) >= (8, 0)


def varlen_supported(q: torch.Tensor) -> bool:
    """Whether torch's varlen flash kernel takes this query (fp16/bf16 on sm80+, head dim a
    multiple of 8 up to 256)."""
    if varlen_attn is None or not q.is_cuda or q.dtype not in (torch.float16, torch.bfloat16):
        return False
    d = q.shape[-1]
    return d % 8 == 0 and d <= 256 and _flash_capable(q.device.index or 0)


def choose_packed_impl(q: torch.Tensor, layout: PackLayout, dropout_p: float,
                       requested: str = "auto") -> str:
    """``varlen`` where the kernel applies (it has no dropout); else one SDPA per sequence when
    the bounds are on the host, else one masked SDPA (no host sync either way)."""
    if requested not in PACKED_IMPLS:
        raise ValueError(f"unknown packed attention {requested!r} ({', '.join(PACKED_IMPLS)})")
    if requested != "auto":
        return requested
    if dropout_p == 0.0 and varlen_supported(q):
        return "varlen"
    return "loop" if layout.cu_host is not None else "mask"


def _repeat_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """``[t, hkv, d]`` -> ``[t, heads, d]``, each KV head repeated for its query group."""
    t, hkv, d = x.shape
    return x.unsqueeze(2).expand(t, hkv, heads // hkv, d).reshape(t, heads, d)


def _varlen_kwargs(q, k, v, scale):
    """(q, k, v, kwargs) for the installed ``varlen_attn``: causal, GQA and scale spelt the way
    that torch version takes them."""
    kwargs = {"window_size": (-1, 0)} if "window_size" in _VARLEN_ARGS else {"is_causal": True}
    if q.shape[1] != k.shape[1]:
        if "enable_gqa" in _VARLEN_ARGS:
            kwargs["enable_gqa"] = True
        else:  # query head i reads KV head i // group, as SDPA's enable_gqa
            k, v = _repeat_heads(k, q.shape[1]), _repeat_heads(v, q.shape[1])
    if "scale" in _VARLEN_ARGS:
        kwargs["scale"] = scale
    elif abs(scale * math.sqrt(q.shape[-1]) - 1.0) > 1e-9:  # the kernel's fixed 1/sqrt(d)
        q = q * (scale * math.sqrt(q.shape[-1]))
    return q, k, v, kwargs


def _varlen(q, k, v, layout: PackLayout, scale: float, dropout_p: float) -> torch.Tensor:
    if dropout_p:
        raise ValueError("the varlen attention kernel has no dropout")
    rows, n = q.shape[0], layout.total_tokens()
    if n == 0:
        return q.new_zeros(q.shape)
    q, k, v = (x[:n].contiguous() for x in (q, k, v))
    q, k, v, kwargs = _varlen_kwargs(q, k, v, scale)
    cu, s = layout.cu_device, layout.max_seqlen
    return _pad_rows(varlen_attn(q, k, v, cu, cu, s, s, **kwargs), rows)


def _loop(q, k, v, layout: PackLayout, scale: float, dropout_p: float) -> torch.Tensor:
    """One causal SDPA per sequence, from host bounds (the device copy only if none)."""
    cu = layout.cu_host if layout.cu_host is not None else layout.cu_device
    bounds = cu.tolist()
    outs = [_sdpa(*(_heads_first(x[a:b]) for x in (q, k, v)), scale=scale,
                  dropout_p=dropout_p)[0].transpose(0, 1)
            for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
    return _pad_rows(torch.cat(outs), q.shape[0]) if outs else q.new_zeros(q.shape)


def block_causal_mask(cu_seqlens: torch.Tensor, rows: int):
    """(``[rows, rows]`` bool: may attend, ``[rows]`` bool: in a sequence), built on the bounds'
    device. Padding rows form one more block so that no row is empty (no NaN); callers zero them."""
    pos = torch.arange(rows, device=cu_seqlens.device, dtype=cu_seqlens.dtype)
    seq = torch.searchsorted(cu_seqlens[1:].contiguous(), pos, right=True)
    mask = (seq[:, None] == seq[None, :]) & (pos[None, :] <= pos[:, None])
    return mask, pos < cu_seqlens[-1]


def _masked(q, k, v, layout: PackLayout, scale: float, dropout_p: float) -> torch.Tensor:
    """One SDPA over the whole pack with a block-diagonal causal mask: no host sync, but
    quadratic in the pack's tokens (meant for small packs)."""
    mask, real = block_causal_mask(layout.cu_device, q.shape[0])
    out = _sdpa(*(_heads_first(x) for x in (q, k, v)), scale=scale, dropout_p=dropout_p,
                mask=mask)[0].transpose(0, 1)
    return torch.where(real[:, None, None], out, 0.0)


_PACKED = {"varlen": _varlen, "loop": _loop, "mask": _masked}


def packed_attention(q, k, v, layout: PackLayout, *, scale: float, dropout_p: float = 0.0,
                     impl: str = "auto") -> torch.Tensor:
    """``thd``: q ``[t, hq, d]``, k/v ``[t, hkv, d]`` -> ``[t, hq * d]``; each sequence of the
    pack attends causally to itself only, padding rows after the last one are zeros."""
    impl = choose_packed_impl(q, layout, dropout_p, impl)
    return _PACKED[impl](q, k, v, layout, scale, dropout_p).reshape(q.shape[0], -1)


class SDPACoreAttention(MegatronModule):
    """``core_attention`` of a Megatron ``SelfAttention``: q/k/v in, context out."""

    # how packed batches are attended: auto, or one of PACKED_IMPLS forced (benchmarks, tests)
    packed_impl = "auto"
    sparse_impl = "auto"  # eviction replay: auto (flex on CUDA, mask elsewhere), mask, flex

    def __init__(self, config, layer_number, attn_mask_type, attention_type,
                 attention_dropout=None, softmax_scale=None, cp_comm_type=None, pg_collection=None):
        super().__init__(config=config)
        if config.context_parallel_size > 1:
            raise NotImplementedError("SDPACoreAttention does not implement context parallelism")
        self.scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(config.kv_channels)
        self.dropout = config.attention_dropout if attention_dropout is None else attention_dropout
        self.layer_index = layer_number - 1  # Megatron numbers layers globally from 1

    def _dropout_p(self) -> float:
        return self.dropout if self.training else 0.0

    def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None):
        if attention_bias is not None:
            raise NotImplementedError("attention_bias is not supported")
        if packed_seq_params is not None and packed_seq_params.qkv_format == "thd":
            layout = PackLayout.from_params(packed_seq_params, query.device)
            eviction = getattr(packed_seq_params, "eviction", None)
            if eviction is not None:
                return self._sparse(query, key, value, layout, eviction)
            return packed_attention(query, key, value, layout, scale=self.scale,
                                    dropout_p=self._dropout_p(), impl=self.packed_impl)
        # [s, b, h, d] -> [b, h, s, d]
        q, k, v = (x.permute(1, 2, 0, 3) for x in (query, key, value))
        # Megatron masks use True for "may not attend"; a plain causal mask is handled by the
        # kernel itself (is_causal), which keeps the flash path available.
        mask = None if attention_mask is None or _is_plain_causal(attention_mask) else ~attention_mask
        out = _sdpa(q, k, v, scale=self.scale, dropout_p=self._dropout_p(), mask=mask)
        s, b = query.shape[0], query.shape[1]
        return out.permute(2, 0, 1, 3).reshape(s, b, -1)

    def _sparse(self, query, key, value, layout: PackLayout, eviction):
        from .sparse_attention import kv_head_offset, sparse_packed_attention

        if self._dropout_p():
            raise ValueError("sparse (eviction-replay) attention has no dropout")
        cu = layout.cu_host if layout.cu_host is not None else layout.cu_device.cpu()
        local = key.shape[1]  # tensor parallelism splits the KV heads over the ranks
        eviction = eviction.heads(kv_head_offset(eviction.evict.shape[1], local), local)
        return sparse_packed_attention(query, key, value, eviction, self.layer_index, cu,
                                       scale=self.scale, impl=self.sparse_impl)


def set_packed_attention(impl: str) -> None:
    """Force how every ``SDPACoreAttention`` attends packed batches (``auto`` restores)."""
    if impl not in PACKED_IMPLS:
        raise ValueError(f"unknown packed attention {impl!r} ({', '.join(PACKED_IMPLS)})")
    SDPACoreAttention.packed_impl = impl


def _is_plain_causal(mask: torch.Tensor) -> bool:
    s = mask.shape[-1]
    if mask.shape[-2] != s or mask.dim() != 4 or mask.shape[0] != 1 or mask.shape[1] != 1:
        return False
    return bool(torch.equal(mask[0, 0], torch.triu(torch.ones(s, s, dtype=torch.bool,
                                                               device=mask.device), 1)))
