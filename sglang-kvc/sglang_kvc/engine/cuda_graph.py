"""CUDA graphs of whole decode steps: one per (padded batch size, sampling mode), captured on
first use.

A small model's decode step is hundreds of tiny kernels, and on the host every PyTorch op costs
tens of microseconds: replaying the step as one graph removes both. The graph covers the slot-
table write, the embedding of the rows' last tokens (row_state.py), the forward, the LM head,
sampling, the stop-id check and the packing of the outputs. Per step the host writes the rows'
positions, lengths, draw indices and table rows into a pinned buffer and sends them in one
host->device copy (step_io.PinnedStage), copies the new slots (allocated on the device) into
the static slot buffer, replays, and starts the outputs' copy back: four CUDA calls, no sync.
Sampling parameters go the same way, only when the batch changes. Padding entries point at
table row 0 / slot 0, which are reserved and never hold a request's KV, and sample greedily
into row 0 of the row state. Compression runs eagerly between replays (model_runner.after_step).

Which sizes get a graph (`graph_sizes`): every size to 8, then 12, 16, 24, 32, then every 16.
At a small batch the step reads the weights once whatever the batch (~0.3 ms of the 0.5B
model's ~1 GB on an H100), and a padding row costs only its own cheap work (attention over one
slot, its logits row), so padding is nearly free; a capture is not (a warm-up step and a
capture, tens of ms, again whenever the KV pool moves, e.g. per rollout with KV offload, and a
long-tailed rollout's tail walks down through every size). Up to 32 this pads a batch by at
most 41% of its rows (17 -> 24; none to 8) with 12 graphs instead of 32; `--cuda-graph-bs`
sets other sizes (1-32 for every one).
"""

from __future__ import annotations

import bisect
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
from .step_io import PinnedStage, SamplingMode, pack_outputs
from .step_ints import StepInts

_SMALL_LADDER = (1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32)  # see the module docstring
# Pool addresses whose graphs are kept (DecodeGraphs.follow_pool): graphs cost little memory of
# their own (their intermediates share one private pool), a capture tens of ms.
KEEP_POOL_ADDRESSES = 4


def graph_sizes(max_bs: int, sizes: list[int] | None = None) -> list[int]:
    """The batch sizes that get a graph: `sizes` (--cuda-graph-bs) up to max_bs, else the
    default ladder up to max_bs, which is always one of them (the largest batch a graph runs)."""
    if sizes is not None:
        chosen = sorted({s for s in sizes if 1 <= s <= max_bs})
        if not chosen:
            raise ValueError(f"--cuda-graph-bs: no size <= --cuda-graph-max-bs {max_bs}")
        return chosen
    ladder = {s for s in (*_SMALL_LADDER, *range(48, max_bs + 1, 16)) if s <= max_bs}
    return sorted(ladder | {max_bs})


def padded_size(sizes: list[int], bs: int) -> int:
    """The smallest size with a graph that holds `bs` rows (bs <= sizes[-1])."""
    return sizes[bisect.bisect_left(sizes, bs)]


def _padded_rows(cols, pad_values, n: int) -> list:
    """Columns of per-row values, each followed by n copies of its padding value, flattened:
    the [len(cols), rows + n] layout of a graph's static buffer."""
    flat = []
    for col, pad in zip(cols, pad_values):
        flat += col
        flat += [pad] * n
    return flat


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


