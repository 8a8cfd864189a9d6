"""How fast each phase of a rollout ran, per GPU: tokens/s and MFU, as ``benchmarks/training/train_step.py`` counts.

FLOPs are the model's matmuls (6 x matmul params x tokens, lm head included) plus causal
attention (6 x layers x S x heads x head_dim per token of a length-S sequence) for a forward +
backward; a forward is a third of that. Sparse replay and compressed decode are counted as
their dense equivalent (the work the same tokens would cost densely). Per GPU: a data-parallel
rank's tokens, its model-parallel group (TP x PP GPUs) sharing them. MFU divides by the GPU's
dense bf16 peak, known by its name (``PEAK_BF16``); on other devices it is left out, with the
reason printed once.

Phases (metric ``perf/<phase>_tokens_per_s`` and ``perf/<phase>_mfu``):

* ``reference``: the frozen reference's log-prob forward (π_ref);
* ``old_logp``: the policy's π_old recompute forward (absent when fused into the update);
* ``update``: the optimizer steps (forward + backward + optimizer; fused: π_old included);
* ``generate``: response tokens over the generation seconds, per generating GPU; its FLOPs are
  one forward over every sample's prompt and response.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time

import torch

from evaluation.progress import write

# dense bf16 tensor-core peak, matched against the device name in this order (first match)
PEAK_BF16 = (("H100 PCIe", 756e12), ("H100", 989e12), ("H200", 989e12), ("GH200", 989e12),
             ("A100", 312e12))
PHASES = ("generate", "reference", "old_logp", "update")


def flops_per_token(arch, seq_len: int) -> float:
    """Forward + backward FLOPs per token of a length-``seq_len`` sequence (forward: a third)."""
    d, f, hd = arch.hidden_size, arch.ffn_hidden_size, arch.head_dim
    nh, ng, L, V = arch.num_attention_heads, arch.num_query_groups, arch.num_layers, arch.vocab_size
    per_layer = d * (nh + 2 * ng) * hd + nh * hd * d + 2 * d * f + f * d
    matmul_params = L * per_layer + V * d
    return 6 * matmul_params + 6 * L * seq_len * nh * hd


def train_flops(arch, lengths: list[int]) -> float:
    """Forward + backward FLOPs of one pass over sequences of these lengths."""
    return sum(n * flops_per_token(arch, n) for n in lengths)


def forward_flops(arch, lengths: list[int]) -> float:
    return train_flops(arch, lengths) / 3


def device_name() -> str:
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


def peak_for(name: str) -> float | None:
    """The dense bf16 peak of a device of this name; None where unknown."""
    return next((v for k, v in PEAK_BF16 if k in name), None)


@functools.lru_cache(maxsize=None)
def this_gpu_peak() -> float | None:
    """This process's GPU peak; the first time it is unknown, one line says MFU is left out."""
    name = device_name()
    peak = peak_for(name)
    rank0 = not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0
    if peak is None and rank0:
        write(f"speed: MFU left out of the perf/ metrics: no dense bf16 peak known for "
              f"{name!r} (learner/speed.py PEAK_BF16)")  # above the rollouts bar
    return peak


@dataclasses.dataclass
class PhaseTiming:
    """What one phase did in a rollout, on this GPU."""

    tokens: float = 0.0
    flops: float = 0.0
    seconds: float = 0.0

    def add(self, other: "PhaseTiming") -> None:
        self.tokens += other.tokens
        self.flops += other.flops
        self.seconds += other.seconds

    def metrics(self, phase: str, peak: float | None) -> dict:
        if self.seconds <= 0:
            return {}
        out = {f"perf/{phase}_tokens_per_s": self.tokens / self.seconds}
        if peak:
            out[f"perf/{phase}_mfu"] = self.flops / self.seconds / peak
        return out


class SpeedMeter:
    """Per-phase totals since the last ``drain`` (one rollout's worth)."""

    def __init__(self, clock=time.perf_counter):
        self._phases: dict[str, PhaseTiming] = {}
        self.clock = clock  # tests inject durations here

    def record(self, phase: str, timing: PhaseTiming) -> None:
        self._phases.setdefault(phase, PhaseTiming()).add(timing)

    @contextlib.contextmanager
    def timed(self, phase: str, tokens: float, flops: float):
        """Time the block (device work included: synchronised at both ends)."""
        _sync()
        start = self.clock()
        yield
        _sync()
        self.record(phase, PhaseTiming(tokens, flops, self.clock() - start))

    def drain(self) -> dict[str, PhaseTiming]:
        out, self._phases = self._phases, {}
        return out


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def model_parallel_size() -> int:
    """GPUs that share one data-parallel rank's tokens (TP x PP); 1 without Megatron."""
    from megatron.core import parallel_state as ps

    if not ps.model_parallel_is_initialized():
        return 1
    return (ps.get_tensor_model_parallel_world_size()
            * ps.get_pipeline_model_parallel_world_size())


def generation_timing(arch, samples, seconds: float, gpus: int) -> PhaseTiming:
    """One rollout's generation per GPU: response tokens, one forward's FLOPs over every
    sample, the generation seconds; ``gpus``: how many GPUs generated."""
    lengths = [s.length for s in samples]
    tokens = sum(len(s.response_ids) for s in samples)
    return PhaseTiming(tokens / gpus, forward_flops(arch, lengths) / gpus, seconds)


def rollout_speed(trainers, generation: PhaseTiming | None = None,
                  peak: float | None = None) -> dict:
    """The rollout's ``perf/`` metrics: each trainer's phases since the last call (drained),
    and generation's when given. ``peak`` defaults to this GPU's (None where unknown)."""
    peak = peak if peak is not None else this_gpu_peak()
    phases: dict[str, PhaseTiming] = {}
    if generation is not None:
        phases["generate"] = generation
    for trainer in trainers:
        if trainer is not None:
            for phase, timing in trainer.speed.drain().items():
                phases.setdefault(phase, PhaseTiming()).add(timing)
    out = {}
    for phase, timing in phases.items():
        out.update(timing.metrics(phase, peak))
    return out
