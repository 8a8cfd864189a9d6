"""What a step carries between host and device: the packed outputs of a launched step and
their host copy (PendingStep, StepOutput, HostRing), the pinned staging of a captured step's
inputs (PinnedStage), the per-batch values decode steps reuse (BatchTensors), and the layouts
both the eager path (model_runner.py) and the graphed one (cuda_graph.py) build."""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from ..kvcache.host_copy import ints_to_device
from ..kvcache.kv_cache import segments
from ..layers.attention import EXTEND_BLOCK_M, ExtendLayout
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
    without blocking; `result()` waits for that copy alone and reads it through numpy (a torch
    op per column cost more than the whole parse at small batch)."""

    def __init__(self, batch: Batch, packed: torch.Tensor, has_lp: bool, top_k: int,
                 input_lp: dict, host_ring: "HostRing | None"):
        self.batch, self.input_lp = batch, input_lp
        self.has_lp, self.top_k = has_lp, top_k
        self.event = None
        if packed.is_cuda and host_ring is not None:
            self.host, self.event = host_ring.copy_from(packed)
        else:  # a copy: a graph's output buffer is rewritten by the next replay
            self.host = packed.to("cpu", copy=True).numpy()
        self.wait_s = 0.0

    def result(self) -> StepOutput:
        if self.event is not None:
            t = time.perf_counter()
            self.event.synchronize()
            self.wait_s = time.perf_counter() - t
        return parse_outputs(self.host, self.has_lp, self.top_k, self.input_lp)


def parse_outputs(host: np.ndarray, has_lp: bool, top_k: int, input_lp: dict) -> StepOutput:
    """The packed [B, C] float64 outputs (pack_outputs) as Python values."""
    ids = host[:, 0].astype(np.int64).tolist()
    hits = (host[:, 1] != 0).tolist()
    lps = host[:, 2].tolist() if has_lp else None
    tops = None
    if top_k:
        c = 2 + has_lp
        tv, ti = host[:, c:c + top_k].tolist(), host[:, c + top_k:].astype(np.int64).tolist()
        tops = [list(zip(v, i)) for v, i in zip(tv, ti)]
    return StepOutput(ids, lps, tops, input_lp, hits)


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
    device sync in every layer. In numpy, sent in one copy (host_to_device)."""
    seg, start, offset = segments(counts)
    positions = np.asarray(first_pos, dtype=np.int64)[seg] + offset
    lmax = max(counts)
    col = np.arange(lmax)[None, :]
    pad_index = np.where(col < np.asarray(counts)[:, None], start[:, None] + col, 0)
    return host_to_device([positions, pad_index, seg * lmax + offset], device)


def host_to_device(arrays: list[np.ndarray], device) -> list[torch.Tensor]:
    """Int arrays of one dtype to `device` in one copy that never waits for the GPU
    (`kvcache.host_copy.ints_to_device`): views of one flat buffer, each in its array's shape.
    Why one copy of numpy arrays: torch's CPU ops on small index arrays cost ~1-2 ms each inside
    the engine on an H200 machine's host (its profile of multi-turn prefill steps, 2026-11-29),
    numpy's microseconds, and each tensor's own copy is a launch and its host work."""
    flat = ints_to_device(np.concatenate([a.ravel() for a in arrays]), device, dtype=None)
    out, at = [], 0
    for a in arrays:
        out.append(flat[at:at + a.size].view(a.shape))
        at += a.size
    return out


