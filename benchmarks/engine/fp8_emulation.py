"""An FP8 KV pool emulated inside a Hugging Face forward: the dense reference for fp8_quality.py.

The engine with an FP8 pool (sglang_kvc/kvcache/kv_quant.py) attends, at a decode step, to the
stored K/V of every earlier position and its own, each quantized -> dequantized with its layer's
scale; its prefill attends to the prompt's K/V as computed, and a prefill that extends a cached
prefix reads the whole row from the pool. A single HF forward over prompt + response reproduces
exactly that: query rows from `pool_from` on (the prompt's length; the cached prefix's with
prefix sharing) see the quantized K/V of every key, earlier rows see raw K/V. Only the
definition is shared with the engine (x / scale, saturated, round to nearest even; read back
times scale), not its code or kernels.

Modes: ``none`` (plain attention), ``record`` (plain, and keeps each layer's prompt K/V for
layer_stats), ``fp8_e4m3`` / ``fp8_e5m2`` (the pool), ``bfloat16`` (K/V rounded to bf16: a bf16
pool's rounding), ``noise`` (K/V times 1 + u, u uniform in +-half of e4m3's relative step at
each value's binade: an FP8-sized perturbation that is not a quantization).
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

FORMATS = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
_ACTIVE: list = []  # (emulation, pool_from) of the forward running now
NAME = "fp8_kv_emulation"


def fake_quant(x: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """x stored in FP8 `dtype` with `scale` and read back (fp32)."""
    top = torch.finfo(dtype).max
    return (x.float() / scale).clamp(-top, top).to(dtype).float() * scale


def binade_noise(x: torch.Tensor, mantissa_bits: int, gen: torch.Generator) -> torch.Tensor:
    """x plus uniform noise of +-half a step of a `mantissa_bits` float at x's binade."""
    step = torch.exp2(torch.floor(torch.log2(x.abs().clamp_min(1e-30))) - mantissa_bits)
    u = torch.rand(x.shape, generator=gen) - 0.5
    return x + u * step


def _attend(query, key, value, scaling):
    return F.scaled_dot_product_attention(query, key.to(query.dtype), value.to(query.dtype),
                                          is_causal=True, scale=scaling, enable_gqa=True)


def emulated_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kw):
    """HF attention interface: query [1, H, T, D], key/value [1, Hkv, T, D] (key after RoPE)."""
    emu, pool_from = _ACTIVE[-1]
    raw = _attend(query, key, value, scaling)
    if emu.mode == "record":  # the rows before pool_from: a prompt's K/V
        emu.recorded.setdefault(module.layer_idx, []).append(
            (key[0, :, :pool_from].detach().cpu(), value[0, :, :pool_from].detach().cpu()))
    if emu.mode in ("none", "record"):
        return raw.transpose(1, 2).contiguous(), None
    kq, vq = (emu.perturb(t, module.layer_idx) for t in (key, value))
    stored = _attend(query, kq, vq, scaling)
    pool_rows = torch.arange(query.shape[2], device=query.device) >= pool_from
    out = torch.where(pool_rows[None, None, :, None], stored, raw)
    return out.transpose(1, 2).contiguous(), None


def _register() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, emulated_attention)


class KVEmulation:
    """One KV treatment for `model`'s forwards (``with emu.active(pool_from): model(...)``;
    batch 1, no padding)."""

    def __init__(self, model, mode: str = "none", scales: torch.Tensor | None = None, seed: int = 0):
        _register()
        model.set_attn_implementation(NAME)
        self.mode, self.scales = mode, scales
        self.gen = torch.Generator().manual_seed(seed)
        self.recorded: dict[int, list] = {}

    @contextlib.contextmanager
    def active(self, pool_from: int):
        _ACTIVE.append((self, pool_from))
        try:
            yield
        finally:
            _ACTIVE.pop()

    def perturb(self, x: torch.Tensor, layer: int) -> torch.Tensor:
        if self.mode in FORMATS:
            scale = 1.0 if self.scales is None else float(self.scales[layer])
            return fake_quant(x, scale, FORMATS[self.mode])
        if self.mode == "bfloat16":
            return x.to(torch.bfloat16).float()
        if self.mode == "noise":
            return binade_noise(x.float().cpu(), 3, self.gen).to(x.device)
        raise ValueError(f"unknown KV emulation mode {self.mode!r}")


def _roundtrip_error(x: torch.Tensor, scale: float, dtype: torch.dtype) -> float:
    """||deq(q(x)) - x|| / ||x|| (Frobenius)."""
    return float((fake_quant(x, scale, dtype) - x).norm() / x.norm().clamp_min(1e-30))


def layer_stats(recorded: dict[int, list], kv_dtype: str) -> list[dict]:
    """Per layer, over the recorded prompts: K/V amax and mean |x|, the share of values below
    the format's smallest normal and above its largest finite value at scale 1, the round-trip
    error at scale 1 and at the calibrated scale (max(K amax, V amax) / the format's max)."""
    dtype = FORMATS[kv_dtype]
    fi = torch.finfo(dtype)
    out = []
    for layer in sorted(recorded):
        k = torch.cat([a.flatten() for a, _ in recorded[layer]]).float()
        v = torch.cat([b.flatten() for _, b in recorded[layer]]).float()
        scale = max(float(k.abs().max()), float(v.abs().max())) / fi.max
        row = {"layer": layer, "scale_amax": scale}
        for name, x in (("k", k), ("v", v)):
            tiny = (x.abs() < fi.smallest_normal) & (x != 0)
            row.update({f"{name}_amax": float(x.abs().max()), f"{name}_absmean": float(x.abs().mean()),
                        f"{name}_subnormal": float(tiny.float().mean()),
                        f"{name}_saturated": float((x.abs() > fi.max).float().mean()),
                        f"{name}_err_scale1": _roundtrip_error(x, 1.0, dtype),
                        f"{name}_err_amax": _roundtrip_error(x, scale, dtype)})
        out.append(row)
    return out
