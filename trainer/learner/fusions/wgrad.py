"""Weight-gradient accumulation fused into the GEMM, for Megatron's
``gradient_accumulation_fusion`` (normally Apex's ``fused_weight_gradient_mlp_cuda``).

Without it every linear layer's backward writes a bf16 weight gradient, then Megatron's DDP hook
casts it to fp32 and adds it to ``main_grad``: three passes over every weight per micro-batch
(~8% of a train step on the 0.5B shape). Here the GEMM's epilogue adds into ``main_grad``
directly (cuBLAS ``beta = 1`` with an fp32 output from bf16 inputs).
"""

from __future__ import annotations

import torch


def _accumulate(total_input: torch.Tensor, grad_output: torch.Tensor, main_grad: torch.Tensor):
    """``main_grad += grad_output^T @ total_input`` (inputs ``[tokens, in]`` / ``[tokens, out]``)."""
    x = total_input.reshape(-1, total_input.shape[-1])
    dy = grad_output.reshape(-1, grad_output.shape[-1])
    if x.dtype == main_grad.dtype:
        main_grad.addmm_(dy.t(), x)
    else:
        torch.addmm(main_grad, dy.t(), x, out_dtype=main_grad.dtype, out=main_grad)


class WgradAccumulation:
    """The two entry points Megatron's linear layers call (fp32 and fp16/bf16 ``main_grad``)."""
    wgrad_gemm_accum_fp32 = staticmethod(_accumulate)
    wgrad_gemm_accum_fp16 = staticmethod(_accumulate)


def install() -> None:
    """Provide ``fused_weight_gradient_mlp_cuda`` to Megatron unless Apex already does (after
    which ``gradient_accumulation_fusion`` may be turned on)."""
    from megatron.core.tensor_parallel import layers

    if not layers._grad_accum_fusion_available:
        layers.fused_weight_gradient_mlp_cuda = WgradAccumulation
        layers._grad_accum_fusion_available = True
