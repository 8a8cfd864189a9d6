"""Triton kernels for ``trainer.learner.logprobs`` on CUDA: the whole ``[tokens, vocab]`` logits in one
pass each way, never an fp32 copy.

* ``row_stats``: per row, an online max / sum-of-exp / sum-of-exp-times-logit over the vocab
  (one read of the bf16 logits), and the target's logit.
* ``logits_grad``: per row block, the analytic gradient of log-prob and entropy (one read, one
  bf16 write straight into the gradient tensor).

The torch functions in ``trainer.learner.logprobs`` are the reference these are tested against.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

STATS_BLOCK = 4096
GRAD_BLOCK = 4096


@triton.jit
def _row_stats_kernel(logits_ptr, stride_row, targets_ptr, m_ptr, s0_ptr, s1_ptr, target_ptr,
                      n_cols, vocab_start, vocab_limit, inv_temp, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    base = logits_ptr + row.to(tl.int64) * stride_row
    m = tl.full((), float("-inf"), tl.float32)
    s0 = tl.zeros((), tl.float32)
    s1 = tl.zeros((), tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        valid = cols < vocab_limit  # beyond it: TP slice end or Megatron's vocab padding
        z = tl.load(base + cols, mask=valid, other=float("-inf")).to(tl.float32) * inv_temp
        new_m = tl.maximum(m, tl.max(z, 0))
        safe_m = tl.where(new_m == float("-inf"), 0.0, new_m)
        scale = tl.exp(m - safe_m)
        e = tl.exp(z - safe_m)
        s0 = s0 * scale + tl.sum(e, 0)
        s1 = s1 * scale + tl.sum(tl.where(valid, e * z, 0.0), 0)
        m = new_m
    t = tl.load(targets_ptr + row) - vocab_start
    in_range = (t >= 0) & (t < vocab_limit)
    zt = tl.load(base + tl.where(in_range, t, 0), mask=in_range, other=0.0).to(tl.float32)
    tl.store(m_ptr + row, m)
    tl.store(s0_ptr + row, s0)
    tl.store(s1_ptr + row, s1)
    tl.store(target_ptr + row, tl.where(in_range, zt * inv_temp, 0.0))


@triton.jit
def _logits_grad_kernel(logits_ptr, grad_ptr, stride_row, grad_stride_row, targets_ptr, lse_ptr,
                        ent_ptr, dlogp_ptr, dent_ptr, n_cols, vocab_start, vocab_limit, inv_temp,
                        HAS_ENTROPY: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    valid = cols < vocab_limit
    z = tl.load(logits_ptr + row.to(tl.int64) * stride_row + cols, mask=valid,
                other=float("-inf")).to(tl.float32) * inv_temp
    dlogp = tl.load(dlogp_ptr + row)
    log_p = z - tl.load(lse_ptr + row)
    p = tl.exp(log_p)  # 0 on padded columns
    grad = -p * dlogp
    if HAS_ENTROPY:
        dh = -p * (log_p + tl.load(ent_ptr + row))  # d entropy / dz
        grad += tl.where(valid, dh, 0.0) * tl.load(dent_ptr + row)
    t = tl.load(targets_ptr + row) - vocab_start
    grad += tl.where(cols == t, dlogp, 0.0)
    tl.store(grad_ptr + row.to(tl.int64) * grad_stride_row + cols,
             (grad * inv_temp).to(grad_ptr.dtype.element_ty), mask=cols < n_cols)


def _vocab_limit(n_cols: int, vocab_start: int, vocab_size: int | None) -> int:
    return n_cols if vocab_size is None else max(0, min(n_cols, vocab_size - vocab_start))


def row_stats(logits, targets, temperature: float, vocab_start: int, vocab_size: int | None):
    """Same as ``trainer.learner.logprobs._chunk_stats`` for the whole tensor: (m, s0, s1, target)."""
    logits = logits if logits.stride(-1) == 1 else logits.contiguous()
    rows, n_cols = logits.shape
    out = torch.empty(4, rows, dtype=torch.float32, device=logits.device)
    if rows:
        _row_stats_kernel[(rows,)](
            logits, logits.stride(0), targets.contiguous(), out[0], out[1], out[2], out[3], n_cols,
            vocab_start, _vocab_limit(n_cols, vocab_start, vocab_size), 1.0 / temperature,
            BLOCK=STATS_BLOCK, num_warps=8)
    return out[0], out[1], out[2], out[3]


def logits_grad(logits, targets, lse, entropy, grad_logp, grad_entropy, temperature: float,
                vocab_start: int, vocab_size: int | None):
    """Same as ``trainer.learner.logprobs._chunk_grad`` for the whole tensor."""
    logits = logits if logits.stride(-1) == 1 else logits.contiguous()
    rows, n_cols = logits.shape
    grad = torch.empty_like(logits, memory_format=torch.contiguous_format)
    if rows:
        has_entropy = grad_entropy is not None
        dent = grad_entropy.contiguous() if has_entropy else grad_logp
        grid = (rows, triton.cdiv(n_cols, GRAD_BLOCK))
        _logits_grad_kernel[grid](
            logits, grad, logits.stride(0), grad.stride(0), targets.contiguous(), lse.contiguous(),
            entropy.contiguous(), grad_logp.contiguous(), dent, n_cols, vocab_start,
            _vocab_limit(n_cols, vocab_start, vocab_size), 1.0 / temperature,
            HAS_ENTROPY=has_entropy, BLOCK=GRAD_BLOCK, num_warps=8)
    return grad
