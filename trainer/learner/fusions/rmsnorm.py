"""RMSNorm for Megatron's local layer spec, compiled on CUDA.

``torch.nn.RMSNorm`` (Megatron's ``WrappedTorchNorm`` without Apex/TE) runs as ~6 elementwise
and reduction kernels forward and ~10 backward through fp32 temporaries; compiled, each
direction is one fused kernel. Same parameters and numerics as ``torch.nn.RMSNorm``
(normalise in fp32, scale by the weight, cast back), so checkpoints are unaffected.
"""

from __future__ import annotations

import torch

from . import compiled_on_cuda


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * weight).to(x.dtype)


_rms_norm_kernel = compiled_on_cuda(_rms_norm)


class FusedRMSNorm(torch.nn.RMSNorm):
    """Drop-in for Megatron's norm modules (same constructor as ``WrappedTorchNorm``)."""

    def __init__(self, config, hidden_size: int, eps: float = 1e-5, persist_layer_norm: bool = False,
                 zero_centered_gamma: bool = False, normalization: str = "RMSNorm"):
        if config.normalization != "RMSNorm":
            raise ValueError(f"FusedRMSNorm cannot stand in for {config.normalization}")
        if config.sequence_parallel or config.layernorm_zero_centered_gamma:
            raise NotImplementedError("FusedRMSNorm: no sequence parallelism or zero-centred gamma")
        super().__init__(hidden_size, eps=eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # always 2-D for the compiled kernel: hidden states are [s, b, h], q/k norms see
        # [s, b, heads, d]; one graph serves both instead of a recompile per rank
        return _rms_norm_kernel(x.reshape(-1, x.shape[-1]), self.weight, self.eps).view(x.shape)
