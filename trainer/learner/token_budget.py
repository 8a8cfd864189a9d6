"""``--max-tokens-per-gpu`` left unset: the micro-batch's token budget from free memory, as the
rollout engine sizes its KV pool. It changes speed only: losses are normalised by global counts,
so any split into micro-batches gives the same gradient (up to fp summation order).

Bytes one token of a micro-batch holds at the update's peak (bf16 activations, Megatron's GPT
layer, TP = t, no sequence parallelism; d hidden, f FFN, nh / ng query / KV heads of hd, L
layers, V vocab):

* a layer saves for its backward ``A = 2 (4d + 2 (nh + 2 ng) hd / t + nh hd / t + 3 f / t)
  + 4 nh / t``: its two norms' inputs and outputs, Q/K/V before and after RoPE, the attention
  output (and its fp32 log-sum-exp), the FFN's gate/up output and its SwiGLU;
* without activation recompute: ``(L + 1) A`` (every layer, and one more of gradients in
  flight during the backward); with ``--recompute-activations`` (full, one layer a chunk):
  ``2 d L + 2 A`` (each layer's input, one layer recomputed and its gradients);
* the lm head: ``4 V / t`` (the bf16 logits kept for the log-prob backward and their gradient)
  plus ``4 d`` (final norm).

Free memory is the device's plus what torch's cache holds unused, less Adam's two fp32 states
(``8 x`` the rank's trainable parameters) while the optimizer has not allocated them yet, less
the fp32 log-prob chunk off the Triton path (``16 x chunk x V / t``: logits, exponentials and
the gradient of ``--log-probs-chunk-size`` rows), less ``RESERVE`` for kernels' workspaces;
``SAFETY`` of the rest goes to micro-batches:

    tokens = clamp(floor(SAFETY x usable / per_token / STEP) x STEP, STEP, CAP)

The smallest value over all ranks is used (every rank packs alike), printed once on rank 0.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist

SAFETY = 0.85  # the allocator's fragmentation, the sizes the formula leaves out
RESERVE = 2 << 30  # cuBLAS / attention workspaces, NCCL buffers
STEP = 1024  # budgets are a whole number of these tokens
CAP = 32768  # larger micro-batches no longer pay (docs/benchmarks.md: 16k vs 8k tokens)


@dataclasses.dataclass(frozen=True)
class TokenBudget:
    tokens: int
    bytes_per_token: float
    usable_bytes: float
    free_bytes: float

    def describe(self, recompute: bool) -> str:
        gib, mib = float(1 << 30), float(1 << 20)
        how = "activation recompute" if recompute else "no recompute"
        return (f"max tokens per GPU: {self.tokens} (from free memory: {self.free_bytes / gib:.1f}"
                f" GiB free, {self.usable_bytes / gib:.1f} GiB for micro-batches at "
                f"{self.bytes_per_token / mib:.2f} MiB a token, {how}; cap {CAP}; "
                f"--max-tokens-per-gpu sets it)")


def layer_bytes(arch, tp: int = 1) -> float:
    """Bytes per token one transformer layer saves for its backward (``A`` above)."""
    d, f, hd = arch.hidden_size, arch.ffn_hidden_size, arch.head_dim
    nh, ng = arch.num_attention_heads, arch.num_query_groups
    return 2 * (4 * d + (2 * (nh + 2 * ng) * hd + nh * hd + 3 * f) / tp) + 4 * nh / tp


def bytes_per_token(arch, recompute: bool, tp: int = 1) -> float:
    """Bytes one token of a micro-batch holds at the update's peak (module docstring)."""
    a, L = layer_bytes(arch, tp), arch.num_layers
    layers = 2 * arch.hidden_size * L + 2 * a if recompute else (L + 1) * a
    return layers + 4 * arch.vocab_size / tp + 4 * arch.hidden_size


def logprob_chunk_bytes(arch, chunk_size: int, triton: bool, tp: int = 1) -> float:
    """The fp32 chunk of the torch log-prob path (none on the Triton one)."""
    return 0.0 if triton else 16.0 * chunk_size * arch.vocab_size / tp


def budget_for(arch, free_bytes: float, *, recompute: bool = False, tp: int = 1,
               pending_optimizer_bytes: float = 0.0, chunk_bytes: float = 0.0) -> TokenBudget:
    """The budget for ``free_bytes`` of free device memory (module docstring)."""
    usable = max(0.0, free_bytes - pending_optimizer_bytes - chunk_bytes - RESERVE)
    per_token = bytes_per_token(arch, recompute, tp)
    steps = int(SAFETY * usable / per_token) // STEP
    return TokenBudget(min(CAP, max(STEP, steps * STEP)), per_token, SAFETY * usable, free_bytes)


def device_free_bytes() -> float:
    """Free device memory, counting what torch's cache holds unallocated (on a CPU: the
    system's available memory)."""
    if not torch.cuda.is_available():
        import os

        return float(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    free, _ = torch.cuda.mem_get_info()
    return float(free + torch.cuda.memory_reserved() - torch.cuda.memory_allocated())


def pending_optimizer_bytes(optimizer) -> float:
    """Adam's fp32 states not yet allocated (torch's and TE's Adam create them at the first
    step): 8 bytes for each such parameter of this rank."""
    if optimizer is None:
        return 0.0
    total = 0.0
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = getattr(opt, "optimizer", opt)
        for group in inner.param_groups:
            total += sum(8.0 * p.numel() for p in group["params"] if not inner.state.get(p))
    return total


def startup_line(max_tokens: int | None) -> str:
    """What a run says about its micro-batch at start-up: the flag's value, or where the size
    will come from (free memory is only known at the first pass, once the colocated engine's
    KV pool is released)."""
    if max_tokens:
        return f"max tokens per GPU: {max_tokens} (--max-tokens-per-gpu)"
    return (f"max tokens per GPU: sized from free memory at the first pass, after the rollout "
            f"engine's KV pool is released, up to {CAP} (printed then; --max-tokens-per-gpu sets it)")


def print_startup_line(max_tokens: int | None) -> None:
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(startup_line(max_tokens), flush=True)


def resolve_max_tokens(trainer, free_bytes: float | None = None) -> int:
    """The budget for this trainer (a ``PolicyTrainer``) now, agreed over ranks and printed."""
    from megatron.core import parallel_state as ps

    from .logprobs import _triton_installed

    tp = ps.get_tensor_model_parallel_world_size() if ps.model_parallel_is_initialized() else 1
    cfg, arch = trainer.train_cfg, trainer.arch
    cuda = torch.cuda.is_available()
    recompute = bool(getattr(trainer.model_cfg, "recompute_activations", False))
    budget = budget_for(
        arch, device_free_bytes() if free_bytes is None else free_bytes, recompute=recompute,
        tp=tp, pending_optimizer_bytes=pending_optimizer_bytes(trainer.optimizer),
        chunk_bytes=logprob_chunk_bytes(arch, cfg.log_probs_chunk_size,
                                        cuda and _triton_installed(), tp))
    tokens = _min_over_ranks(budget.tokens)
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(budget.describe(recompute) + (f"; {tokens} on every rank (another's was smaller)"
                                            if tokens != budget.tokens else ""), flush=True)
    return tokens


def _min_over_ranks(tokens: int) -> int:
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return tokens
    from ..launch import default_device

    t = torch.tensor([tokens], dtype=torch.int64, device=default_device())
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())
