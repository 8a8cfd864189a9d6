"""CUDA graphs of whole prefills whose every request holds KV, one per padded token count.

Why: a multi-turn rollout's continuation prefills (a few hundred sessions' next turns, each some
tokens after its held KV) were host-bound on an H200: ~1,000 kernel launches and 50-90 ms of
host a step for ~3 ms of GPU work (docs/benchmarks.md, issue 66), paid several times a rollout
while decode waited. Such a prefill attends through one paged Triton kernel driven by two small
tensors (layers/triton_extend.py: a request block and a work list), so its forward depends on the
step only through the token count and the work list's length. Padded to a size of
`prefill_graph_sizes` (tokens: id 0 at position 0 into slot 0, the reserved padding slot; work
items past every request's tokens, which do nothing), one graph per size replays any such step.

Captured: the model's forward (embedding, every layer, the final norm) into a static hidden
buffer, and for R-KV and SnapKV the query ring's records of each request's last queries (padding
records go to ring row 0, the padding row). Eager around it: the runner's layouts and slot
allocation as before, ~10 device copies and fills into the static buffers, the LM head over the
last tokens, sampling, compression.

Not graphed (the eager path, unchanged): a prefill with a request that holds no KV (its causal
pass over the new tokens runs flash attention), longer than the largest size, or with the paged
kernel off (SGLANG_KVC_PAGED_EXTEND=0) or unsupported. A capture that runs out of memory turns
the graphs off for the engine's life (`off` in the stats says why); the step runs eagerly.
The graphs follow the KV pool's address and are dropped with the decode graphs (runner_memory.py).
"""

from __future__ import annotations

import logging
import time

import torch

from ..layers.attention import EXTEND_BLOCK_M, AttentionMetadata, ExtendLayout
from .cuda_graph import GraphParts, PoolGraphs, padded_size

# A padding work item's first new token: past any request's, so its program computes nothing.
PAST_EVERY_REQUEST = 1 << 30

log = logging.getLogger(__name__)


def prefill_graph_sizes(max_tokens: int) -> list[int]:
    """Token counts with a graph: 64, 96, 128, 192, 256, ... (each step pads at most 50%), up
    to max_tokens, which is always one."""
    sizes, size = [], 64
    while size < max_tokens:
        sizes.append(size)
        size = size * 3 // 2 if size & (size - 1) == 0 else size * 4 // 3
    return sizes + [max_tokens]


class PrefillGraphs(PoolGraphs):
    def __init__(self, parts: GraphParts, max_tokens: int, max_requests: int):
        self.parts = parts
        self.sizes = prefill_graph_sizes(max_tokens)
        self.max_requests = max_requests
        dev, n = parts.device, self.sizes[-1]
        self.tokens = torch.zeros(3, n, dtype=torch.int64, device=dev)  # ids, positions, slots
        self.requests = torch.zeros(4, max_requests, dtype=torch.int32, device=dev)
        self.work = torch.zeros(2, self.work_len(n), dtype=torch.int32, device=dev)
        # query-ring records (compression): flat token index, table row, position; at most one a token
        self.records = torch.zeros(3, n, dtype=torch.int64, device=dev) if parts.attn.ring is not None else None
        self.num_captures, self.capture_s, self.deferred, self.replays = 0, 0.0, 0, 0
        self.off: str | None = None  # why prefills no longer replay (a capture ran out of memory)
        self.clear()  # graphs: padded token count -> (graph, hidden [size, hidden])

    def work_len(self, size: int) -> int:
        """A graph's work items: a request's n tokens make ceil(n / BLOCK_M) <= n / BLOCK_M + 1
        of them, so size / BLOCK_M + (requests, at most one a token) always do."""
        return -(-size // EXTEND_BLOCK_M) + min(size, self.max_requests)

    def can_run(self, num_tokens: int, extend: ExtendLayout | None) -> bool:
        return (self.off is None and extend is not None and extend.every and extend.work is not None
                and num_tokens <= self.sizes[-1] and extend.requests.shape[1] <= self.max_requests)

    def stats(self) -> dict:
        return {"graphs": len(self.graphs), "captures": self.num_captures, "capture_s": self.capture_s,
                "deferred": self.deferred, "replays": self.replays, "off": self.off}

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor | None:
        """The final hidden states [T, hidden] of the prefill (`can_run` held), from a replay;
        the view stays valid until the next replay, which the stream orders after every use
        enqueued before it. None, with nothing done, when a capture must wait (CAPTURE_GATE)."""
        size = padded_size(self.sizes, ids.shape[0])
        try:
            ready = self._ready(size, lambda: self._load(ids, positions, meta, size),
                                lambda: self._capture(size))
        except torch.OutOfMemoryError as e:
            # The graph pool keeps its activations for good (an eager step gives them back):
            # beside a pool sized to the card a large size may not fit. Eager from now on.
            self.off = f"the capture of {size} tokens ran out of memory: {e}".splitlines()[0]
            log.warning("prefill graphs off: %s", self.off)
            return None
        if not ready:
            return None
        graph, hidden = self.graphs[size]
        graph.replay()
        self.replays += 1
        return hidden[:ids.shape[0]]

    def _load(self, ids, positions, meta: AttentionMetadata, size: int) -> None:
        """The step's tokens and layout into the static buffers. Padding tokens write slot 0
        (stale ids and positions are valid ones); padding work items compute nothing."""
        n, e = ids.shape[0], meta.extend
        for row, src in enumerate((ids, positions, meta.out_slots)):
            self.tokens[row, :n].copy_(src)
        self.tokens[2, n:size].zero_()
        self.requests[:, :e.requests.shape[1]].copy_(e.requests)
        w, end = e.work.shape[1], self.work_len(size)
        self.work[:, :w].copy_(e.work)
        self.work[0, w:end].zero_()
        self.work[1, w:end].fill_(PAST_EVERY_REQUEST)
        if self.records is not None:  # padding records: token 0 into ring row 0, position 0
            r = meta.rec_rows.shape[0]
            for row, src in enumerate((meta.rec_index, meta.rec_rows, meta.rec_pos)):
                self.records[row, :r].copy_(src)
            self.records[:, r:size].zero_()

    def _body(self, size: int) -> torch.Tensor:
        p = self.parts
        ids, positions, slots = self.tokens[:, :size]
        extend = ExtendLayout(every=True, requests=self.requests, work=self.work[:, :self.work_len(size)])
        meta = p.attn.meta = AttentionMetadata(True, slots, extend=extend)
        if self.records is not None:
            meta.rec_index, meta.rec_rows, meta.rec_pos = self.records[:, :size]
        return p.model(ids, positions, p.attn)

    def _capture(self, size: int) -> None:
        # The warm-up computes this step for real (Triton compiles outside capture); the replay
        # after the capture writes the same K/V into the same slots again.
        t0 = time.perf_counter()
        stream = self._stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            self._body(size)
        torch.cuda.current_stream().wait_stream(stream)
        self._capture_body(size, lambda: self._body(size))
        self.num_captures += 1
        self.capture_s += time.perf_counter() - t0
