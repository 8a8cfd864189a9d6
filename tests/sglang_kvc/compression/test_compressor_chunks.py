"""Compressor._elems_per_request, which sizes the chunks a compaction scores at once: what a
request's scoring really holds on each path, against hand-computed counts."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sglang_kvc.compression.base import CompressionConfig
from sglang_kvc.compression.compressor import Compressor
from sglang_kvc.compression.trigger import Trigger


@pytest.mark.parametrize("device, scratch", [("cpu", 632 * 632), ("cuda", 0)])
def test_chunk_floats_per_request_hand_computed(device, scratch):
    """R-KV 512 + 128 at the 0.5B shape (24 layers, 2 KV heads of 64, 14 query heads, window 8):
    a request's keys (gathered + fp32), its m x m similarity matrix on the torch path only (the
    Triton pass on CUDA holds none), 8 score rows, and per layer the window's importance logits
    and softmax. On CUDA a round of 256 requests is scored in 8 chunks of <= 35, not 24 of 11."""
    cfg = CompressionConfig("rkv", budget=512, window=8, divide_length=128)
    pool = SimpleNamespace(shape=(24, 1000, 2, 64), device=device)
    ring = SimpleNamespace(buf=SimpleNamespace(shape=(24, 10, 8, 14, 64)))  # [L, rows, w, Hq, D]
    comp = Compressor(cfg, kv=SimpleNamespace(pool=pool), ring=ring, trigger=Trigger(cfg))
    n, m = 640, 632
    want = 24 * (2 * (scratch + 2 * n * 64 + 8 * m) + 2 * 14 * 8 * m)
    assert comp._elems_per_request(n) == want
    if device == "cuda":
        assert comp.chunk_elems // want == 35 and -(-256 // 35) == 8
    streaming = Compressor(CompressionConfig("streamingllm", budget=512, window=8, divide_length=128),
                           kv=SimpleNamespace(pool=pool), ring=None, trigger=Trigger(cfg))
    assert streaming._elems_per_request(n) == 24 * 2 * (2 * n * 64 + 8 * m)  # no queries
