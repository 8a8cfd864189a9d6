"""Runs one scheduled batch: builds the flat token tensors, runs the model, samples.

Owns the model, the KV cache and the attention backend. Decode steps on CUDA replay captured
CUDA graphs (cuda_graph.py) when the batch size has one, and so do the forwards of prefills whose
every request holds KV (prefill_graph.py); everything else runs eagerly.

`launch` never waits for the GPU: decode inputs come from the previous step's tokens on the
device (row_state.py), stop ids are checked there too, and a step's outputs (tokens, stop flags,
logprobs) travel back in one device->host copy that `PendingStep.result()` waits for. The engine
thereby prepares step N+1 while the GPU runs step N. Compression (`after_step`) runs eagerly
between steps, after the engine has read the tokens its trigger looks at.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import replace

import numpy as np
import torch

from ..layers.attention import AttentionMetadata, TorchAttention, TritonAttention
from ..compression import POLICIES, CompressionConfig
from ..compression.compressor import Compressor
from ..compression.query_ring import QueryRing
from ..compression.trigger import Trigger
from ..kvcache import stable_memory
from ..kvcache.kv_cache import KVCache, KVPool
from ..kvcache.kv_quant import FP8_DTYPES, check_device, load_scales
from ..models.causal_lm import CausalLM
from ..models.config import ModelConfig
from .row_state import RowState
from .runner_memory import RunnerMemory
from .cuda_graph import DecodeGraphs, GraphParts
from .prefill_graph import PrefillGraphs
from .sampler import Sampler, SamplingBatch
from .scheduler import Batch
from .sequence import Sequence
from .step_io import (_DTYPES, BatchTensors, HostRing, PendingStep, StepOutput, pack_outputs,
                      extend_layout, host_to_device, prefill_layout, resolve_device, resolve_dtype)
from ..kvcache.host_copy import ints_to_device
from ..server_args import ServerArgs, parse_batch_sizes
from ..weights.loader import iter_safetensors, load_named_tensors

log = logging.getLogger(__name__)


def resolve_backend(name: str, device: torch.device) -> str:
    if name == "auto":
        return "triton" if device.type == "cuda" else "torch"
    if name == "triton" and device.type != "cuda":
        raise ValueError("--attention-backend triton needs a CUDA device")
    return name


def resolve_kv_dtype(name: str, model_dtype: torch.dtype) -> torch.dtype:
    """--kv-cache-dtype -> the dtype a slot holds (auto: the model's)."""
    if name == "auto":
        return model_dtype
    return FP8_DTYPES[name] if name in FP8_DTYPES else _DTYPES[name]


def kv_pool_slots(args: ServerArgs, cfg: ModelConfig, device: torch.device, kv_dtype: torch.dtype) -> int:
    """Slots of the KV pool: what --mem-fraction-static leaves on a GPU (capped by
    --max-total-tokens), or --max-total-tokens on a CPU; +1 for the padding slot 0."""
    per_token = cfg.kv_bytes_per_token_per_elem * torch.empty((), dtype=kv_dtype).element_size()
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        # stable pools' memory is not in torch's allocator stats (stable_memory.py)
        used = torch.cuda.memory_allocated(device) + stable_memory.mapped_bytes(device)
        budget = total * args.mem_fraction_static - used
        slots = int(budget // per_token)
        if args.max_total_tokens:
            slots = min(slots, args.max_total_tokens)
        if slots < 16:
            raise RuntimeError("not enough GPU memory for the KV pool; raise --mem-fraction-static")
    else:
        slots = args.max_total_tokens or 16384
    return slots + 1  # slot 0 is the padding slot


def build_kv_cache(args: ServerArgs, cfg: ModelConfig, device: torch.device, dtype: torch.dtype,
                   backend: str, context_length: int) -> KVCache:
    """The KV pool (sized from what is left, FP8 with its scales where asked) and its cache."""
    kv_dtype = resolve_kv_dtype(args.kv_cache_dtype, dtype)
    check_device(kv_dtype, device, backend)
    scales = load_scales(args.quantization_param_path, cfg.num_layers)
    pool = KVPool(kv_pool_slots(args, cfg, device, kv_dtype), cfg.num_layers, cfg.num_kv_heads,
                  cfg.head_dim, kv_dtype, device, compute_dtype=dtype, k_scale=scales,
                  v_scale=scales, stable_address=args.kv_stable_address and stable_memory.available(device))
    return KVCache(pool, args.max_running_requests, context_length,
                   prefix_cache=not args.disable_radix_cache)


def compression_parts(args: ServerArgs, cfg: ModelConfig, dtype, device, newline_ids,
                      think_end_id) -> tuple[CompressionConfig | None, Trigger | None, QueryRing | None]:
    """The compression config, its trigger, and the query ring when the policy scores with
    queries (None, None, None when compression is off)."""
    compression = CompressionConfig.from_server_args(args)
    if compression is None:
        return None, None, None
    trigger = Trigger(compression, newline_ids, think_end_id)
    ring = None
    if POLICIES[compression.algorithm].needs_queries:
        ring = QueryRing(cfg.num_layers, args.max_running_requests + 1, compression.window,
                         cfg.num_heads, cfg.head_dim, dtype, device)
    return compression, trigger, ring


def prompt_logprobs(model: CausalLM, seq: Sequence, hidden: torch.Tensor, offset: int = 0):
    """Logprob of each prompt token from `logprob_start_len` on (position 0 has none).
    `hidden` starts at position `offset` (the cached prefix is not computed: the scheduler
    caps the match so that the positions needed here are)."""
    prompt = seq.prompt_ids
    start = min(seq.logprob_start_len, len(prompt) - 1)
    first = max(start, 1)
    lps: list = [None] if start == 0 else []
    tops: list | None = ([None] if start == 0 else []) if seq.top_logprobs_num else None
    if first < len(prompt):
        t = seq.params.temperature if seq.params.temperature > 0 else 1.0
        lp = torch.log_softmax(model.logits(hidden[first - 1 - offset:len(prompt) - 1 - offset]) / t,
                               dim=-1)
        target = torch.tensor(prompt[first:], device=lp.device)
        lps += lp.gather(1, target[:, None])[:, 0].tolist()
        if tops is not None:
            v, i = lp.topk(seq.top_logprobs_num, dim=-1)
            tops += [list(zip(a, b)) for a, b in zip(v.tolist(), i.tolist())]
    return lps, tops


class ModelRunner(RunnerMemory):
    """Loading weights and releasing / resuming memory come from ``RunnerMemory``
    (runner_memory.py)."""

    def __init__(self, args: ServerArgs, cfg: ModelConfig, eos_ids: set[int],
                 newline_ids: set[int] | None = None, think_end_id: int | None = None):
        self.args, self.cfg, self.eos_ids = args, cfg, eos_ids
        self.device = resolve_device(args.device)
        self.dtype = resolve_dtype(args.dtype, cfg, args.model_path)
        self.context_length = args.context_length or cfg.max_position_embeddings
        torch.manual_seed(args.random_seed)

        with torch.device(self.device):
            self.model = CausalLM(cfg, self.context_length).to(self.dtype)
        self.model.eval().requires_grad_(False)
        load_named_tensors(self.model, iter_safetensors(args.model_path))

        # Compression state is allocated before the pool, which is sized from what is left.
        self.compression, trigger, ring = compression_parts(args, cfg, self.dtype, self.device,
                                                            newline_ids, think_end_id)
        backend = self.backend_name = resolve_backend(args.attention_backend, self.device)
        self.kv = build_kv_cache(args, cfg, self.device, self.dtype, backend, self.context_length)
        cls = TritonAttention if backend == "triton" else TorchAttention
        self.attn = cls(self.kv, cfg.num_heads, cfg.head_dim)
        self.attn.ring = ring
        pool, kv_dtype = self.kv.pool, self.kv.pool.dtype
        self.compressor = None
        if self.compression is not None:
            self.compressor = Compressor(self.compression, self.kv, ring, trigger)
        self.sampler = Sampler()
        self.rows = RowState(args.max_running_requests + 1, self.device)
        self.host_ring = HostRing() if self.device.type == "cuda" else None
        self._batch_cache: BatchTensors | None = None
        self.prefill_tokens = 0  # tokens computed by prefills (a cached prefix is not)
        self.graphs = self.prefill_graphs = None
        if self.device.type == "cuda" and backend == "triton" and args.cuda_graph:
            sizes = parse_batch_sizes(args.cuda_graph_bs) if args.cuda_graph_bs else None
            self.graphs = DecodeGraphs(self.graph_parts(), args.cuda_graph_max_bs, sizes)
            if args.prefill_graph_max_tokens > 0:
                self.prefill_graphs = PrefillGraphs(self.graph_parts(), args.prefill_graph_max_tokens,
                                                    self.kv.req_to_token.table.shape[0])
        log.info("KV pool: %d slots (%.2f GB, %s), device %s, dtype %s, attention %s",
                 pool.num_slots - 1, pool.bytes / 1e9, kv_dtype, self.device, self.dtype, backend)

    def graph_parts(self) -> GraphParts:
        """What the decode graphs use of this runner (they get these, not the runner)."""
        return GraphParts(self.device, self.cfg.vocab_size, self.kv, self.attn, self.model,
                          self.sampler, self.rows)

    # ------------------------------------------------------------------ forward

    @torch.inference_mode()
    def launch(self, batch: Batch) -> PendingStep:
        """Forward, sample and start the outputs' copy to the host; returns without waiting."""
        bt = self._batch_tensors(batch)
        step = None
        if not batch.is_prefill and self._graphable(batch.seqs, bt):
            step = self._graphed_step(batch, bt)  # None: its capture must wait (CAPTURE_GATE)
        if step is not None:
            for s in batch.seqs:  # one pass: the token the graph fed, the draw it made
                s.num_computed += 1
                s.num_sampled += 1
            return step
        step = self._eager_step(batch, bt)
        for s in batch.seqs:
            s.num_sampled += 1
        return step

    def _graphed_step(self, batch: Batch, bt: BatchTensors) -> PendingStep | None:
        packed = self.graphs.step(batch.seqs, bt)  # forward, sampling and outputs in one replay
        if packed is None:
            return None
        mode = bt.mode
        top_k = mode.top_logprobs_num if mode.need_logprobs else 0
        return PendingStep(batch, packed, mode.need_logprobs, top_k, {}, self.host_ring)

    def _eager_step(self, batch: Batch, bt: BatchTensors) -> PendingStep:
        seqs = batch.seqs
        if batch.is_prefill:
            table = self.rows.stop_ids
            self.rows.admit(bt.rows, [self._stop_ids(s) for s in seqs])
            if self.rows.stop_ids is not table and self.graphs is not None:
                self.graphs.clear()  # captured steps read the old (narrower) stop-id table
            logits, input_lp = self._prefill(seqs)
            steps = torch.tensor([s.num_sampled for s in seqs]).to(self.device, non_blocking=True)
        else:
            if self.graphs is not None:  # the requests' step values move without the graphs
                self.graphs.step_ints_host.forget()
            logits, steps = self._decode(seqs, bt.rows)
            input_lp = {}
        out = self.sampler(logits, self._sampling_batch(bt, steps))
        hits = self.rows.record(bt.rows, out.ids)
        top_k = out.top_values.shape[1] if out.top_values is not None else 0
        return PendingStep(batch, pack_outputs(out, hits), out.logprobs is not None, top_k, input_lp,
                           self.host_ring)

    def _graphable(self, seqs: list[Sequence], bt: BatchTensors) -> bool:
        """Whole decode steps replay as CUDA graphs unless a min_new_tokens ban is active (its
        (row, token) list changes size from step to step) or a request has a logit_bias (its
        pairs are the eager sampler's)."""
        if self.graphs is None or not self.graphs.can_run(len(seqs)) or bt.bias:
            return False
        return all(s.num_sampled >= s.params.min_new_tokens for _, s in bt.min_new)

    def after_step(self, batch: Batch) -> None:
        """Compress the requests whose trigger fired, once their fed tokens are known to the
        host (after the previous step's outputs were read). Finished requests are skipped.
        Without compression nothing, not even inference mode, is entered (every step calls it)."""
        if self.compressor is not None:
            self._compress(batch)

    @torch.inference_mode()
    def _compress(self, batch: Batch) -> None:
        live = [s for s in batch.seqs if not s.finished]
        done = self.compressor.num_compressions
        self.compressor.after_step(live, batch.is_prefill)
        if self.graphs is not None and self.compressor.num_compressions != done:
            self.graphs.step_ints_host.forget()  # compacted rows hold fewer slots

    def run(self, batch: Batch) -> StepOutput:
        """One step, synchronously (launch, compress, wait)."""
        step = self.launch(batch)
        self.after_step(batch)
        return step.result()

    def _stop_ids(self, seq: Sequence) -> list[int]:
        p = seq.params
        return sorted(set(p.stop_token_ids) | (set() if p.ignore_eos else self.eos_ids))

    def _prefill(self, seqs: list[Sequence]):
        """Forward the requests that compute (a cached prefix at the head of a row is read, not
        recomputed); followers (`seq.leader`) then share their leader's slots and its last
        hidden state, so the LM head still runs on one row per request (as without sharing)."""
        computed = [s for s in seqs if s.leader is None]
        at = {id(s): i for i, s in enumerate(computed)}
        logits, input_lp = self._forward_prefill(computed, [at[id(s.leader or s)] for s in seqs])
        if self.kv.prefix is None:
            return logits, input_lp
        for s in computed:
            if not s.adopted_kv:  # a session's held KV is not (always) dense KV of its prompt
                self.kv.cache_prompt(s)
        followers = [s for s in seqs if s.leader is not None]
        for f in followers:
            self.kv.share(f, f.leader)
        if followers and self.attn.ring is not None:
            self.attn.ring.copy_rows([f.row for f in followers], [f.leader.row for f in followers])
        return logits, {seqs.index(computed[i]): lp for i, lp in input_lp.items()}

    def _forward_prefill(self, seqs: list[Sequence], order: list[int]):
        """The prefill forward of `seqs`; logits of their last tokens in the order `order`
        (indices into seqs, one per request of the batch)."""
        dev = self.device
        chunks = [s.pending_ids() for s in seqs]
        counts = [len(c) for c in chunks]
        self.prefill_tokens += sum(counts)
        flat = [t for c in chunks for t in c]
        prefix = [s.num_computed for s in seqs]  # first position computed now
        # Slots already at the head of each row (a cached prefix, or a session's adopted KV,
        # fewer than its positions once compressed): every new token attends to all of them.
        held = [s.kv_len for s in seqs]
        out_slots = self.kv.extend(seqs, counts)
        starts = list(itertools.accumulate(counts, initial=0))[:-1]
        positions, pad_index, pad_rows = prefill_layout(counts, prefix, dev)
        meta = AttentionMetadata(is_prefill=True, out_slots=out_slots, pad_index=pad_index, pad_rows=pad_rows,
                                 extend=extend_layout(counts, held, [s.row for s in seqs], dev))
        if self.attn.ring is not None:
            # The last w tokens of each request fill its query ring.
            w = self.attn.ring.window
            rec = [(st + i, s.row, s.num_computed + i) for s, st, n in zip(seqs, starts, counts)
                   for i in range(max(0, n - w), n)]
            meta.rec_index, meta.rec_rows, meta.rec_pos = host_to_device(
                [np.asarray(rec, dtype=np.int64).T.copy()], dev)[0]
        ids = ints_to_device(flat, dev)
        hidden = self._graphed_prefill(ids, positions, meta)
        if hidden is None:
            self.attn.meta = meta
            hidden = self.model(ids, positions, self.attn)
        last = [st + n - 1 for st, n in zip(starts, counts)]
        logits = self.model.logits(hidden[ints_to_device([last[i] for i in order], dev)], upcast=False)
        input_lp = {}
        for i, s in enumerate(seqs):
            if s.return_logprob and s.logprob_start_len >= 0 and s.input_logprobs is None:
                input_lp[i] = prompt_logprobs(self.model, s, hidden[starts[i]:starts[i] + counts[i]],
                                              prefix[i])
        for s, n in zip(seqs, counts):
            s.num_computed += n
        return logits, input_lp

    def _graphed_prefill(self, ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata):
        """The prefill's hidden states from a captured graph (prefill_graph.py), or None: the
        step is not one (a request without held KV, too many tokens, the paged kernel off or
        not taking this head size) or its capture must wait."""
        g = self.prefill_graphs
        if g is None or not self.attn.paged_extend() or not g.can_run(ids.shape[0], meta.extend):
            return None
        return g.forward(ids, positions, meta)

    def prepare_decode(self, seqs: list[Sequence], rows: torch.Tensor):
        """Device inputs of a decode step: input_ids (the rows' last sampled tokens, already on
        the device), positions, kv_lens (including the new token), the new tokens' slots and the
        draw indices. One host->device copy; nothing waits for the GPU."""
        packed = torch.tensor([[s.num_computed for s in seqs], [s.kv_len for s in seqs],
                               [s.num_sampled for s in seqs]], dtype=torch.int64)
        positions, old_lens, steps = packed.to(self.device, non_blocking=True)
        out_slots = self.kv.extend_one(seqs, rows, old_lens)
        input_ids = self.rows.last_token[rows]
        return input_ids, positions, (old_lens + 1).to(torch.int32), out_slots, steps

    def _decode(self, seqs: list[Sequence], rows: torch.Tensor):
        """(logits in the model dtype, draw indices) of a decode step."""
        input_ids, positions, kv_lens, out_slots, steps = self.prepare_decode(seqs, rows)
        max_kv = max(s.kv_len for s in seqs)
        for s in seqs:
            s.num_computed += 1
        self.attn.meta = AttentionMetadata(False, out_slots, rows=rows, kv_lens=kv_lens, max_kv_len=max_kv,
                                           rec_rows=rows, rec_pos=positions)
        hidden = self.model(input_ids, positions, self.attn)
        return self.model.logits(hidden, upcast=False), steps

    def _batch_tensors(self, batch: Batch) -> BatchTensors:
        """Rows and sampling parameters of the batch, rebuilt only when the batch changed."""
        key = (batch.version, batch.is_prefill, len(batch.seqs))
        bt = self._batch_cache
        if bt is None or bt.key != key or batch.version < 0:
            bt = self._batch_cache = BatchTensors(key, batch.seqs, self.device, self.cfg.vocab_size)
        return bt

    def _sampling_batch(self, bt: BatchTensors, steps: torch.Tensor) -> SamplingBatch:
        """This step's draw indices and min_new_tokens bans on top of the cached parameters."""
        dev, V = self.device, self.cfg.vocab_size
        ban_rows, ban_ids = [], []
        for i, s in bt.min_new:
            if s.num_sampled < s.params.min_new_tokens:
                banned = [t for t in self._stop_ids(s) if 0 <= t < V]
                ban_rows += [i] * len(banned)
                ban_ids += banned
        return replace(bt.sampling, steps=steps,
                       ban_rows=torch.tensor(ban_rows, device=dev) if ban_rows else None,
                       ban_ids=torch.tensor(ban_ids, device=dev) if ban_ids else None)

    # ------------------------------------------------------------------ lifetime

    def shutdown(self) -> None:
        """Drop device memory now rather than at garbage collection (engines may be recreated
        in one process, and the pool is sized from what is allocated)."""
        self.kv.pool.release()
        self.graphs = self.prefill_graphs = None
        self.model = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
