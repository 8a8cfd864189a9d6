"""What a step carries between host and device: the packed outputs of a launched step and
their host copy (PendingStep, StepOutput, HostRing), the per-batch tensors decode steps reuse, and
the layouts both the eager path (model_runner.py) and the graphed one (cuda_graph.py) build."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ..kvcache.kv_cache import segments
from ..models.config import ModelConfig
from .sampler import SampleOutput, SamplingBatch
from .scheduler import Batch
from .sequence import Sequence

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

@dataclass
class StepOutput:
    """What one step produced for each request of the batch (Python values, on the host)."""
    token_ids: list[int]
    logprobs: list[float] | None
    top_logprobs: list[list[tuple[float, int]]] | None
    input_logprobs: dict[int, tuple[list, list | None]]  # batch index -> (logprobs, top)
    stop_hits: list[bool] | None = None  # token_ids[i] is one of request i's stop ids


class PendingStep:
    """A launched step. Its outputs are packed into one float64 [B, C] tensor (token id, stop
    flag, logprob, top values, top ids; all exact in float64) copied to pinned host memory
    without blocking; `result()` waits for that copy alone."""

    def __init__(self, batch: Batch, packed: torch.Tensor, has_lp: bool, top_k: int,
                 input_lp: dict, host_ring: "HostRing | None"):
        self.batch, self.input_lp = batch, input_lp
        self.has_lp, self.top_k = has_lp, top_k
        self.event = None
        if packed.is_cuda and host_ring is not None:
            self.host, self.event = host_ring.copy_from(packed)
        else:  # a copy: a graph's output buffer is rewritten by the next replay
            self.host = packed.to("cpu", copy=True)
        self.wait_s = 0.0

    def result(self) -> StepOutput:
        if self.event is not None:
            t = time.perf_counter()
            self.event.synchronize()
            self.wait_s = time.perf_counter() - t
        cols = self.host.t()
        ids = cols[0].long().tolist()
        hits = cols[1].bool().tolist()
        lps = cols[2].tolist() if self.has_lp else None
        tops = None
        if self.top_k:
            c = 2 + self.has_lp
            tv, ti = self.host[:, c:c + self.top_k].tolist(), self.host[:, c + self.top_k:].long().tolist()
            tops = [list(zip(v, i)) for v, i in zip(tv, ti)]
        return StepOutput(ids, lps, tops, self.input_lp, hits)


def pack_outputs(out: SampleOutput, hits: torch.Tensor) -> torch.Tensor:
    """[B, C] float64: token id, stop flag, (logprob), (top values, top ids)."""
    cols = [out.ids.double(), hits] + ([out.logprobs] if out.logprobs is not None else [])
    packed = torch.stack(cols, dim=1)  # promotes to float64
    if out.top_values is not None:
        packed = torch.cat([packed, out.top_values, out.top_ids.double()], dim=1)
    return packed


def prefill_layout(counts: list[int], first_pos: list[int], device) -> tuple[torch.Tensor, ...]:
    """For a prefill of requests with `counts` new tokens starting at logical positions
    `first_pos`: each flat token's position [T], the right-padded layout attention uses,
    pad_index [B, Lmax] (flat token index, padding -> 0), and pad_rows [T], each flat token's
    row in that layout flattened to [B * Lmax]. Built on the host from B numbers: Python lists
    of every token cost ~15 ms per 16k-token step, and a boolean mask to unpad would make the
    device sync in every layer."""
    seg, start, offset = segments(counts)
    positions = torch.tensor(first_pos, dtype=torch.int64)[seg] + offset
    lmax = max(counts)
    col = torch.arange(lmax)[None, :]
    pad_index = torch.where(col < torch.tensor(counts)[:, None], start[:, None] + col, 0)
    pad_rows = seg * lmax + offset
    return tuple(t.to(device, non_blocking=True) for t in (positions, pad_index, pad_rows))


def sampling_columns(seqs: list[Sequence], vocab: int) -> tuple[list[list[float]], list[list[int]]]:
    """The requests' sampling parameters as columns, laid out as the sampler's tensors: floats
    (temperature, top_p, min_p, divisor = temperature or 1 when greedy, sampled) and ints
    (top_k or the vocabulary size when off, seed, uses a top-k/top-p/min-p filter)."""
    ps = [s.params for s in seqs]
    floats = [[p.temperature for p in ps], [p.top_p for p in ps], [p.min_p for p in ps],
              [p.temperature if p.temperature > 0 else 1.0 for p in ps],
              [float(p.temperature > 0) for p in ps]]
    ints = [[p.top_k if p.top_k > 0 else vocab for p in ps], [s.seed for s in seqs],
            [int(not p.greedy and (p.top_p < 1.0 or p.top_k > 0 or p.min_p > 0.0)) for p in ps]]
    return floats, ints


class HostRing:
    """Pinned host buffers taken round-robin for the steps' device->host copies. A fresh pinned
    allocation per step can cost milliseconds of host time; at most two steps are alive at once
    (one running, one being launched), and a buffer is reused only once its copy has landed."""

    def __init__(self, size: int = 3):
        self.bufs: list[torch.Tensor | None] = [None] * size
        self.events: list[torch.cuda.Event | None] = [None] * size
        self.next = 0

    def copy_from(self, packed: torch.Tensor) -> tuple[torch.Tensor, torch.cuda.Event]:
        i, self.next = self.next, (self.next + 1) % len(self.bufs)
        if self.events[i] is not None:
            self.events[i].synchronize()  # already done in the engine's order of work
        n = packed.numel()
        if self.bufs[i] is None or self.bufs[i].numel() < n:
            self.bufs[i] = torch.empty(max(n, 4096), dtype=torch.float64, pin_memory=True)
        host = self.bufs[i][:n].view(packed.shape)
        host.copy_(packed, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        self.events[i] = event
        return host, event


@dataclass
class BatchTensors:
    """What stays the same across the decode steps of an unchanged batch."""
    key: tuple
    rows: torch.Tensor  # [B] int64 on the device
    sampling: SamplingBatch  # without `steps` / bans, which change every step
    min_new: list[tuple[int, Sequence]]  # (batch index, request) with min_new_tokens > 0


def resolve_device(name: str) -> torch.device:
    """The engine's device, with its index: a bare ``cuda`` is the caller's current device now,
    the one a later thread must bind to (``bind_thread``)."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def bind_thread(device: torch.device) -> None:
    """Make ``device`` the calling thread's current CUDA device. The current device is per
    thread and a new thread starts on device 0, while Triton launches on the current device's
    stream whatever its tensors' device: rank 1's engine thread, left unbound, failed every
    step with "Pointer argument cannot be accessed from Triton (cpu tensor?)". So every thread
    that runs engine steps (the step loop, graph captures, weight updates) binds first."""
    if device.type == "cuda":
        torch.cuda.set_device(device)


def resolve_dtype(name: str, cfg: ModelConfig, model_path: str) -> torch.dtype:
    if name != "auto":
        return _DTYPES[name]
    if cfg.checkpoint_dtype is not None:
        return cfg.checkpoint_dtype
    from ..weights.loader import checkpoint_dtype

    return checkpoint_dtype(model_path)