class PoolGraphs:
    """Graphs kept per KV-pool address (the decode and the prefill graphs): their kernels read
    and write the pool through baked-in addresses. Subclasses set ``parts`` and call
    ``clear`` last in their __init__."""

    parts: GraphParts
    capture_stream: torch.cuda.Stream | None = None  # made on first use (_stream)

    def clear(self) -> None:
        """Drop every graph (the weights or the stop-id table moved: no kept graph is valid)."""
        self.by_pool: dict[tuple | None, dict] = {}  # pool address -> its graphs, oldest first
        self.graphs: dict = {}
        self.pool = None
        self.kv_ptrs: tuple[int, int] | None = None  # the KV pool address `graphs` were captured on
        self.follow_pool()

    def _pool_ptrs(self) -> tuple[int, int] | None:
        pool = getattr(self.parts.kv, "pool", None)  # (host-path tests fake the cache)
        return (pool.k.data_ptr(), pool.v.data_ptr()) if pool is not None and pool.allocated else None

    def follow_pool(self) -> None:
        """Use the graphs captured on the KV pool's current address. A released pool (the
        trainer's per-rollout offload) may come back elsewhere (without a stable address,
        kvcache/stable_memory.py): the graphs of each address are kept (the last
        KEEP_POOL_ADDRESSES), so a pool that comes back at an address it had before replays
        its graphs instead of capturing again; a new address starts with none."""
        ptrs = self._pool_ptrs()
        if ptrs is None or (ptrs == self.kv_ptrs and self.by_pool):
            return
        self.graphs = self.by_pool.pop(ptrs, None) or {}
        self.by_pool[ptrs] = self.graphs  # the most recent last
        while len(self.by_pool) > KEEP_POOL_ADDRESSES:
            del self.by_pool[next(iter(self.by_pool))]
        self.kv_ptrs = ptrs
        self.pool_followed()

    def pool_followed(self) -> None:
        """Called when `graphs` changed to another address's."""

    def pool_moved(self) -> bool:
        """Whether the KV pool now lives elsewhere than the current graphs were captured on."""
        ptrs = self._pool_ptrs()
        return ptrs is not None and self.kv_ptrs is not None and ptrs != self.kv_ptrs

    def _stream(self) -> torch.cuda.Stream:
        """This engine's side stream, on its own device. ``torch.cuda.graph``'s default capture
        stream is one per process, made on whichever device was current at the first capture:
        a second engine on another GPU then captured on the first one's device (Triton: "Pointer
        argument cannot be accessed")."""
        if self.capture_stream is None:
            self.capture_stream = torch.cuda.Stream(device=self.parts.device)
        return self.capture_stream

    def _ready(self, key, load, capture) -> bool:
        """Load a step's inputs into the static buffers (`load()`), capturing `key`'s graph first
        (`capture()`) when there is none. False, with nothing done, while another thread holds
        CAPTURE_GATE: the step then runs eagerly and a later one captures (`deferred` counts)."""
        if key in self.graphs:
            load()
            return True
        if not CAPTURE_GATE.try_capture():
            self.deferred += 1
            return False
        try:
            load()
            capture()
        finally:
            CAPTURE_GATE.end_capture()
        return True

    def _capture_body(self, key, body) -> torch.Tensor:
        """Capture `body()` (its outputs) as the graph of `key`, in this object's memory pool.
        The caller has run it once for real first (Triton compiles outside capture)."""
        graph = torch.cuda.CUDAGraph()
        # thread_local: with --max-staleness the trainer keeps launching work (and allocating)
        # on its own thread while the rollout thread captures; the default "global" mode turns
        # those calls into cudaErrorStreamCaptureUnsupported on the trainer's side.
        with torch.cuda.graph(graph, pool=self.pool, stream=self._stream(),
                              capture_error_mode="thread_local"):
            out = body()
        self.pool = graph.pool()
        self.graphs[key] = (graph, out)
        return out


