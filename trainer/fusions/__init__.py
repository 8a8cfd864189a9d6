"""Kernels Megatron's local spec would otherwise take from Transformer Engine or Apex.

Each module fills one of Megatron's own extension points, and only when TE/Apex did not:

* ``rope``: the ``apply_rope_fusion`` slots (packed ``thd`` and ``bshd`` rotary embedding);
* ``wgrad``: the ``gradient_accumulation_fusion`` hook (weight gradients accumulated in fp32
  inside the GEMM instead of a bf16 gradient, a cast and an add per parameter per micro-batch);
* ``rmsnorm``: an RMSNorm layer-spec module compiled into one kernel each way.
"""
