"""CUDA graphs of whole decode steps: one per (padded batch size, sampling mode), captured on
first use.

A small model's decode step is hundreds of tiny kernels, and on the host every PyTorch op costs
tens of microseconds: replaying the step as one graph removes both. The graph covers the slot-
table write, the embedding of the rows' last tokens (row_state.py), the forward, the LM head,
sampling, the stop-id check and the packing of the outputs; per step the host sends one small
host->device copy (positions, lengths, draw indices, rows), copies the new slots in, replays,
and starts the outputs' copy back. Sampling parameters live in static buffers rewritten only
when the batch changes. Padding entries point at table row 0 / slot 0, which are reserved and
never hold a request's KV, and sample greedily into row 0 of the row state.
Compression runs eagerly between replays (model_runner.after_step).
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass

import torch

from ..kvcache.kv_cache import KVCache
from ..layers.attention import AttentionMetadata, TorchAttention
from ..models.causal_lm import CausalLM
from .row_state import RowState
from .sampler import Sampler, SamplingBatch
from .step_io import pack_outputs, sampling_columns

_PAD_STEP = (0, 1, 0, 0)  # position, kv length, draw index, row of a padding entry


class CaptureGate:
    """Capture vs another thread's GPU work in this process (async training: the trainer's
    thread computes while the engine decodes). While a stream captures, a device-wide sync or
    an allocator ``cudaFree`` on any thread fails that thread ("operation not permitted when
    stream is capturing") and invalidates the capture, whatever the capture mode (measured on
    an H200). So a thread doing such work holds ``device_work()``, and a capture only starts
    when nobody does: the engine never waits here, it runs the step eagerly instead and
    captures at a later step (``deferred`` counts those steps)."""

    def __init__(self):
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def device_work(self):
        """Held by another thread around its GPU work; waits at most for one capture."""
        with self._lock:
            yield

    def try_capture(self) -> bool:
        """Take the gate for a capture if it is free (then ``end_capture``)."""
        return self._lock.acquire(blocking=False)

    def end_capture(self) -> None:
        self._lock.release()


CAPTURE_GATE = CaptureGate()  # one per process: the GPU and its allocator are shared


def device_work():
    """The public capture-gate context (``sglang_kvc.device_work``): hold it around another
    thread's GPU work in a process that runs an engine (see CaptureGate)."""
    return CAPTURE_GATE.device_work()


@dataclass(frozen=True)
class GraphParts:
    """What a captured decode step reads and writes (model_runner.py builds it). The objects,
    not their tensors: the KV pool and the weights move on memory release/resume, the objects
    that hold them stay."""

    device: torch.device
    vocab_size: int  # padding entries' top_k: no filter
    kv: KVCache  # the slot table, new slots, the pool's addresses
    attn: TorchAttention  # its per-step metadata is set inside the graph
    model: CausalLM
    sampler: Sampler
    rows: RowState  # last tokens in, samples recorded