class DecodeGraphs(PoolGraphs):
    def __init__(self, parts: GraphParts, max_bs: int, sizes: list[int] | None = None):
        self.parts = parts
        self.sizes = graph_sizes(max_bs, sizes)
        self.max_bs = self.sizes[-1]
        dev, n = parts.device, self.max_bs
        # Flat static buffers: a graph of gbs rows reads the first k * gbs entries as [k, gbs],
        # so its inputs are one contiguous block (one copy). Rows: position, kv length (with the
        # new token), draw index, table row. Floats: temperature, top_p, min_p, divisor (0 ->
        # 1), sampled; ints: top_k, seed, filtered.
        self.step_ints = torch.zeros(4 * n, dtype=torch.int64, device=dev)
        self.params_f = torch.zeros(5 * n, dtype=torch.float32, device=dev)
        self.params_i = torch.zeros(3 * n, dtype=torch.int64, device=dev)
        self.out_slots = torch.zeros(n, dtype=torch.int64, device=dev)
        self.stages = {name: PinnedStage(getattr(self, name))
                       for name in ("step_ints", "params_f", "params_i")}
        self.num_captures, self.capture_s = 0, 0.0  # over the engine's life (server info)
        self.deferred = 0  # steps run eagerly because another thread held CAPTURE_GATE
        self.replays, self.replay_s = 0, 0.0  # host time launching replays (benchmarks.engine.decode_tail)
        self.step_ints_host = StepInts()  # the step's per-row integers (step_ints.py)
        self.clear()

    def clear(self) -> None:
        self._params_for: tuple | None = None  # (BatchTensors, gbs) the parameters were loaded for
        self._slot_views: dict[int, torch.Tensor] = {}  # out_slots[:bs]
        self._out_views: dict[tuple, torch.Tensor] = {}  # a graph's packed outputs[:bs]
        self._slots_hi = self.max_bs  # out_slots[i] == 0 for every i >= _slots_hi (unknown: all)
        self.step_ints_host.forget()
        super().clear()  # graphs: (gbs, SamplingMode) -> (graph, packed outputs)

    def pool_followed(self) -> None:
        self._out_views = {}  # views of the previous address's graphs' outputs

    def stats(self) -> dict:
        return {"graphs": len(self.graphs), "captures": self.num_captures,
                "pool_addresses": len(self.by_pool),
                "capture_s": self.capture_s, "deferred": self.deferred,
                "replays": self.replays, "replay_s": self.replay_s}

    def can_run(self, bs: int) -> bool:
        return bs <= self.max_bs

    def padded(self, bs: int) -> int:
        return padded_size(self.sizes, bs)

    def step(self, seqs: list, bt) -> torch.Tensor | None:
        """Run one decode step of `seqs` (batch values `bt`, step_io.BatchTensors); returns the
        packed outputs [bs, C] (step_io.pack_outputs) on the device. Updates the requests' KV
        lengths. None, with nothing done, when the step needs a capture and CAPTURE_GATE is held."""
        bs, gbs, mode = len(seqs), self.padded(len(seqs)), bt.mode
        if not self._ready((gbs, mode), lambda: self._load(seqs, bt, gbs), lambda: self._capture(gbs, mode)):
            return None
        self._replay(self.graphs[(gbs, mode)][0])
        return self._outputs((gbs, mode), bs)

    def _replay(self, graph) -> None:
        t = time.perf_counter()
        graph.replay()
        self.replay_s += time.perf_counter() - t
        self.replays += 1

    def _outputs(self, key: tuple, bs: int) -> torch.Tensor:
        """The real rows of a graph's packed outputs (a slice made once, not per step)."""
        out = self._out_views.get((key, bs))
        if out is None:
            out = self._out_views[(key, bs)] = self.graphs[key][1][:bs]
        return out

    def _load(self, seqs: list, bt, gbs: int) -> None:
        # The runner makes a new BatchTensors whenever the batch changes (identity, not its key:
        # batches built outside the scheduler all have version -1).
        if self._params_for != (bt, gbs):
            self._load_params(bt, gbs)
            self._params_for = (bt, gbs)
        self._load_step(seqs, bt, gbs)

    def _load_step(self, seqs: list, bt, gbs: int) -> None:
        """This step's per-row integers in one host->device copy, then the new slots."""
        self.stages["step_ints"].send(self.step_ints_host.next(seqs, bt, gbs))
        self._load_slots(seqs, gbs)  # (the runner counts the fed token: ModelRunner.launch)

    def _load_slots(self, seqs: list, gbs: int) -> None:
        """The new slots (allocated on the device: one device copy), and slot 0 for padding
        entries: a slot left there by a larger batch may since belong to another request, and
        a padding entry writes its K/V into it."""
        bs = len(seqs)
        view = self._slot_views.get(bs)
        if view is None:
            view = self._slot_views[bs] = self.out_slots[:bs]
        view.copy_(self.parts.kv.alloc_one(seqs))
        if gbs > bs and self._slots_hi > bs:
            self.out_slots[bs:self._slots_hi].zero_()
            self._slots_hi = bs
        self._slots_hi = max(self._slots_hi, bs)

    def _load_params(self, bt, gbs: int) -> None:
        """The batch's sampling parameters; padding entries greedy, no filter (top_k = the
        vocabulary)."""
        pad, V = gbs - len(bt.seqs), self.parts.vocab_size
        self.stages["params_f"].send(_padded_rows(bt.floats, (0.0, 1.0, 0.0, 1.0, 0.0), pad))
        self.stages["params_i"].send(_padded_rows(bt.ints, (V, 0, 0), pad))

    def _inputs(self, gbs: int) -> tuple[torch.Tensor, ...]:
        """The static buffers as a graph of gbs rows reads them: [4, gbs], [5, gbs], [3, gbs]."""
        return (self.step_ints[:4 * gbs].view(4, gbs), self.params_f[:5 * gbs].view(5, gbs),
                self.params_i[:3 * gbs].view(3, gbs))

    def _sampling(self, gbs: int, mode: SamplingMode) -> SamplingBatch:
        ints, f, i = self._inputs(gbs)
        return SamplingBatch(
            temperatures=f[0], top_p=f[1], min_p=f[2], top_k=i[0], seeds=i[1], steps=ints[2],
            all_greedy=mode.all_greedy, need_filter=mode.need_filter,
            need_logprobs=mode.need_logprobs, top_logprobs_num=mode.top_logprobs_num,
            filtered=i[2] > 0, divisors=f[3], sampled=f[4] > 0, k_max=mode.k_max)

    def _body(self, gbs: int, mode: SamplingMode) -> torch.Tensor:
        p = self.parts
        positions, kv_lens, _, rows = self._inputs(gbs)[0]
        slots = self.out_slots[:gbs]
        p.kv.req_to_token.table[rows, kv_lens - 1] = slots.to(torch.int32)
        p.attn.meta = AttentionMetadata(False, slots, rows=rows, kv_lens=kv_lens.to(torch.int32),
                                        max_kv_len=p.kv.req_to_token.max_len,  # (a bound; Triton ignores it)
                                        rec_rows=rows, rec_pos=positions)
        hidden = p.model(p.rows.last_token[rows], positions, p.attn)
        out = p.sampler(p.model.logits(hidden, upcast=False), self._sampling(gbs, mode))
        return pack_outputs(out, p.rows.record(rows, out.ids))

    def _capture(self, gbs: int, mode: SamplingMode) -> None:
        t0 = time.perf_counter()
        self._capture_graph(gbs, mode)
        self.num_captures += 1
        self.capture_s += time.perf_counter() - t0

    def _capture_graph(self, gbs: int, mode: SamplingMode) -> None:
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
        self._capture_body((gbs, mode), lambda: self._body(gbs, mode))