def extend_layout(counts: list[int], prefix: list[int], rows: list[int], device) -> ExtendLayout | None:
    """The `ExtendLayout` of a prefill whose i-th request computes counts[i] new tokens after
    prefix[i] cached ones (None when no request has a prefix). The host builds what grows with
    the new tokens (numpy, two copies: the int64 layout and the kernel's int32 one); the mask,
    [E, Lq, Lk] and so growing with the held context, is built on the device from E lengths
    when the torch path asks for it (ExtendLayout.mask; on the host it cost ~80 ms and a 27 MB
    copy at 32 rows of 200 new tokens after 4k held)."""
    hit = np.flatnonzero(np.asarray(prefix, dtype=np.int64))
    if not hit.size:
        return None
    seg, start, offset = segments(counts)
    n, p = np.asarray(counts, dtype=np.int64)[hit], np.asarray(prefix, dtype=np.int64)[hit]
    lq, lk = int(n.max()), int((n + p).max())
    col = np.arange(lq)[None, :]
    q_index = np.where(col < n[:, None], start[hit][:, None] + col, 0)
    which = np.full(len(counts), -1, dtype=np.int64)
    which[hit] = np.arange(hit.size)
    tokens = np.flatnonzero(which[seg] >= 0)
    pad_rows = which[seg[tokens]] * lq + offset[tokens]
    rows_hit = np.asarray(rows, dtype=np.int64)[hit]
    # the paged kernel's layout: per request (row, first token, new, held), its work list
    requests = np.stack([rows_hit, start[hit], n, p]).astype(np.int32)
    work = np.asarray(extend_work(n.tolist()), dtype=np.int32).reshape(-1, 2).T
    requests, work = host_to_device([requests, work], device)
    rows_t, q_index, tokens, pad_rows, n, p = host_to_device(
        [rows_hit, q_index, tokens, pad_rows, n, p], device)
    return ExtendLayout(rows_t, q_index, tokens, pad_rows, n, p, max_new=lq, max_len=lk,
                        every=hit.size == len(counts), requests=requests, work=work)


def extend_work(new_counts, block_m: int = EXTEND_BLOCK_M) -> list[tuple[int, int]]:
    """The paged extend kernel's work list for requests with `new_counts` new tokens: (request
    index, first new token of the block) for every block of `block_m` tokens, in order."""
    return [(e, m0) for e, n in enumerate(new_counts) for m0 in range(0, n, block_m)]


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
    (one running, one being launched), and a buffer is reused only once its copy has landed.
    Its views (torch for the copy, numpy for the read) and its event are made once per slot
    and shape: per step that leaves the copy and the event's record."""

    def __init__(self, size: int = 3):
        self.bufs: list[torch.Tensor | None] = [None] * size
        self.events = [torch.cuda.Event() for _ in range(size)]  # created on first record
        self.views: dict[tuple, tuple[torch.Tensor, np.ndarray]] = {}
        self.next = 0

    def copy_from(self, packed: torch.Tensor) -> tuple[np.ndarray, torch.cuda.Event]:
        i, self.next = self.next, (self.next + 1) % len(self.bufs)
        event = self.events[i]
        event.synchronize()  # already done in the engine's order of work (never recorded: no-op)
        host, array = self._view(i, tuple(packed.shape))
        host.copy_(packed, non_blocking=True)
        event.record()
        return array, event

    def _view(self, i: int, shape: tuple) -> tuple[torch.Tensor, np.ndarray]:
        view = self.views.get((i, shape))
        if view is None:
            n = math.prod(shape)
            if self.bufs[i] is None or self.bufs[i].numel() < n:
                self.bufs[i] = torch.empty(max(n, 4096), dtype=torch.float64, pin_memory=True)
                self.views = {k: v for k, v in self.views.items() if k[0] != i}  # old buffer's
            host = self.bufs[i][:n].view(shape)
            view = self.views[(i, shape)] = (host, host.numpy())
        return view


