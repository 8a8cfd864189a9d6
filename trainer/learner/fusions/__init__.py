"""Kernels Megatron's local spec would otherwise take from Transformer Engine or Apex.

Each module fills one of Megatron's own extension points, and only when TE/Apex did not:

* ``rope``: the ``apply_rope_fusion`` slots (packed ``thd`` and ``bshd`` rotary embedding);
* ``wgrad``: the ``gradient_accumulation_fusion`` hook (weight gradients accumulated in fp32
  inside the GEMM instead of a bf16 gradient, a cast and an add per parameter per micro-batch);
* ``rmsnorm``: an RMSNorm layer-spec module compiled into one kernel each way;

and ``logprob_triton`` holds the CUDA kernels behind ``trainer.learner.logprobs``.
"""

from __future__ import annotations

import functools

import torch


def compiled_on_cuda(fn):
    """``fn`` compiled (dynamic shapes, built on first use) when its first argument is a CUDA
    tensor; plain ``fn`` otherwise (the CPU path stays eager: no compiler needed there)."""
    compiled = None

    @functools.wraps(fn)
    def call(*args):
        nonlocal compiled
        if not args[0].is_cuda:
            return fn(*args)
        if compiled is None:
            compiled = torch.compile(fn, dynamic=True)
        return compiled(*args)

    return call
