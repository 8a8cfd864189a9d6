"""Kernels the model calls: attention backends over the paged pool, Triton decode attention,
fused norms, RoPE, SwiGLU, argmax."""