class PinnedStage:
    """The host side of a static device buffer (a captured step's inputs). A step's values are
    written into a pinned buffer through its numpy view (no torch op per field) and leave in
    one host->device copy, which never waits for the GPU (from pageable memory the driver may
    stage it and sync the stream). Buffers are taken in turn, each rewritten only once its last
    copy has left (its event): with overlap scheduling the copy for step N+1 can still be queued
    behind step N when step N+2 is prepared. On a CPU, plain memory and a plain copy."""

    def __init__(self, dst: torch.Tensor, depth: int = 2):
        self.dst = dst  # flat
        cuda = dst.is_cuda
        self.host = [torch.zeros(dst.numel(), dtype=dst.dtype, pin_memory=cuda) for _ in range(depth)]
        self.arrays = [h.numpy() for h in self.host]
        self.events = [torch.cuda.Event() if cuda else None for _ in range(depth)]
        self.pairs: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
        self.next = 0

    def send(self, values: list) -> None:
        """dst[:len(values)] = values, in one copy that does not block the host."""
        i, self.next = self.next, (self.next + 1) % len(self.host)
        event, n = self.events[i], len(values)
        if event is not None:
            event.synchronize()
        self.arrays[i][:n] = values
        src, dst = self._pair(i, n)
        dst.copy_(src, non_blocking=True)
        if event is not None:
            event.record()

    def _pair(self, i: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        pair = self.pairs.get((i, n))
        if pair is None:  # two slices: torch ops worth keeping out of the step
            pair = self.pairs[(i, n)] = (self.host[i][:n], self.dst[:n])
        return pair


class SamplingMode(NamedTuple):
    """What picks a captured graph (and the sampler's code path) for a batch."""
    all_greedy: bool
    need_filter: bool  # some row uses top-k / top-p / min-p
    need_logprobs: bool
    top_logprobs_num: int  # max over the batch
    k_max: int | None = None  # sampler.SamplingBatch.k_max: a graph per value (top_k_bound)


def top_k_bound(ints: list[list[int]], vocab: int) -> int | None:
    """The sampler's k_max for sampling_columns' ints: the filtered rows' largest top_k, rounded
    up to a power of two (few distinct captured modes); None when a filtered row has no top_k
    (then the sampler sorts the vocabulary)."""
    ks = [k for k, filtered in zip(ints[0], ints[2]) if filtered]
    if not ks or max(ks) >= vocab:
        return None
    bound = 1 << (max(ks) - 1).bit_length()
    return bound if bound < vocab else None


class BatchTensors:
    """What stays the same across the decode steps of an unchanged batch: host values at once,
    device tensors (rows, sampling parameters) on first use. Graphed steps never use the latter
    (the graphs keep static copies), so a batch change costs them no copies here."""

    def __init__(self, key: tuple, seqs: list[Sequence], device: torch.device, vocab: int):
        self.key, self.seqs, self.device = key, seqs, device
        self.floats, self.ints = sampling_columns(seqs, vocab)
        self.mode = SamplingMode(all(s.params.greedy for s in seqs), any(self.ints[2]),
                                 any(s.return_logprob for s in seqs),
                                 max(s.top_logprobs_num for s in seqs),
                                 top_k_bound(self.ints, vocab))
        # (batch index, request) with min_new_tokens > 0
        self.min_new = [(i, s) for i, s in enumerate(seqs) if s.params.min_new_tokens > 0]
        # (batch index, token, bias) of the requests with a logit_bias
        self.bias = [(i, t, b) for i, s in enumerate(seqs)
                     for t, b in (s.params.logit_bias or {}).items()]

    @functools.cached_property
    def rows(self) -> torch.Tensor:
        rows = torch.tensor([s.row for s in self.seqs], dtype=torch.int64)
        return rows.to(self.device, non_blocking=True)

    @functools.cached_property
    def sampling(self) -> SamplingBatch:
        """The parameters as the eager sampler takes them (without `steps` and bans, which
        change every step)."""
        dev, m = self.device, self.mode
        fl = torch.tensor(self.floats, dtype=torch.float32).to(dev, non_blocking=True)
        it = torch.tensor(self.ints, dtype=torch.int64).to(dev, non_blocking=True)
        return SamplingBatch(
            temperatures=fl[0], top_p=fl[1], min_p=fl[2], top_k=it[0], seeds=it[1], steps=None,
            all_greedy=m.all_greedy, need_filter=m.need_filter, need_logprobs=m.need_logprobs,
            top_logprobs_num=m.top_logprobs_num, divisors=fl[3], sampled=fl[4] > 0,
            filtered=None if all(self.ints[2]) else it[2] > 0, k_max=m.k_max,
            **self._bias_tensors())

    def _bias_tensors(self) -> dict:
        if not self.bias:
            return {}
        rows, ids, values = zip(*self.bias)
        dev = self.device
        return {"bias_rows": torch.tensor(rows).to(dev, non_blocking=True),
                "bias_ids": torch.tensor(ids).to(dev, non_blocking=True),
                "bias_values": torch.tensor(values, dtype=torch.float32).to(dev, non_blocking=True)}


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
