"""CUDA graphs for decode steps: one graph per padded batch size, captured on first use.

A small model's decode step is hundreds of tiny kernels; replaying them as one graph removes the
per-kernel launch cost that otherwise dominates. Inputs are copied into static buffers; padding
rows point at table row 0 / slot 0, which are reserved and never hold a request's KV.
The LM head runs outside the graph so graphs keep only [bs, hidden] outputs alive.
"""

from __future__ import annotations

import torch

from .attention import AttentionMetadata


class DecodeGraphs:
    def __init__(self, runner, max_bs: int):
        self.runner = runner
        self.sizes = [s for s in [1, 2, 4, 8] + list(range(16, max_bs + 1, 16)) if s <= max_bs]
        self.max_bs = self.sizes[-1]
        dev = runner.device
        self.input_ids = torch.zeros(self.max_bs, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(self.max_bs, dtype=torch.int64, device=dev)
        self.rows = torch.zeros(self.max_bs, dtype=torch.int64, device=dev)
        self.kv_lens = torch.ones(self.max_bs, dtype=torch.int32, device=dev)
        self.out_slots = torch.zeros(self.max_bs, dtype=torch.int64, device=dev)
        self.clear()

    def clear(self) -> None:
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.pool = None

    def can_run(self, bs: int) -> bool:
        return bs <= self.max_bs

    def _padded(self, bs: int) -> int:
        return next(s for s in self.sizes if s >= bs)

    def _forward(self, bs: int) -> torch.Tensor:
        r = self.runner
        r.attn.meta = AttentionMetadata(False, self.out_slots[:bs], rows=self.rows[:bs],
                                        kv_lens=self.kv_lens[:bs], max_kv_len=0,
                                        rec_rows=self.rows[:bs], rec_pos=self.positions[:bs])
        return r.model(self.input_ids[:bs], self.positions[:bs], r.attn)

    def _capture(self, bs: int) -> None:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            self._forward(bs)  # warm up: Triton compiles and autotunes outside capture
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = self._forward(bs)
        self.pool = graph.pool()
        self.graphs[bs] = (graph, out)

    def replay(self, input_ids, positions, rows, kv_lens, out_slots) -> torch.Tensor:
        bs = input_ids.shape[0]
        gbs = self._padded(bs)
        if gbs not in self.graphs:
            self._reset_padding(0, gbs)
            self._capture(gbs)
        self._reset_padding(bs, gbs)
        self.input_ids[:bs].copy_(input_ids)
        self.positions[:bs].copy_(positions)
        self.rows[:bs].copy_(rows)
        self.kv_lens[:bs].copy_(kv_lens)
        self.out_slots[:bs].copy_(out_slots)
        graph, out = self.graphs[gbs]
        graph.replay()
        return self.runner.model.logits(out[:bs], upcast=False)

    def _reset_padding(self, start: int, gbs: int) -> None:
        """Point entries [start, gbs) at the padding row and slot (a larger batch may have left
        real rows there)."""
        if start == gbs:
            return
        for buf, value in ((self.input_ids, 0), (self.positions, 0), (self.rows, 0),
                           (self.kv_lens, 1), (self.out_slots, 0)):
            buf[start:gbs].fill_(value)
