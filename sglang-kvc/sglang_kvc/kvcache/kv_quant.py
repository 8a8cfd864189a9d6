"""FP8 KV storage as SGLang does it: `--kv-cache-dtype fp8_e5m2 | fp8_e4m3`.

- Stored: x / scale, rounded to nearest (even) FP8 and saturated to the format's largest finite
  value (448 for e4m3, 57344 for e5m2; torch's cast saturates e4m3 on a CPU but gives inf for
  e5m2, and Triton's cvt saturates both: the explicit clamp makes every path agree).
- Read: fp8.to(model dtype) * scale. FP8 values are exact in bf16/fp16/fp32, so with a unit
  scale dequantizing is exact; the only error is the store's rounding: at most 2^-4 (e4m3, 3
  mantissa bits) or 2^-3 (e5m2, 2 bits) of |x| for normal values, and an absolute 2^-10 / 2^-17
  below the smallest normal (2^-6 / 2^-14).
- Scales: one fp32 scalar per layer for K and one for V (SGLang's `k_scale` / `v_scale`), 1.0
  unless a `--quantization-param-path` JSON gives them (SGLang's `kv_cache.scaling_factor` form:
  tp rank -> layer -> scale, used for both K and V). Per layer, not per head, because that is
  what checkpoints and SGLang's kernels carry; a scale only moves the representable range (the
  relative precision is the mantissa's), and with scale 1 keys and values of the supported models
  stay far inside it. Scales never change after start-up (a weight update keeps them).

Storage is uint8 (SGLang's `store_dtype`): torch has no index_copy_ for FP8 on a CPU; Triton
kernels get the same bytes viewed as the FP8 dtype.
"""

from __future__ import annotations

import json

import torch

FP8_DTYPES = {"fp8_e5m2": torch.float8_e5m2, "fp8_e4m3": torch.float8_e4m3fn}


def is_fp8(dtype: torch.dtype) -> bool:
    return dtype in FP8_DTYPES.values()


def quantize(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x / scale in FP8 `dtype` (fp32 division, saturating round-to-nearest-even cast)."""
    top = torch.finfo(dtype).max
    return (x.float() / scale).clamp_(-top, top).to(dtype)


def dequantize(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """FP8 values `x` (not their uint8 storage: view it first) times `scale`, in `dtype` (one
    rounding, of the fp32 product; exact with a unit scale)."""
    return (x.float() * scale).to(dtype)


def check_device(dtype: torch.dtype, device: torch.device, backend: str) -> None:
    """A clear error where this device cannot run `dtype` KV: Triton converts e4m3 (fp8e4nv)
    only on CUDA capability >= 8.9 (Ada, Hopper); e5m2 converts on any CUDA device, and torch
    casts (the CPU path) work everywhere."""
    if dtype != torch.float8_e4m3fn or device.type != "cuda" or backend != "triton":
        return
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < (8, 9):
        raise ValueError(f"--kv-cache-dtype fp8_e4m3 needs CUDA capability >= 8.9 for the "
                         f"Triton kernels (this GPU is {major}.{minor}); use fp8_e5m2")


def load_scales(path: str | None, num_layers: int) -> torch.Tensor:
    """Per-layer scales [num_layers] fp32: ones, or those of an SGLang/vLLM KV-scales JSON
    ({"kv_cache": {"scaling_factor": {"0": {"0": s, "1": s, ...}}}}, tp rank 0)."""
    scales = torch.ones(num_layers, dtype=torch.float32)
    if path is None:
        return scales
    try:
        with open(path) as f:
            table = json.load(f)["kv_cache"]["scaling_factor"]["0"]
        for layer, s in table.items():
            scales[int(layer)] = float(s)
    except (OSError, ValueError, KeyError, TypeError, IndexError) as e:
        raise ValueError(f"--quantization-param-path {path}: not a KV-scales JSON with "
                         f"kv_cache.scaling_factor.0.<layer> for {num_layers} layers ({e})") from None
    if not torch.isfinite(scales).all() or (scales <= 0).any():
        raise ValueError(f"--quantization-param-path {path}: scales must be finite and > 0")
    return scales