class DecodeGraphs:
    def __init__(self, parts: GraphParts, max_bs: int):
        self.parts = parts
        self.sizes = [s for s in [1, 2, 4, 8] + list(range(16, max_bs + 1, 16)) if s <= max_bs]
        self.max_bs = self.sizes[-1]
        dev = parts.device
        self.step_ints = torch.zeros(4, self.max_bs, dtype=torch.int64, device=dev)
        self.out_slots = torch.zeros(self.max_bs, dtype=torch.int64, device=dev)
        # temperature, top_p, min_p, divisor (0 -> 1), sampled; top_k, seed, filtered
        self.params_f = torch.zeros(5, self.max_bs, dtype=torch.float32, device=dev)
        self.params_i = torch.zeros(3, self.max_bs, dtype=torch.int64, device=dev)
        self.num_captures, self.capture_s = 0, 0.0  # over the engine's life (server info)
        self.deferred = 0  # steps run eagerly because another thread held CAPTURE_GATE
        self.capture_stream: torch.cuda.Stream | None = None
        self.clear()

    def clear(self) -> None:
        self.graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.pool = None
        self.kv_ptrs: tuple[int, int] | None = None  # the KV pool the graphs were captured on
        self._params_key = None
        self._slots_bs: dict[int, int] = {}

    def pool_moved(self) -> bool:
        """Whether the KV pool now lives elsewhere than when the graphs were captured (their
        kernels read and write it through baked-in addresses)."""
        pool = self.parts.kv.pool
        return self.kv_ptrs is not None and self.kv_ptrs != (pool.k.data_ptr(), pool.v.data_ptr())

    def stats(self) -> dict:
        return {"graphs": len(self.graphs), "captures": self.num_captures,
                "capture_s": self.capture_s, "deferred": self.deferred}

    def can_run(self, bs: int) -> bool:
        return bs <= self.max_bs

    def _padded(self, bs: int) -> int:
        return next(s for s in self.sizes if s >= bs)

    def step(self, seqs: list, bt) -> torch.Tensor | None:
        """Run one decode step of `seqs` (batch tensors `bt`); returns the packed outputs
        [bs, C] (model_runner.pack_outputs) on the device. Updates the requests' KV lengths.
        None, with nothing done, when the step needs a capture and CAPTURE_GATE is held."""
        bs, gbs, mode = len(seqs), self._padded(len(seqs)), self._mode(bt.sampling)
        if (gbs, mode) in self.graphs:
            self._load(seqs, bt, gbs)
        elif CAPTURE_GATE.try_capture():
            try:
                self._load(seqs, bt, gbs)
                self._capture(gbs, mode)
            finally:
                CAPTURE_GATE.end_capture()
        else:
            self.deferred += 1
            return None
        graph, packed = self.graphs[(gbs, mode)]
        graph.replay()
        return packed[:bs]

    def _load(self, seqs: list, bt, gbs: int) -> None:
        if self._params_key != (bt.key, gbs):
            self._load_params(seqs, gbs)
            self._params_key = (bt.key, gbs)
        self._load_step(seqs, gbs)

    @staticmethod
    def _mode(sb: SamplingBatch) -> tuple:
        return sb.all_greedy, sb.need_filter, sb.need_logprobs, sb.top_logprobs_num

    def _load_step(self, seqs: list, gbs: int) -> None:
        """One host->device copy of this step's per-row integers, and the new slots."""
        pad = [[v] * (gbs - len(seqs)) for v in _PAD_STEP]
        host = torch.tensor([[s.num_computed for s in seqs] + pad[0], [s.kv_len + 1 for s in seqs] + pad[1],
                             [s.num_sampled for s in seqs] + pad[2], [s.row for s in seqs] + pad[3]],
                            dtype=torch.int64)
        self.step_ints[:, :gbs].copy_(host, non_blocking=True)
        bs = len(seqs)
        self.out_slots[:bs].copy_(self.parts.kv.alloc_one(seqs))
        if bs < gbs and self._slots_bs.get(gbs) != bs:
            self.out_slots[bs:gbs].zero_()
        self._slots_bs[gbs] = bs
        for s in seqs:
            s.num_computed += 1

    def _load_params(self, seqs: list, gbs: int) -> None:
        V, pad = self.parts.vocab_size, gbs - len(seqs)
        floats, ints = sampling_columns(seqs, V)
        # padding entries: greedy, no filter (top_k = vocabulary)
        fl = [col + [v] * pad for col, v in zip(floats, (0.0, 1.0, 0.0, 1.0, 0.0))]
        it = [col + [v] * pad for col, v in zip(ints, (V, 0, 0))]
        self.params_f[:, :gbs].copy_(torch.tensor(fl, dtype=torch.float32), non_blocking=True)
        self.params_i[:, :gbs].copy_(torch.tensor(it, dtype=torch.int64), non_blocking=True)

    def _sampling(self, gbs: int, mode: tuple) -> SamplingBatch:
        all_greedy, need_filter, need_logprobs, top_n = mode
        f, i = self.params_f[:, :gbs], self.params_i[:, :gbs]
        return SamplingBatch(
            temperatures=f[0], top_p=f[1], min_p=f[2], top_k=i[0], seeds=i[1],
            steps=self.step_ints[2, :gbs], all_greedy=all_greedy, need_filter=need_filter,
            need_logprobs=need_logprobs, top_logprobs_num=top_n, filtered=i[2] > 0,
            divisors=f[3], sampled=f[4] > 0)

    def _body(self, gbs: int, mode: tuple) -> torch.Tensor:
        p = self.parts
        positions, kv_lens, _, rows = self.step_ints[:, :gbs]
        slots = self.out_slots[:gbs]
        p.kv.req_to_token.table[rows, kv_lens - 1] = slots.to(torch.int32)
        p.attn.meta = AttentionMetadata(False, slots, rows=rows, kv_lens=kv_lens.to(torch.int32),
                                        max_kv_len=p.kv.req_to_token.max_len,  # (a bound; Triton ignores it)
                                        rec_rows=rows, rec_pos=positions)
        hidden = p.model(p.rows.last_token[rows], positions, p.attn)
        out = p.sampler(p.model.logits(hidden, upcast=False), self._sampling(gbs, mode))
        return pack_outputs(out, p.rows.record(rows, out.ids))

    def _capture(self, gbs: int, mode: tuple) -> None:
        t0 = time.perf_counter()
        self._capture_graph(gbs, mode)
        pool = self.parts.kv.pool
        self.kv_ptrs = (pool.k.data_ptr(), pool.v.data_ptr())
        self.num_captures += 1
        self.capture_s += time.perf_counter() - t0

    def _stream(self) -> torch.cuda.Stream:
        """This engine's side stream, on its own device. ``torch.cuda.graph``'s default capture
        stream is one per process, made on whichever device was current at the first capture:
        a second engine on another GPU then captured on the first one's device (Triton: "Pointer
        argument cannot be accessed")."""
        if self.capture_stream is None:
            self.capture_stream = torch.cuda.Stream(device=self.parts.device)
        return self.capture_stream

    def _capture_graph(self, gbs: int, mode: tuple) -> None:
        # The warm-up runs the step for real (Triton compiles and autotunes outside capture);
        # the replay that follows recomputes the same values into the same places, once the
        # rows' input tokens, which the warm-up overwrote with its samples, are put back.
        last = self.parts.rows.last_token
        saved = last.clone()
        stream = self._stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            self._body(gbs, mode)
        torch.cuda.current_stream().wait_stream(stream)
        last.copy_(saved)
        graph = torch.cuda.CUDAGraph()
        # thread_local: with --max-staleness the trainer keeps launching work (and allocating)
        # on its own thread while the rollout thread captures; the default "global" mode turns
        # those calls into cudaErrorStreamCaptureUnsupported on the trainer's side.
        with torch.cuda.graph(graph, pool=self.pool, stream=stream,
                              capture_error_mode="thread_local"):
            packed = self._body(gbs, mode)
        self.pool = graph.pool()
        self.graphs[(gbs, mode)] = (graph, packed)
